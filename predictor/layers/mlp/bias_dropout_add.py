"""The bias add of Megatron-core's unfused bias-dropout-add, as a `Pair` (predictor.ir.ops) beside the residual add.

A row-parallel linear layer (the attention's `linear_proj`, a dense MLP's `linear_fc2`) skips its bias and returns it
to the layer, which adds it with the dropout and the residual (`megatron/core/fusions/fused_bias_dropout.py`). With
`bias_dropout_fusion` (Megatron's default) that is one fused kernel, the `res_add` row every layer has. Without it
(`--no-bias-dropout-fusion`; Megatron-Bridge's GPT-OSS provider sets `bias_dropout_fusion=False`)
`_bias_dropout_add_func` runs `x + bias` as a kernel of its own before the residual add: it reads the [tokens,
hidden] output and writes the sum (a forward `elementwise` row moves 2 elements per `numel`: predictor.costs.features).
The dropout adds no kernel at probability 0 (`torch.nn.functional.dropout` returns its input), and the backward is the
same as the fused kernel's: the addition passes its gradient through, and the bias gradient is the sum over the
tokens either way. An MoE layer returns no bias (its experts add theirs: predictor.layers.moe.grouped_mlp), so only the
attention's and a dense MLP's bias-dropout-add have the extra kernel.
"""
from __future__ import annotations

from predictor.ir.ops import OpBuilder, Pair


def fused(extra: dict) -> bool:
    """Whether the configuration fuses the bias, dropout and residual add (Megatron's default)."""
    return bool(extra.get("bias_dropout_fusion", True))


def bias_add(b: OpBuilder, prefix: str, module: str) -> list[Pair]:
    """The unfused bias add before `prefix`'s residual add; none with the fusion or without linear biases."""
    if not b.c.add_bias_linear or fused(b.c.extra):
        return []
    rows = b.sp_tokens
    fwd, _ = b.elementwise(f"{prefix}.bias_add", "bias_add", rows * b.h, b.h)
    return [(fwd, None, module)]
