"""The bias add and the dropout of Megatron-core's unfused bias-dropout-add, as `Pair`s (predictor.ir.ops) beside the
residual add.

A row-parallel linear layer (the attention's `linear_proj`, a dense MLP's `linear_fc2`) skips its bias and returns it
to the layer, which adds it with the dropout and the residual (`megatron/core/fusions/fused_bias_dropout.py`). With
`bias_dropout_fusion` (Megatron's default) that is one fused kernel, the `res_add` row every layer has. Without it
(`--no-bias-dropout-fusion`; Megatron-Bridge's GPT-OSS provider sets `bias_dropout_fusion=False`)
`_bias_dropout_add_func` runs `x + bias` as a kernel of its own before the residual add: it reads the [tokens,
hidden] output and writes the sum, 2 element moves per element (asked as predictor.layers.local_kernels' `streaming`
rows). The dropout adds no kernel at probability 0 (`torch.nn.functional.dropout` returns its input); at a hidden
dropout above 0 the unfused function runs it as a kernel of its own too (reads the sum and writes it and a 1-byte mask
forward; reads the gradient and the mask and writes the gradient backward: predictor.layers.local_kernels'
DROPOUT_MOVES), where the fused kernel drops in place. Otherwise the backward is the same as the fused kernel's: the
addition passes its gradient through, and the bias gradient is the sum over the tokens either way. An MoE layer returns
no bias (its experts add theirs: predictor.layers.moe.grouped_mlp), so only the attention's and a dense MLP's
bias-dropout-add have the bias kernel; every unfused one has the dropout.
"""
from __future__ import annotations

from predictor.ir.ops import OpBuilder, Pair
from predictor.layers.local_kernels import DROPOUT_MOVES, streaming


def fused(extra: dict) -> bool:
    """Whether the configuration fuses the bias, dropout and residual add (Megatron's default)."""
    return bool(extra.get("bias_dropout_fusion", True))


def bias_add(b: OpBuilder, prefix: str, module: str, bias: bool = True) -> list[Pair]:
    """The unfused bias-dropout-add's kernels before `prefix`'s residual add: the bias add (`bias`: the block hands a
    linear layer's bias on, and the configuration has biases) and the dropout (hidden dropout > 0); none with the
    fusion."""
    if fused(b.c.extra):
        return []
    numel = b.sp_tokens * b.h
    out: list[Pair] = []
    if bias and b.c.add_bias_linear:
        out.extend(streaming(b, f"{prefix}.bias_add", "bias_add", 2.0 * numel, 0.0, b.h, module))
    if b.c.hidden_dropout > 0:
        out.extend(streaming(b, f"{prefix}.dropout", "dropout", DROPOUT_MOVES * numel, DROPOUT_MOVES * numel, b.h,
                             module))
    return out
