"""State-space and linear-attention mixers of Megatron-core's hybrid models (`megatron/core/ssm/`): `mamba` (the
`M` symbol), `gated_delta_net` (`G`) and `scan_work`, the FLOPs and bytes of their chunked-scan and convolution
kernels."""
