"""What a GPU's GEMMs sustain through a training run: the ceilings of `tracekit/data/sustained_gemm.json`.

The operator samples time each kernel in a short burst at the boost clock: the seed paper's A100 samples of the
linear layers reach 295 TFLOP/s backward, 93% of the dense fp16 peak. A training run holds the tensor cores busy for
minutes under the board's power limit (400 W on an A100 SXM, 700 W on an H100 or H200 SXM), where the clock comes
down, and the GEMMs that draw the most power — the large, efficient ones — lose the most; a GEMM that runs below the
ceiling in its burst keeps its samples' speed. So a training iteration's half-precision GEMMs and batched GEMMs on a
part with a ceiling are no faster than their FLOPs at it, and its fp8 GEMMs — every 8-bit float recipe: tensorwise,
blockwise, rowwise, MX, one clock for all — no faster than their FLOPs at its fp8 ceiling where it has one
(`floor_us`, applied by `predictor.costs.estimates` to the operators of a training graph). Operator-level answers
(`ModelSet.predict`, what the samples are scored against) stay the bursts' speed.

The ceilings are hardware facts fitted, not measured: `make profiles` (tools/fit_sustained_gemm.py for the A100,
tools/fit_hopper_ceiling.py for Hopper) fits each on the end-to-end runs of the corpus that hold large GEMMs for long
on its parts (vTrain's multi-node A100 runs; Megatron-Bridge's dense H100 runs) and scores it on every other set it
applies to (docs/limits.md says why they are fitted; the GPU kit's `sustained` stage, benchmarks/gpu/harvest.py,
measures what a GPU sustains against its burst). Each applies to the parts the file names (one die, one board power
limit: an A100 SXM's 40 and 80 GB parts; the 700 W SXM boards of Hopper's die, H100, H800 and H200) and so to the
rows of any part priced with their models (an A100 PCIe card takes an SXM part's models, and with them its ceiling:
its own, under 300 W, would be lower and no row fits it); a part without one (an H100 PCIe card, GH200, Blackwell)
keeps its samples' speed, and a leave-one-GPU-out test (`ModelSet.without`) leaves a part's ceiling out with its
models.
"""
from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import pandas as pd

from predictor.costs.physics.roofline import compute_work
from tracekit.core.data_files import DATA
from tracekit.core.errors import ModelError
from tracekit.core.hardware import PEAK_KIND

CEILINGS = DATA / "sustained_gemm.json"
#: The operators a ceiling bounds (tensor-core GEMMs, each a row of FLOPs m·n·k).
PRIMITIVES = ("gemm", "bmm")
#: The dtypes a part's `tflops` bounds (its `fp8_tflops` bounds FP8).
HALF = ("fp16", "bf16")
#: The 8-bit float dtypes of a graph (the recipes' scales differ, the tensor cores' clock does not): a part's fp8
#: ceiling bounds them all.
FP8 = tuple(dtype for dtype, kind in PEAK_KIND.items() if kind == "fp8")


def half(tflops: float) -> dict[str, float]:
    """One part's ceilings when it has a half-precision one only: dtype → TFLOP/s."""
    return dict.fromkeys(HALF, float(tflops))


@lru_cache(maxsize=1)
def ceilings() -> dict[str, dict[str, float]]:
    """part → dtype → its sustained GEMM ceiling (TFLOP/s), as `make profiles` wrote them: fp16 and bf16 at the
    part's `tflops`, fp8 at its `fp8_tflops` where it has one."""
    try:
        parts = json.loads(CEILINGS.read_text())["parts"]
        out = {}
        for hw, entry in parts.items():
            out[str(hw)] = half(entry["tflops"])
            if "fp8_tflops" in entry:
                out[str(hw)]["fp8"] = float(entry["fp8_tflops"])
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelError(f"{CEILINGS}: unreadable sustained GEMM ceilings ({exc}); `make profiles` writes it") from exc


def floor_us(frame: pd.DataFrame, parts: dict[str, dict[str, float]]) -> np.ndarray:
    """Per row, the least time (µs) its FLOPs take at its part's ceiling for its dtype in `parts` (part → dtype →
    TFLOP/s, every FP8 dtype at the part's "fp8"; a frame without dtypes is half precision): 0 for rows the ceilings
    do not bound (other operators, other dtypes, parts without one)."""
    out = np.zeros(len(frame))
    if not parts or not len(frame):
        return out
    hardware = frame["hardware"].astype(str).tolist()
    dtypes = [("fp8" if d in FP8 else d) for d in frame["dtype"].astype(str)] if "dtype" in frame.columns \
        else [HALF[0]] * len(frame)
    tflops = np.array([parts.get(hw, {}).get(dtype, np.nan) for hw, dtype in zip(hardware, dtypes)], dtype="float64")
    bound = frame["primitive"].isin(PRIMITIVES).to_numpy() & ~np.isnan(tflops)
    if bound.any():
        flops = np.nan_to_num(compute_work(frame)[0], nan=0.0)
        out[bound] = flops[bound] / (tflops[bound] * 1e6)
    return out
