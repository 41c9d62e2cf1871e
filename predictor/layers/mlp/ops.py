"""The MLP half of a dense decoder layer as Megatron-core runs it, as a list of `Pair`s (predictor.ir.ops): norm →
[SP all-gather] → FC1 (×2 wide with SwiGLU) → GeLU/SwiGLU → FC2 → all-reduce (reduce-scatter with SP) →
bias-dropout-add. `dense_mlp` is also the shared experts of an MoE layer (predictor.layers.moe.ops), without its norm
and residual."""
from __future__ import annotations

from predictor.ir.ops import OpBuilder, Pair
from predictor.layers.local_kernels import mlp_activation
from predictor.layers.mlp.bias_dropout_add import bias_add
from predictor.layers.norm_rope import norm


def dense_mlp(b: OpBuilder, ffn: int, lowp: bool, prefix: str = "mlp", module: str = "mlp") -> list[Pair]:
    """FC1 → activation → FC2 of width `ffn` split over TP, with its TP collectives."""
    c, t, h, rows = b.c, b.t, b.h, b.tokens
    f_t = ffn // t
    pairs: list[Pair] = list(b.tp_in(f"{prefix}.linear_fc1", module))
    fc1_out = 2 * f_t if c.swiglu else f_t
    pairs.extend(b.linear(f"{prefix}.linear_fc1", "linear3", rows, fc1_out, h, module, lowp))
    pairs.extend(mlp_activation(b, f"{prefix}.activation", rows, f_t, module))  # fused or not (local_kernels)
    pairs.extend(b.linear(f"{prefix}.linear_fc2", "linear4", rows, h, f_t, module, lowp))
    pairs.extend(b.tp_out(f"{prefix}.linear_fc2", module))
    return pairs


def mlp_block(b: OpBuilder, lowp: bool) -> list[Pair]:
    """The MLP half of a dense layer: pre-MLP norm, the MLP, bias-dropout-add."""
    fwd, bwd = norm(b, "pre_mlp_layernorm")
    pairs: list[Pair] = [(fwd, bwd, "layernorm")]
    pairs.extend(dense_mlp(b, b.c.ffn_hidden_size, lowp))
    pairs.extend(bias_add(b, "mlp", "mlp"))  # unfused bias-dropout-add (predictor.layers.mlp.bias_dropout_add)
    fwd, bwd = b.residual("mlp.bias_dropout_add")
    pairs.append((fwd, bwd, "mlp"))
    return pairs
