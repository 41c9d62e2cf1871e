"""What Megatron-core's `TEGroupedMLP` (`megatron/core/transformer/moe/experts.py`) runs around the experts' grouped
GEMMs beyond the fused activation, as `Pair`s (predictor.ir.ops) for predictor.layers.moe.ops. Both are memory passes
over the tokens the rank's experts receive (`rows`), in the training dtype; neither runs when the experts go through
Transformer Engine's op fuser (tracekit.core.activation), whose fused kernels do the same work in place.

- The clamped GLU (`activation_func_clamp_value`): `weighted_bias_quick_geglu_impl` clamps the gate and linear halves
  of FC1's [rows, 2·ffn] output and concatenates them again before its fused kernel: each clamp reads and writes its
  half, the concatenation reads and writes the whole, 2 + 2 element-moves per element forward (module `moe_act`: the
  `moe_act` recompute replays it); backward, each clamp's gradient reads the gradient and the saved input and writes
  the masked gradient (3 per element; the concatenation's backward is a view).
- The FC2 bias (`add_bias_linear`): FC2 skips its bias add and `_apply_bias` adds each local expert's bias weighted
  by the token's routing probability, expert by expert, then concatenates the pieces: bias·prob written, the sum read
  (two operands) and written, the concatenation read and written, 6 element-moves per element of the [rows, hidden]
  output forward; backward, the bias gradient (gradient·prob written, then summed over the tokens) and the
  probability gradient (gradient·bias written, then summed over hidden), 6 per element.

The element-moves become the `elementwise` rows the operator models estimate (a forward row moves 2 per element, a
backward row 3: predictor.costs.features).
"""
from __future__ import annotations

from predictor.ir.ops import OpBuilder, Pair

#: Element reads + writes per element of the FC1 output (clamp) and of the FC2 output (bias), forward and backward.
CLAMP_MOVES = (4.0, 3.0)
BIAS_MOVES = (6.0, 6.0)


def _passes(b: OpBuilder, name: str, variant: str, numel: float, width: float, moves: tuple[float, float],
            fwd_module: str, bwd_module: str) -> list[Pair]:
    """A forward-only and a backward-only elementwise row moving `moves` elements per element of `numel`."""
    fwd, _ = b.elementwise(name, variant, numel * moves[0] / 2.0, width)
    _, bwd = b.elementwise(f"{name}.grad", variant, numel * moves[1] / 3.0, width)
    return [(fwd, None, fwd_module), (None, bwd, bwd_module)]


def glu_clamp(b: OpBuilder, rows: float, fc1_out: float) -> list[Pair]:
    """The clamp and concatenation of a clamped GLU's FC1 output ([rows, fc1_out]) before the fused activation;
    none without a clamp, without a gated unit or under TE's op fuser."""
    act = b.c.act
    if act is None or act.activation_func_clamp_value is None or act.use_transformer_engine_op_fuser \
            or not b.c.swiglu:
        return []
    return _passes(b, "mlp.experts.activation_clamp", "glu_clamp", rows * fc1_out, fc1_out, CLAMP_MOVES, "moe_act",
                   "moe")


def fc2_bias(b: OpBuilder, rows: float, width: float | None = None) -> list[Pair]:
    """`_apply_bias` on the experts' FC2 output ([rows, width]: hidden, or a latent MoE's latent size); none without
    biases or under TE's op fuser."""
    act = b.c.act
    if not b.c.add_bias_linear or (act is not None and act.use_transformer_engine_op_fuser):
        return []
    width = b.h if width is None else width
    return _passes(b, "mlp.experts.apply_bias", "expert_bias", rows * width, width, BIAS_MOVES, "moe", "moe")
