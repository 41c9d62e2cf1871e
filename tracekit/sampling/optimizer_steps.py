"""The optimizer step as Megatron-core runs it on a GPU without Transformer Engine or apex: its mixed-precision
optimizer (Float16OptimizerWithFloat16Params) keeps fp32 main copies of the bf16/fp16 parameters, whose gradients its
DDP already holds in fp32 (`main_grad`, forced on for bf16), steps torch's AdamW over them (Megatron falls back to
`torch.optim.AdamW` when neither TE's nor apex's FusedAdam imports; torch then runs its `foreach` implementation on a
GPU) and copies the main parameters back into the model's, tensor by tensor (without apex's multi-tensor kernels).

`fused=True` steps AdamW with torch's fused implementation instead (`fused=True`: one multi-tensor kernel per chunk of
tensors, as TE's and apex's FusedAdam do), the step a run with TE or apex takes.
"""
from __future__ import annotations

from typing import Callable, Protocol

import torch


class StepTimer(Protocol):
    """What an optimizer step is timed with (`tracekit.sampling.compute.Timer`): its device and one timed call."""

    device: torch.device

    def once(self, step: Callable[[], object]) -> float: ...


def adamw_step(shapes: list[tuple[int, ...]], dtype: torch.dtype, timer: StepTimer, fused: bool) -> float:
    """Median µs of one AdamW step over parameters of these shapes, as module docstring."""
    dev = timer.device
    model = [torch.randn(shape, device=dev).to(dtype) for shape in shapes]
    if dtype == torch.float32:  # fp32 training steps the model's own parameters
        main = [torch.nn.Parameter(p) for p in model]
    else:
        main = [torch.nn.Parameter(p.float()) for p in model]
    for p in main:
        p.grad = torch.randn_like(p) * 1e-3  # Megatron's main_grad: fp32
    optimizer = torch.optim.AdamW(main, lr=1e-4, weight_decay=0.01, foreach=not fused, fused=fused)

    def step() -> None:
        optimizer.step()
        if dtype != torch.float32:
            with torch.no_grad():
                for param, master in zip(model, main):
                    param.copy_(master)

    return timer.once(step)
