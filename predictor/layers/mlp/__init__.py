"""The dense MLP block (`ops`), its activation as the bytes the kernel moves (`activation`) and the unfused
bias-dropout-add's bias add (`bias_dropout_add`)."""
