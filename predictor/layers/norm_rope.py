"""RMSNorm and rotary position embeddings as the kernels a stack runs them with (fused or not).

The operator samples' RMSNorm and RoPE (the seed paper's, `operator-samples/estimate-train-time/`) time GPT-NeoX's
Python modules: RMSNorm as `x.norm()`, a scale, a divide and a multiply (several kernels each way, 3–15× the time of
the fused LayerNorm kernel of the same shape on A100 and GH200 alike), RoPE as the cos/sin tables plus
`q·cos + rotate_half(q)·sin` and the same for k (a chain of element-wise kernels). That is what those kernels cost
where a stack runs them that way (GPT-NeoX; Megatron-core's own unfused RoPE, `apply_rope_fusion` False, is the same
chain: `_apply_rotary_pos_emb_bshd`), and the rows keep those models (variants `RMSlayernorm`, `RoPE`).

Megatron-core with Transformer Engine runs each as one memory-bound kernel (`fused_rmsnorm`, `apply_rope_fusion` of
the configuration; the megatron-core and megatron-bridge stack profiles say which):

- **RMSNorm** (TE's `rmsnorm_fwd`/`rmsnorm_bwd`, alone or inside `LayerNormLinear`): one row reduction reading the
  [rows, width] input and writing the output (backward: reads the gradient and the input, writes the input gradient
  and the weight-gradient partials). The fused LayerNorm kernel does the same plus a mean and a bias, so it moves at
  least RMSNorm's bytes: the row is answered by the LayerNorm kernel's model of the same shape (variant
  `rmsnorm_fused`, routed to the `layernorm` group by `predictor.costs.learned.model_keys.ALIASES`): measured where
  LayerNorm was sampled, through the transfer path (bytes at the target's bandwidth) on the other GPUs — an upper bound
  tight within the bias vector.
- **RoPE** (TE's `fused_apply_rotary_pos_emb`, one kernel for q and one for k, each way): reads the tensor (and the
  [seq, 1, 1, dim] frequency table, negligible) and writes it rotated: 2 · numel elements moved per kernel. It is
  answered by the element-wise `res_add` kernel's model (which moves 3 elements per `numel`: two reads, a write) at
  the `numel` that moves the same bytes, 2/3 of the tensor's (variant `rope_fused`, routed to `res_add`).

No constant is fitted: what answers the rows is the models of kernels measured elsewhere, at the bytes these move.
"""
from __future__ import annotations

from predictor.ir.ops import Backward, OpBuilder, OpUse, Pair
from tracekit.core.config import TrainingConfig
from tracekit.core.layer_impl import kernels

FUSED_RMSNORM = "rmsnorm_fused"
#: The local implementation's norms by `Kernels.norm`: (LayerNorm's variant, RMSNorm's).
LOCAL_NORMS = {"apex_persist": ("layernorm_apex_persist", "rmsnorm_torch"),
               "apex": ("layernorm_apex", "rmsnorm_torch"), "torch": ("layernorm_torch", "rmsnorm_torch")}
FUSED_ROPE = "rope_fused"
#: A res_add row of `numel` N moves 3 N elements (two inputs, one output); a fused RoPE kernel over n elements 2 n.
RES_ADD_ELEMENTS = 3.0
ROPE_ELEMENTS = 2.0


def norm_variant(c: TrainingConfig) -> str:
    """The norm kernel the configuration runs: LayerNorm's, TE's fused RMSNorm, or GPT-NeoX's unfused RMSNorm; in
    Megatron-core's local implementation apex's (persistent) LayerNorm or torch's LayerNorm / RMSNorm
    (tracekit.core.layer_impl), each one fused kernel each way: the LayerNorm kernel's model answers them at their
    shape (`predictor.costs.learned.model_keys.ALIASES`; torch's RMSNorm has a fused CUDA kernel from PyTorch 2.8)."""
    k = kernels(c)
    if k.local:
        return LOCAL_NORMS[k.norm][c.normalization == "RMSNorm"]
    if c.normalization != "RMSNorm":
        return "layernorm"
    return FUSED_RMSNORM if c.fused_rmsnorm else "RMSlayernorm"


def norm(b: OpBuilder, name: str, per_layer: bool = True, rows: float | None = None, width: float | None = None
         ) -> tuple[OpUse, Backward]:
    """A norm over `rows` × `width` (default: the layer's [tokens, h] activations) as the configuration's kernel
    (`norm_variant`)."""
    variant = norm_variant(b.c)
    rows = b.sp_tokens if rows is None else rows
    width = b.h if width is None else width
    return b.compute(name, "norm", variant, 0.0, per_layer, rows=rows, width=width, numel=rows * width)


def rope_ops(b: OpBuilder, rows: float, q_heads: float, k_heads: float, rope_dim: float) -> list[Pair]:
    """The rotary embedding of one attention layer over `rows` tokens: `q_heads` query and `k_heads` key head slices
    of `rope_dim` rotated dims. Unfused: the samples' RoPE chain, timed on a q and a k of as many heads each, at the
    mean of the query and key heads (with GQA or MLA's shared rope key, k has fewer: the chain's element-wise kernels
    move q's and k's elements); fused: one kernel for q and one for k (module docstring)."""
    if not b.c.apply_rope_fusion:
        heads = (q_heads + k_heads) / 2.0
        fwd, bwd = b.compute("self_attention.rotary", "elementwise", "RoPE", 0.0, True, rows=rows * heads,
                             width=rope_dim, heads=heads, head_dim=rope_dim, numel=rows * heads * rope_dim)
        return [(fwd, bwd, "attention")]
    pairs: list[Pair] = []
    for name, heads in (("rotary_q", q_heads), ("rotary_k", k_heads)):
        same_bytes = rows * heads * rope_dim * ROPE_ELEMENTS / RES_ADD_ELEMENTS
        fwd, bwd = b.elementwise(f"self_attention.{name}", FUSED_ROPE, same_bytes, rope_dim)
        pairs.append((fwd, bwd, "attention"))
    return pairs
