"""Timing recipes of fp8 GEMMs (torch._scaled_mm / F.scaled_mm, e4m3 operands, bf16 output): a linear layer's forward
GEMM and its backward's two (the input gradient dY·W and the weight gradient dYᵀ·X), every operand already cast and
laid out as the GEMM reads it (row-major first operand, column-major second): the casts are the recipe's own rows
(`quantize` in predictor.ir.ops), not the GEMM's. Scales, by scaling:

- tensorwise: one fp32 scale per operand (Transformer Engine's delayed and current per-tensor scaling);
- rowwise: one per row of the first operand and one per column of the second (torchao's rowwise recipe);
- blockwise: one per 1×128 block of the first operand (outer-dimension-major) and one per 128×128 block of the
  second (DeepSeek-V3's and Transformer Engine's Float8BlockScaling; every GEMM here takes 128×128 blocks for its
  second operand).

A backward GEMM's operands are e4m3 like the forward's (the hybrid format's e5m2 gradients run on the same tensor
cores at the same rate).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .compute import Timer
from .shapes import Case

BLOCK = 128


def scales(scaling: str, rows: int, cols: int, inner: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The scales of a [rows, inner] × [inner, cols] GEMM under `scaling`."""
    if scaling == "tensorwise":
        one = torch.ones((), device=dev, dtype=torch.float32)
        return one, one
    if scaling == "rowwise":
        return torch.ones((rows, 1), device=dev), torch.ones((1, cols), device=dev)
    if scaling == "blockwise":
        return (torch.ones((inner // BLOCK, rows), device=dev).t(),
                torch.ones((cols // BLOCK, inner // BLOCK), device=dev).t())
    raise ValueError(f"no fp8 scaling {scaling!r}")


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scaling: str) -> torch.Tensor:
    """a [m, k] (row-major) × b [k, n] (column-major) in fp8 with `scaling`'s scales, bf16 out."""
    scale_a, scale_b = scales(scaling, a.shape[0], b.shape[1], a.shape[1], a.device)
    if scaling == "blockwise" and hasattr(F, "scaled_mm"):
        kind = F.ScalingType
        return F.scaled_mm(a, b, scale_a, kind.BlockWise1x128, scale_b, kind.BlockWise128x128,
                           output_dtype=torch.bfloat16)
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)


def fp8_linear(m: int, n: int, k: int, scaling: str, timer: Timer) -> dict[str, float]:
    """{fwd, bwd} µs of a linear layer's fp8 GEMMs: Y = X·Wᵀ forward; dX = dY·W and dW = dYᵀ·X backward."""
    dev, e4m3 = timer.device, torch.float8_e4m3fn

    def fp8(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn((rows, cols), device=dev) * 0.5).to(e4m3)

    x, w, dy = fp8(m, k), fp8(n, k), fp8(m, n)
    w_t, dy_t, x_t = fp8(k, n), fp8(n, m), fp8(k, m)  # the transposed copies the recipe's casts also write
    forward = timer.once(lambda: scaled_mm(x, w.t(), scaling))
    backward = timer.once(lambda: (scaled_mm(dy, w_t.t(), scaling), scaled_mm(dy_t, x_t.t(), scaling)))
    return {"fwd": forward, "bwd": backward}


def recipe(scaling: str):
    def run(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
        f = dict(case.features)
        return fp8_linear(int(f["m"]), int(f["n"]), int(f["k"]), scaling, timer)

    run.__name__ = f"fp8_{scaling}"
    return run
