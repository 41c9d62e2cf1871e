"""The model's ends (`ops`: embedding, final norm, output layer, loss, MTP's ends) and the bytes Megatron-core's
native vocab-parallel cross entropy moves (`cross_entropy`)."""
