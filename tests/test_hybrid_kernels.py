"""Kernel names of the hybrid models' mixers, as the libraries that run them name them, classified into the primitives
the predictor prices them as (extractors.kineto.classify): a trace of a Mamba2 or Gated DeltaNet run becomes samples
of `ssd_*`, `causal_conv1d` and `gdn_chunk_rule`, not `other` or a GEMM. The names are the kernels' own, read in their
sources: mamba_ssm's Triton kernels (`mamba_ssm/ops/triton/ssd_chunk_state.py`, `ssd_state_passing.py`, `ssd_bmm.py`,
`ssd_chunk_scan.py`, `ssd_combined.py`, `layernorm_gated.py`: a Triton kernel is named as its jitted function),
causal-conv1d's CUDA kernels (`csrc/causal_conv1d_fwd.cu`, `causal_conv1d_bwd.cu`, as Kineto prints a template
kernel), flash-linear-attention's (`fla/ops/gated_delta_rule/chunk.py`, `wy_fast.py`, `fla/ops/common/chunk_delta_h.py`,
`chunk_o.py`, `chunk_scaled_dot_kkt.py`, `fla/ops/utils/solve_tril.py`, `cumsum.py`, `fla/modules/l2norm.py`) and
Megatron's Triton copies (`megatron/core/ssm/ops/`)."""
from __future__ import annotations

import pytest

from extractors.kineto.classify import classify, kernel_primitive
from predictor.layers.kernel_work import PRIMITIVES
from tracekit.core.samples import COMPUTE_PRIMITIVES, HYBRID_PRIMITIVES

KERNELS = {
    "ssd_chunk_cumsum": ["_chunk_cumsum_fwd_kernel", "_chunk_cumsum_bwd_kernel"],
    "ssd_chunk_state": ["_chunk_state_fwd_kernel", "_chunk_state_bwd_dx_kernel", "_chunk_state_bwd_db_kernel",
                        "_chunk_state_bwd_ddAcs_stable_kernel", "_chunk_state_varlen_kernel"],
    "ssd_state_passing": ["_state_passing_fwd_kernel", "_state_passing_bwd_kernel"],
    "ssd_bmm_chunk": ["_bmm_chunk_fwd_kernel", "_bmm_chunk_bwd_kernel"],
    "ssd_chunk_scan": ["_chunk_scan_fwd_kernel", "_chunk_scan_bwd_dz_kernel", "_chunk_scan_bwd_dstates_kernel",
                       "_chunk_scan_bwd_dc_kernel", "_chunk_scan_bwd_dx_kernel", "_chunk_scan_bwd_dcb_kernel",
                       "_chunk_scan_bwd_ddAcs_stable_kernel", "_chunk_scan_bwd_ddAcs_prev_kernel",
                       "_chunk_scan_chunk_state_bwd_dx_kernel"],
    "causal_conv1d": [
        "void causal_conv1d_fwd_kernel<Causal_conv1d_fwd_kernel_traits<128, 4, true, true, c10::BFloat16, "
        "c10::BFloat16> >(ConvParamsBase)",
        "void causal_conv1d_bwd_kernel<Causal_conv1d_bwd_kernel_traits<128, 4, true, true, true, c10::BFloat16, "
        "c10::BFloat16> >(ConvParamsBwd)",
        "void causal_conv1d_channellast_fwd_kernel<Causal_conv1d_channellast_fwd_kernel_traits<128, 4, 64, true, "
        "c10::BFloat16, c10::BFloat16> >(ConvParamsBase)",
        "_causal_conv1d_varlen_kernel", "causal_conv1d_fwd_kernel"],
    "gdn_chunk_rule": ["chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
                       "chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64", "chunk_fwd_kernel_o",
                       "chunk_bwd_kernel_dqkwg", "chunk_bwd_kernel_dv_local",
                       "recompute_w_u_fwd_kernel", "prepare_wy_repr_bwd_kernel", "chunk_scaled_dot_kkt_fwd_kernel",
                       "solve_tril_16x16_kernel", "merge_16x16_to_64x64_inverse_kernel"],
    "elementwise": ["l2norm_fwd_kernel", "l2norm_bwd_kernel", "chunk_local_cumsum_scalar_kernel"],
    "norm": ["_layer_norm_fwd_1pass_kernel", "_layer_norm_bwd_kernel"],  # the gated RMSNorm after the scan
}


@pytest.mark.parametrize("primitive", KERNELS)
def test_the_mixers_kernels_are_the_primitives_the_predictor_prices(primitive):
    for kernel in KERNELS[primitive]:
        assert kernel_primitive(kernel) == primitive, kernel
        # launched from the mixers' autograd functions, whose names say nothing the op rules know
        assert classify("kernel", kernel, "MambaSplitConv1dScanCombinedFn", False) == primitive, kernel


def test_every_new_primitive_is_a_sample_primitive_the_roofline_can_size():
    assert set(PRIMITIVES) == set(HYBRID_PRIMITIVES) <= set(COMPUTE_PRIMITIVES)
    classified = {kernel_primitive(k) for kernels in KERNELS.values() for k in kernels}
    assert {"causal_conv1d", "gdn_chunk_rule", "ssd_chunk_cumsum", "ssd_chunk_state", "ssd_state_passing",
            "ssd_bmm_chunk", "ssd_chunk_scan"} <= classified


def test_a_transformers_kernels_keep_their_primitives():
    assert kernel_primitive("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>"
                            "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)") == "gemm"
    assert kernel_primitive("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
                            "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, "
                            "true, false, false, false, true, true, false>(Flash_fwd_params)") == "attention"
    assert kernel_primitive("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
                            "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)"
                            ) == "softmax"
