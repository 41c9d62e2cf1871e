"""What a GPU's GEMMs sustain through a training run: the ceilings of `tracekit/data/sustained_gemm.json`.

The operator samples time each kernel in a short burst at the boost clock: the seed paper's A100 samples of the
linear layers reach 295 TFLOP/s backward, 93% of the dense fp16 peak. A training run holds the tensor cores busy for
minutes under the board's power limit (400 W on an A100 SXM), where the clock comes down, and the GEMMs that draw
the most power — the large, efficient ones — lose the most; a GEMM that runs below the ceiling in its burst keeps its
samples' speed. So a training iteration's half-precision GEMMs and batched GEMMs on a part with a ceiling are no
faster than their FLOPs at it (`floor_us`, applied by `predictor.costs.estimates` to the operators of a training
graph). Operator-level answers (`ModelSet.predict`, what the samples are scored against) stay the bursts' speed.

The ceiling is a hardware fact fitted, not measured: `make profiles` (tools/fit_sustained_gemm.py) fits it on the
end-to-end runs of the corpus that hold large GEMMs for long (vTrain's multi-node A100 runs) and scores it on every
other A100 set it applies to (docs/limits.md says why it is fitted; the GPU kit's `sustained` stage,
benchmarks/gpu/harvest.py, measures what a GPU sustains against its burst). It applies to the parts
the file names (an A100 SXM's 40 and 80 GB parts: one die, one power limit) and so to the rows of any part priced
with their models (an A100 PCIe card takes an SXM part's models, and with them its ceiling: its own, under 300 W,
would be lower and no row fits it); a part without one keeps its samples' speed, and a leave-one-GPU-out test
(`ModelSet.without`) leaves a part's ceiling out with its models.
"""
from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import pandas as pd

from predictor.costs.physics.roofline import compute_work
from tracekit.core.data_files import DATA
from tracekit.core.errors import ModelError

CEILINGS = DATA / "sustained_gemm.json"
#: The operators a ceiling bounds (tensor-core GEMMs, each a row of FLOPs m·n·k) and the dtypes it was fitted in.
PRIMITIVES = ("gemm", "bmm")
DTYPES = ("fp16", "bf16")


@lru_cache(maxsize=1)
def ceilings() -> dict[str, float]:
    """part → its sustained half-precision GEMM ceiling (TFLOP/s), as `make profiles` wrote them."""
    try:
        parts = json.loads(CEILINGS.read_text())["parts"]
        return {str(hw): float(entry["tflops"]) for hw, entry in parts.items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{CEILINGS}: unreadable sustained GEMM ceilings ({exc}); `make profiles` writes it") from exc


def floor_us(frame: pd.DataFrame, parts: dict[str, float]) -> np.ndarray:
    """Per row, the least time (µs) its FLOPs take at its part's ceiling in `parts` (TFLOP/s): 0 for rows the
    ceilings do not bound (other operators, other dtypes, parts without one)."""
    out = np.zeros(len(frame))
    if not parts or not len(frame):
        return out
    tflops = frame["hardware"].astype(str).map(parts).to_numpy(dtype="float64")
    bound = frame["primitive"].isin(PRIMITIVES).to_numpy() & ~np.isnan(tflops)
    if "dtype" in frame.columns:
        bound &= frame["dtype"].astype(str).isin(DTYPES).to_numpy()
    if bound.any():
        flops = np.nan_to_num(compute_work(frame)[0], nan=0.0)
        out[bound] = flops[bound] / (tflops[bound] * 1e6)
    return out
