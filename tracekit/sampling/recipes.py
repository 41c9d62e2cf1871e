"""Which recipe times a case, and whether this torch on this device can run it.

`time_any(case, dtype, timer)` times a case of tracekit.sampling.model_cases (or an optimizer case) with its named
recipe, any other with tracekit.sampling.compute.time_case. `unsupported(case, device, dtype)` is None where the
case's kernel runs here, else the reason it does not (each recipe's capability is checked once per device and dtype
with a call at a tiny shape, so a torch build or a GPU that lacks a kernel is named, not guessed): the fused SwiGLU is
compiled on CUDA only, TE's fused RoPE needs Transformer Engine, torch's fused RMSNorm kernel is a CUDA one, fp8
GEMMs need fp8 tensor cores (compute capability 8.9; a CPU has none: torch emulates them there) and blockwise scales
a CUDA ≥ 12.9 build.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from . import fp8_recipes, layer_recipes, moe_recipes
from .compute import DTYPES, Timer, time_case
from .optimizer_steps import adamw_step
from .shapes import Case, _case, stage_shapes


def _adamw_fused(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    f = dict(case.features)
    shapes = stage_shapes(int(f["layers"]), int(f["width"]), int(f["tp"]), int(f["params"]))
    return {"optimizer": adamw_step(shapes, DTYPES[dtype_name], timer, fused=True)}


RECIPES: dict[str, Callable[[Case, str, Timer], dict[str, float]]] = {
    "swiglu": layer_recipes.swiglu,
    "swiglu_unfused": layer_recipes.swiglu_unfused,
    "glu": layer_recipes.glu,
    "squared_relu": layer_recipes.squared_relu,
    "rmsnorm_fused": layer_recipes.rmsnorm_fused,
    "rmsnorm_unfused": layer_recipes.rmsnorm_unfused,
    "rope": layer_recipes.rope,
    "rope_fused": layer_recipes.rope_fused,
    "dropout": layer_recipes.dropout,
    "baddbmm": layer_recipes.baddbmm,
    "bmm": layer_recipes.bmm,
    "fillmask": layer_recipes.fillmask,
    "softmax": layer_recipes.softmax,
    "router_topk": moe_recipes.router_topk,
    "moe_permute": moe_recipes.moe_permute,
    "moe_unpermute": moe_recipes.moe_unpermute,
    "grouped_gemm": moe_recipes.grouped_gemm,
    "fp8_tensorwise": fp8_recipes.recipe("tensorwise"),
    "fp8_rowwise": fp8_recipes.recipe("rowwise"),
    "fp8_blockwise": fp8_recipes.recipe("blockwise"),
    "adamw_fused": _adamw_fused,
}


def time_any(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    """{pass: µs} of one case, by its recipe."""
    recipe = case.get("recipe")
    if recipe is None:
        return time_case(case, dtype_name, timer)
    return RECIPES[str(recipe)](case, dtype_name, timer)


def unsupported(case: Case, device: torch.device, dtype_name: str) -> str | None:
    """None where `case` runs on `device` in `dtype_name`, else why not (one line)."""
    recipe = case.get("recipe")
    return None if recipe is None else _reason(str(recipe), device.type, dtype_name)


@functools.cache
def _reason(recipe: str, device: str, dtype_name: str) -> str | None:
    version = torch.__version__.split("+")[0]
    if recipe == "swiglu" and device != "cuda":
        return ("Megatron's fused SwiGLU is a torch.compile kernel (jit_fuser); it is compiled on CUDA only (on a CPU "
                "the compile would take the budget)")
    if recipe == "rmsnorm_fused" and not rms_norm_is_fused(device):
        return f"torch {version} has no fused RMSNorm kernel on {device}: F.rms_norm runs as separate kernels there " \
               "(timed as RMSlayernorm)"
    if recipe == "rope_fused":
        if device != "cuda":
            return "Transformer Engine's fused RoPE kernel is a CUDA kernel"
        try:
            layer_recipes.te_rope()
        except ImportError:
            return "Transformer Engine is not installed: its fused RoPE kernel (Megatron's apply_rope_fusion) is " \
                "not here"
    if recipe == "grouped_gemm" and moe_recipes.grouped_mm() is None:
        return f"torch {version} has no grouped GEMM (torch._grouped_mm)"
    if recipe.startswith("fp8_"):
        if device == "cpu":
            return "a CPU has no fp8 arithmetic (torch emulates an fp8 GEMM in wider types) and no CPU run trains in " \
                   "fp8: its time would answer nothing"
        if not hasattr(torch, "float8_e4m3fn"):
            return f"torch {version} has no float8 dtypes"
        if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
            return f"{torch.cuda.get_device_name()} has no fp8 tensor cores (compute capability below 8.9)"
    probe = _PROBES.get(recipe)
    if probe is None:
        return None
    try:
        # whether it runs, not how long: the host's clock, no spin and no clock check
        time_any(probe(), dtype_name, Timer(torch.device(device), 0, 1, first_touch=False, on_host=True))
    except (RuntimeError, NotImplementedError, TypeError, ValueError, ImportError, OSError, AttributeError,
            AssertionError) as exc:  # whatever this torch build or GPU raises for a kernel it lacks
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"{recipe} does not run here (torch {version}, {device}): {first[:200]}"
    return None


def rms_norm_is_fused(device: str) -> bool:
    """Whether F.rms_norm runs as one fused operator on `device` (torch's `_fused_rms_norm` with a kernel and a
    backward of its own), not as the composite of powers, means and products torch falls back to, whose last
    operator is a product: what the autograd node of one call's output says."""
    x = torch.randn((4, 64), device=device, requires_grad=True)
    node = torch.nn.functional.rms_norm(x, (64,), None, 1e-5).grad_fn
    return node is not None and "rmsnorm" in node.name().lower()


#: A tiny case of each recipe whose support is a property of the torch build and the device, run once to find out.
_PROBES: dict[str, Callable[[], Case]] = {
    "swiglu": lambda: _case("activation", "swiglu", {"recipe": "swiglu", "rows": 16}, rows=24, width=64,
                            numel=24 * 64),
    "rope_fused": lambda: _case("elementwise", "rope_fused", {"recipe": "rope_fused", "heads": 2, "seq": 16,
                                                              "micro_batch": 1}, rows=32, width=64, numel=32 * 64),
    "grouped_gemm": lambda: _case("gemm", "grouped_fc1", {"recipe": "grouped_gemm"}, m=16, n=32, k=64, batch=2),
    **{f"fp8_{scaling}": functools.partial(
        lambda s: _case("gemm", "linear1", {"recipe": f"fp8_{s}"}, m=512, n=512, k=512, batch=1), scaling)
       for scaling in ("tensorwise", "rowwise", "blockwise")},
    "adamw_fused": lambda: _case("optimizer", "firstStage_optimizer_fused", {"recipe": "adamw_fused"}, layers=1,
                                 width=16, tp=1, params=12 * 16 * 16 + 13 * 16),
}
