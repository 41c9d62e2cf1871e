"""Layer kinds, each answering the same questions as pure functions of its settings and shapes: its operators (as
`predictor.ops` Pairs), its parameters, its FLOPs per token and the activation bytes it keeps for the backward.
`ssm/`: the recurrent mixers (Mamba2, Gated DeltaNet); `dsa`: DeepSeek sparse attention; `mla`: multi-latent
attention as a hybrid pattern's `+`; `kernel_work`: the work of the kernels these add, for the roofline."""
