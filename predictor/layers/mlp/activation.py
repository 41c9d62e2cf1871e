"""The activation of an MLP or of the experts as the bytes its kernel moves: a gated linear unit reads both halves.

The operator models answer activation rows with the GELU kernel's model (the samples' activation: GPT-NeoX's GELU
over `numel` elements, reading them and writing as many forward, reading the gradient and the input and writing the
input gradient backward: 2 and 3 element moves per element). A gated unit (SwiGLU, Megatron-core's `bias_swiglu` /
`weighted_bias_swiglu`, GPT-OSS's quick-GEGLU `weighted_bias_quick_geglu`) over an FC1 output of [rows, 2·width]
writes [rows, width]: forward it reads both halves and writes one (3 moves per output element), backward it reads
the gradient and both halves and writes both halves' gradients (5 moves). So a GLU row is sized as the GELU that
moves the same bytes: 3/2 of its output rows forward, 5/3 backward (the routing weights of the weighted forms, one
per row, and the reductions of their gradients are left out: a lower bound). Squared ReLU (`--squared-relu`, Nemotron
3's experts and MLPs: relu(x)², not gated) moves what GELU moves (its row is the variant `squared_relu`, answered by
the GELU kernel's model where none of its own was trained).
"""
from __future__ import annotations

from predictor.ir.ops import OpBuilder, Pair

#: Element moves per output element of a GLU (forward, backward) and of the GELU kernel the models learned.
GLU_MOVES = (3.0, 5.0)
GELU_MOVES = (2.0, 3.0)


def activation(b: OpBuilder, name: str, rows: float, width: float, module: str) -> Pair:
    """The activation over `rows` × `width` outputs of the configuration's MLP (`swiglu`: a gated unit)."""
    numel = rows * width
    if not b.c.swiglu:
        variant = "squared_relu" if b.c.extra.get("squared_relu") else "gelu"
        fwd, bwd = b.compute(name, "activation", variant, 0.0, True, rows=rows, width=width, numel=numel)
        return fwd, bwd, module
    fwd_rows, bwd_rows = (rows * glu / gelu for glu, gelu in zip(GLU_MOVES, GELU_MOVES))
    fwd, _ = b.compute(name, "activation", "swiglu", 0.0, True, rows=fwd_rows, width=width, numel=fwd_rows * width)
    _, bwd = b.compute(name, "activation", "swiglu", 0.0, True, rows=bwd_rows, width=width, numel=bwd_rows * width)
    return fwd, bwd, module
