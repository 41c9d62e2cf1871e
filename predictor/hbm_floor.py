"""No streaming kernel on a GPU of the datasheet table is faster than the bytes it moves at the GPU's HBM bandwidth.

The models of the memory-bound primitives learn from micro-benchmarks that call one kernel on the same tensors
over and over, so an input that fits the L2 cache is read from it (the seed paper's A100 `res_add` samples reach
up to 82% of the HBM bandwidth, and a model extrapolating between them answers a little above 100%); and the
transfer path scales a source GPU's efficiency by the bandwidth ratio without the cache sizes (V100's 6 MB L2
against A100's 40 MB). In training these kernels read tensors other kernels wrote a layer earlier, from HBM.

`apply(frame, duration)` raises, in place, the estimate of each norm and element-wise row on a datasheet GPU to at
least its bytes at the datasheet's HBM bandwidth: the bytes `predictor.features.compute_work` counts (read and write
of the tensor, the gradient too backward), and for the element-wise kernels of two inputs (`res_add`, and the fused
RoPE rows answered by its model, `predictor.norm_rope_ops`) three elements per `numel` each way. It never lowers an
estimate.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from tracekit.core.hardware import hardware_spec

from .features import compute_work, dtype_bytes

PRIMITIVES = ("norm", "elementwise")
#: Element-wise variants that read two tensors of `numel` and write one, each way.
TWO_INPUTS = ("res_add", "rope_fused")


def apply(frame: pd.DataFrame, duration: np.ndarray) -> None:
    rows = np.flatnonzero(frame["primitive"].isin(PRIMITIVES).to_numpy())
    if not len(rows):
        return
    sub = frame.iloc[rows]
    hardware = sub["hardware"].astype(str).to_numpy()
    bw = np.array([_bandwidth(hw) for hw in hardware])
    _, moved, _ = compute_work(sub)
    if "variant" in sub.columns:
        numel = pd.to_numeric(sub["numel"], errors="coerce").to_numpy(dtype="float64") if "numel" in sub.columns \
            else np.full(len(sub), np.nan)
        esize = dtype_bytes(sub["dtype"] if "dtype" in sub.columns else None, len(sub))
        two = sub["variant"].isin(TWO_INPUTS).to_numpy()
        moved = np.where(two, 3.0 * numel * esize, moved)
    with np.errstate(invalid="ignore", divide="ignore"):
        floor = moved / bw * 1e6
    ok = np.isfinite(floor)
    duration[rows[ok]] = np.fmax(duration[rows[ok]], floor[ok])


def _bandwidth(hardware: str) -> float:
    """The datasheet's HBM bandwidth (bytes/s), NaN for a CPU or a part the table does not hold."""
    spec = None if hardware.startswith("cpu-") else hardware_spec(hardware)
    return spec.mem_bw_gbs * 1e9 if spec is not None and spec.mem_bw_gbs > 0 else np.nan
