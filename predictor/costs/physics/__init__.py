"""Costs from physics where no model answers, and bounds on what models answer: roofline (`roofline`), transfer to
GPUs without models (`transfer`), collectives over a cluster's links (`collectives`), GEMMs in dtypes without a model
(`lowp_gemm`), kernels unaligned shapes force (`kernel_paths`), bandwidth floors (`hbm_floor`,
`cross_entropy_floor`), and what a part's GEMMs sustain through a training run (`sustained_gemm`)."""
