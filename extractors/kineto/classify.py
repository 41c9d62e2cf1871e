"""Kernel → primitive: the launching op's name first, the kernel name second; `other` when neither says.

Families (the `category` column): `memory` (memcpy/memset), `communication` (collectives: NCCL/RCCL kernels,
DeepEP dispatch/combine, multimem/custom all-reduce, gloo on CPU runs), `computation` (everything else).
"""
from __future__ import annotations

import re
from functools import lru_cache

from .shapes import FSDP_COPY_OPS

_OP_RULES = (  # (regex on the op name without namespace, primitive); first match wins
    (re.compile(r"reshape_and_cache|copy_blocks|swap_blocks"), "elementwise"),  # paged KV-cache copies
    # FSDP2's copies into and out of its collectives' buffers, and the aten ops they call (whose names say nothing of
    # a collective)
    (re.compile("^(" + "|".join(sorted(FSDP_COPY_OPS)) + ")$"), "elementwise"),
    (re.compile(r"^(bmm|baddbmm|addbmm)$"), "bmm"),
    (re.compile(r"^(mm|addmm|_addmm_activation|matmul|linear|addmv|mv|_scaled_mm|_int_mm|dot)$"), "gemm"),
    (re.compile(r"attention|^_flash_attn|flash_attn|^_efficient_attention|fmha|FlashAttn|FusedAttn", re.I),
     "attention"),
    (re.compile(r"log_softmax|cross_entropy|nll_loss"), "cross_entropy"),
    (re.compile(r"softmax"), "softmax"),
    (re.compile(r"layer_norm|rms_norm|group_norm|batch_norm|instance_norm|layernorm|rmsnorm|LayerNorm|RMSNorm"),
     "norm"),
    (re.compile(r"^(gelu|silu|relu|relu_|swiglu|sigmoid|tanh|hardtanh|leaky_relu|glu|mish|elu|threshold|"
                r"hardswish|softplus|fast_gelu|bias_gelu)(_backward)?_?$"), "activation"),
    (re.compile(r"^(embedding|_embedding_bag|embedding_bag|embedding_dense_backward|embedding_backward|"
                r"_embedding_bag_backward)"), "embedding"),
    (re.compile(r"^_fused_(adam|adamw|sgd)|^_foreach_|^_fused_adam|multi_tensor"), "optimizer"),
    (re.compile(r"^(convolution|_convolution|conv\d?d|cudnn_convolution|miopen_convolution|"
                r"convolution_backward|max_pool|avg_pool|adaptive_avg_pool|upsample)"), "other"),
)

#: The kernels of hybrid models' mixers, by their names in mamba_ssm (`mamba_ssm/ops/triton/ssd_*.py`: Triton kernels,
#: named as their jitted functions), causal-conv1d (`csrc/causal_conv1d_*.cu`), flash-linear-attention
#: (`fla/ops/gated_delta_rule/`, `fla/ops/common/`, `fla/ops/utils/`) and Megatron's own Triton copies
#: (`megatron/core/ssm/ops/`); matched before the generic rules (`chunk_fwd_kernel_o` says nothing of a GEMM).
_HYBRID_KERNEL_RULES = (
    (re.compile(r"causal_conv1d"), "causal_conv1d"),
    (re.compile(r"(^|[^a-z])_?chunk_cumsum_(fwd|bwd)_kernel"), "ssd_chunk_cumsum"),
    (re.compile(r"(^|[^a-z])_?chunk_scan_"), "ssd_chunk_scan"),  # _chunk_scan_chunk_state_bwd_dx_kernel too
    (re.compile(r"(^|[^a-z])_?chunk_state_(fwd|bwd|varlen)"), "ssd_chunk_state"),
    (re.compile(r"(^|[^a-z])_?state_passing_(fwd|bwd)_kernel"), "ssd_state_passing"),
    (re.compile(r"(^|[^a-z])_?bmm_chunk_(fwd|bwd)_kernel"), "ssd_bmm_chunk"),
    (re.compile(r"chunk_gated_delta_(rule|product)_(fwd|bwd)_kernel|(^|[^a-z])chunk_(fwd|bwd)_kernel_(o|dqkwg|dv)|"
                r"recompute_w_u_fwd_kernel|prepare_wy_repr_bwd_kernel|chunk_scaled_dot_kkt_fwd_kernel|"
                r"solve_tril_|merge_16x16_to_(32x32|64x64)_inverse_kernel"), "gdn_chunk_rule"),
    (re.compile(r"l2norm_(fwd|bwd)_kernel|chunk_local_cumsum_(scalar|vector)_kernel"), "elementwise"),
)

_KERNEL_RULES = (
    *_HYBRID_KERNEL_RULES,
    (re.compile(r"log_softmax|cross_entropy|nll_loss", re.I), "cross_entropy"),
    (re.compile(r"flash|fmha|attn|attention", re.I), "attention"),
    (re.compile(r"softmax", re.I), "softmax"),
    (re.compile(r"gemm|gemv|cublas|nvjet|^Cijk_|xmma|cutlass.*tensorop|_mma_|wgmma|matmul|^bmm_", re.I), "gemm"),
    (re.compile(r"layer_?norm|rms_?norm|batch_?norm|bn_fw|bn_bw|group_?norm|welford", re.I), "norm"),
    (re.compile(r"gelu|silu|swiglu|relu|sigmoid|tanh_|act_and_mul", re.I), "activation"),
    (re.compile(r"embedding|indexSelect|index_select", re.I), "embedding"),
    (re.compile(r"adam|multi_tensor_apply|lamb_|sgd_", re.I), "optimizer"),
    (re.compile(r"elementwise|vectorized|unrolled|reduce_kernel|fill|copy|CatArray|cat_|index|dropout|scatter|"
                r"gather|where|rope|rotary|transpose|permute|reduce|quant", re.I), "elementwise"),
)

_NCCL_KERNEL = re.compile(r"nccl|rccl", re.I)
_OTHER_COMM_KERNEL = re.compile(
    r"dpsk::ep::(internode|intranode)::|deep_ep::(internode|intranode)::|multimem_all_reduce|cross_device_reduce|"
    r"custom_all_reduce|one_shot_all_reduce|two_shot_all_reduce", re.I)
_COMM_KINDS = (  # (regex on a collective name, op name or kernel name, primitive)
    (re.compile(r"reduce_?scatter", re.I), "reduce_scatter"),
    (re.compile(r"all_?gather", re.I), "all_gather"),
    (re.compile(r"all_?reduce", re.I), "all_reduce"),
    (re.compile(r"all_?to_?all|dispatch|combine", re.I), "all_to_all"),
    (re.compile(r"broadcast", re.I), "broadcast"),
    (re.compile(r"send|recv", re.I), "send_recv"),
)


def collective_kind(*names: str | None) -> str | None:
    """The collective primitive named by the first of `names` (collective name, annotation, kernel) that names one."""
    for name in names:
        if not name:
            continue
        for pattern, kind in _COMM_KINDS:
            if pattern.search(name):
                return kind
    return None


@lru_cache(maxsize=65536)
def is_comm_kernel(kernel: str) -> bool:
    """Communication kernels: NCCL/RCCL, DeepEP dispatch/combine, multimem and custom all-reduce kernels."""
    return bool(_NCCL_KERNEL.search(kernel) or _OTHER_COMM_KERNEL.search(kernel))


@lru_cache(maxsize=65536)
def op_primitive(op: str | None) -> str | None:
    """Primitive named by an operator (None when the op name does not say)."""
    if not op:
        return None
    base = op.split("::", 1)[-1] if "::" in op else op
    for pattern, primitive in _OP_RULES:
        if pattern.search(base):
            return primitive
    return None


def kernel_signature_head(kernel: str) -> str:
    """The kernel's name and template arguments, without `void ` and its parameter list (parameter types such as
    `flashinfer::...Layout` say nothing about what the kernel computes)."""
    text = kernel[5:] if kernel.startswith("void ") else kernel
    depth = 0
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0 and text[i - 1] not in " <,:":
            return text[:i]
    return text


@lru_cache(maxsize=65536)
def kernel_primitive(kernel: str) -> str:
    head = kernel_signature_head(kernel)
    for pattern, primitive in _KERNEL_RULES:
        if pattern.search(head):
            return primitive
    return "other"


@lru_cache(maxsize=65536)
def classify(kind: str, kernel: str, op: str | None, in_optimizer: bool) -> str:
    """Primitive of one compute/memory device event (collectives are handled in collectives.py); cached per
    distinct combination, as a trace repeats the same kernels every iteration."""
    if kind in ("memcpy", "memset"):
        return kind
    primitive = op_primitive(op)
    if primitive is None:
        primitive = kernel_primitive(kernel)
        if primitive == "other" and op and is_pointwise_op(op):
            primitive = "elementwise"
    if in_optimizer and primitive not in ("gemm", "bmm"):
        return "optimizer"
    return primitive


_POINTWISE = re.compile(r"^aten::(add|sub|mul|div|copy_|to|_to_copy|clone|contiguous|fill_|zero_|zeros|ones|cat|"
                        r"where|masked_fill|pow|rsqrt|sqrt|exp|neg|cos|sin|sum|mean|max|min|argmax|dropout|"
                        r"native_dropout|index|scatter|gather|clamp|abs|lt|gt|eq|ne|le|ge|bitwise|cumsum|sort|topk|"
                        r"arange|full|stack|reshape)(_|$)")


def is_pointwise_op(op: str) -> bool:
    """aten ops that run elementwise / reduction / copy kernels (memory-bound, no shape-specific algorithm). Views
    (view, t, transpose, permute, expand, slice, ...) and allocations move no data: on a CPU trace their time is
    framework overhead, not an elementwise operator (on a GPU they launch no kernel)."""
    return bool(_POINTWISE.match(op))
