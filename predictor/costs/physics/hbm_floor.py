"""No fused streaming kernel that tracekit answers with another kernel's model is faster than the bytes it moves at
the GPU's HBM bandwidth.

The models of the memory-bound primitives learn from micro-benchmarks that call one kernel on the same tensors
over and over, so an input that fits the L2 cache is read from it (the seed paper's A100 `res_add` samples reach
up to 82% of the HBM bandwidth, and the model extrapolating between them answers a little above 100%); and the
transfer path scales a source GPU's efficiency by the bandwidth ratio without the cache sizes (V100's 6 MB L2
against A100's 40 MB). In training these kernels read tensors other kernels wrote a layer earlier, from HBM.

`apply(frame, duration)` raises, in place, the estimate of each fused RoPE row (`rope_fused`, answered by the
`res_add` kernel's model: `predictor.layers.norm_rope`) and of each streaming row of `predictor.layers.local_kernels` on
a datasheet GPU to at least its bytes at the datasheet's
HBM bandwidth, three elements per `numel` each way (two reads and a write, the res_add row that moves a fused RoPE
kernel's bytes). It never lowers an estimate. It is not applied to every streaming row: on the dense GPT sets that
would move vTrain single node 7.15% → 7.14% and Narayanan 2021 4.80% → 4.82% (the A100 `res_add` model answers GPT-3's
widest layers a little above the HBM bandwidth), and those figures are kept as they are.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from predictor.costs.features import dtype_bytes
from predictor.costs.physics.roofline import rates
from predictor.layers.local_kernels import STREAMING

#: Element-wise variants floored, each reading two tensors of `numel` and writing one, each way: fused RoPE and the
#: kernels predictor.layers.local_kernels sizes by their bytes.
FLOORED = ("rope_fused", *STREAMING)


def apply(frame: pd.DataFrame, duration: np.ndarray) -> None:
    if "variant" not in frame.columns or "numel" not in frame.columns:
        return
    rows = np.flatnonzero(((frame["primitive"] == "elementwise") & frame["variant"].isin(FLOORED)).to_numpy())
    if not len(rows):
        return
    sub = frame.iloc[rows]
    numel = pd.to_numeric(sub["numel"], errors="coerce").to_numpy(dtype="float64")
    raise_to_bytes(sub, duration, rows, 3.0 * numel * dtype_bytes(sub["dtype"] if "dtype" in sub.columns else None,
                                                                   len(sub)))


def raise_to_bytes(sub: pd.DataFrame, duration: np.ndarray, rows: np.ndarray, moved: np.ndarray) -> None:
    """Raise, in place, `duration[rows]` to at least `moved` bytes (per row of `sub`, the frame's `rows`) at each row's
    HBM bandwidth; rows without a bandwidth or a byte count keep their estimate."""
    bw = np.array([_bandwidth(hw) for hw in sub["hardware"].astype(str).to_numpy()])
    with np.errstate(invalid="ignore", divide="ignore"):
        floor = moved / bw * 1e6
    ok = np.isfinite(floor)
    duration[rows[ok]] = np.fmax(duration[rows[ok]], floor[ok])


def _bandwidth(hardware: str) -> float:
    """The HBM bandwidth the roofline uses (bytes/s: the datasheet's), NaN for a CPU or a part the table does not
    hold."""
    peak = None if hardware.startswith("cpu-") else rates(hardware)
    return peak.mem_bw if peak is not None and peak.mem_bw > 0 else np.nan
