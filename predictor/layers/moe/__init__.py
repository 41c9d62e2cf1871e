"""The MoE block of a decoder layer as Megatron-core's `transformer/moe/` runs it (`ops`): the tokens a dispatcher
puts on the wire (`dispatch`), TEGroupedMLP's extra passes (`grouped_mlp`), the layer's host calls (`host_calls`)
and where it makes the host wait for the device (`host_syncs`)."""
