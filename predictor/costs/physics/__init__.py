"""Costs from physics where no model answers, and bounds on what models answer: roofline (`roofline`), transfer to
GPUs without models (`transfer`), collectives over a cluster's links (`collectives`), GEMMs in dtypes without a model
(`lowp_gemm`), kernels unaligned shapes force (`kernel_paths`), and bandwidth floors (`hbm_floor`,
`cross_entropy_floor`)."""
