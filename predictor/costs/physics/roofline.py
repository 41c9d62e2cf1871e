"""Roofline estimates: an operator's time from its work and the hardware's peak rates.

GPU peaks come from the datasheet table in `tracekit.core.hardware.SPECS`; a `cpu-*` hardware id uses this
machine's CPU, measured once per machine (a float32 matmul and a large copy) and kept in a cache file, so that
every process predicts with the same rates (they are also model features). A model set trained on a CPU records the
rates it was normalised with, and loading it makes them that id's rates (`record_rates`): the model predicts the
same on another machine. The estimate is derated by typical
achievable fractions (below) so that it is a usable fallback rather than an unreachable bound.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from predictor.costs.features import compute_work, dtype_bytes, ring_traffic
from predictor.layers.kernel_work import TENSOR_CORE_PRIMITIVES as HYBRID_TENSOR_CORE
from tracekit.core.atomic import atomic_write_json
from tracekit.core.hardware import PEAK_KIND, cpu_hardware_id, hardware_spec
from tracekit.core.samples import COLLECTIVE_PRIMITIVES

#: Achievable fractions of peak (large well-shaped kernels reach these; small ones are slower).
COMPUTE_EFFICIENCY = 0.7
MEMORY_EFFICIENCY = 0.8
LINK_EFFICIENCY = 0.8
#: Fixed cost of one kernel launch and of one ring step, µs.
KERNEL_OVERHEAD_US = 5.0
STEP_LATENCY_US = {"intra": 3.0, "inter": 10.0}
TENSOR_CORE_PRIMITIVES = ("gemm", "bmm", "attention", *HYBRID_TENSOR_CORE)


@dataclass(frozen=True)
class Rates:
    """Peak rates of one hardware id: FLOP/s (tensor / vector), memory and link bytes/s, SM count."""

    tensor_flops: float
    vector_flops: float
    mem_bw: float
    intra_bw: float
    inter_bw: float
    sms: int
    fp8_flops: float = 0.0  # 0: no fp8 tensor cores


def _best_rate(work: float, run, windows: int = 5, window_s: float = 0.05) -> float:
    """Highest rate (work units per second) over a few short windows: the least disturbed by other load."""
    run()
    best = 0.0
    for _ in range(windows):
        start, reps = time.perf_counter(), 0
        while time.perf_counter() - start < window_s:
            run()
            reps += 1
        best = max(best, work * reps / (time.perf_counter() - start))
    return best


def measure_cpu() -> Rates:
    """This CPU's float32 matmul rate and copy bandwidth (≈0.5 s)."""
    a = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
    flops = _best_rate(2 * 1024**3, lambda: np.dot(a, a))
    src = np.ones(16 << 20, dtype=np.float32)
    dst = np.empty_like(src)
    bw = _best_rate(2 * src.nbytes, lambda: np.copyto(dst, src))
    return Rates(flops, flops, bw, bw / 4, 1.25e9, 1)


def cpu_rates_file() -> Path:
    """Where measured CPU rates are kept: `$TRACEKIT_CACHE_DIR`, else `$XDG_CACHE_HOME/tracekit`, else
    `~/.cache/tracekit`, file `cpu-rates.json` (hardware id → rates)."""
    folder = os.environ.get("TRACEKIT_CACHE_DIR") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracekit"
    return Path(folder) / "cpu-rates.json"


@lru_cache(maxsize=1)
def cpu_rates() -> Rates:
    """This machine's CPU rates: read from the cache file, measured and recorded there the first time (an
    unreadable file is measured over and replaced)."""
    path, key = cpu_rates_file(), cpu_hardware_id()
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    known = known if isinstance(known, dict) else {}
    try:
        return Rates(**known[key])
    except (KeyError, TypeError):
        pass
    measured = measure_cpu()
    try:
        atomic_write_json(path, {**known, key: asdict(measured)})
    except OSError:
        pass  # a read-only home still predicts; it only measures again in the next process
    return measured


#: Rates a loaded model set was trained with (CPU ids): they win over this machine's, so a model predicts the same
#: on every machine it is loaded on.
_RECORDED: dict[str, Rates] = {}


def record_rates(hardware: str, recorded: Rates) -> None:
    """Use `recorded` for `hardware` from now on in this process (what a model set was normalised with)."""
    if _RECORDED.get(hardware) != recorded:
        _RECORDED[hardware] = recorded
        rates.cache_clear()


@lru_cache(maxsize=64)
def rates(hardware: str) -> Rates | None:
    """Peak rates for a hardware id; None when it is neither in the datasheet table nor a CPU. A CPU id uses the
    rates recorded by a loaded model set trained on it, else this machine's measured rates."""
    if hardware in _RECORDED:
        return _RECORDED[hardware]
    if hardware.startswith("cpu-"):
        return cpu_rates()
    spec = hardware_spec(hardware)
    if spec is None:
        return None
    return Rates(spec.peak_tflops_fp16 * 1e12, spec.peak_tflops_fp32 * 1e12, spec.mem_bw_gbs * 1e9,
                 spec.intra_node_gbs * 1e9, spec.inter_node_gbs * 1e9, spec.sms, spec.peak_tflops_fp8 * 1e12)


def hardware_rates(hardware: pd.Series) -> dict[str, np.ndarray]:
    """Per-row peak rates (NaN for unknown hardware)."""
    names = ("tensor_flops", "vector_flops", "mem_bw", "intra_bw", "inter_bw", "sms", "fp8_flops")
    out = {name: np.full(len(hardware), np.nan) for name in names}
    for hw, idx in pd.Series(np.arange(len(hardware))).groupby(hardware.to_numpy()).groups.items():
        r = rates(str(hw))
        if r is None:
            continue
        for name in names:
            out[name][np.asarray(idx)] = getattr(r, name)
    return out


def tensor_peaks(hardware: np.ndarray, dtype: np.ndarray, size: np.ndarray, hw: dict[str, np.ndarray]) -> np.ndarray:
    """Per row, the tensor-core peak (FLOP/s) for its input dtype: the datasheet's peak for a GEMM dtype
    (`HardwareSpec.peak_tflops`: fp8 and the block-scaled fp8 formats on the fp8 tensor cores, NVFP4 / MXFP4 on the
    fp4 ones; NaN where the part has no tensor cores for it), TF32 at half the fp16 peak, other names by their
    element size (fp8-sized: the fp8 peak, half-sized: the fp16 peak). A CPU id has one rate."""
    out = np.where(size < 2, np.where(hw["fp8_flops"] > 0, hw["fp8_flops"], np.nan), hw["tensor_flops"])
    out = np.where(dtype == "tf32", hw["tensor_flops"] / 2.0, out)
    named = np.isin(dtype, [d for d in PEAK_KIND if d != "fp32"])
    for hw_id, dt in {(h, d) for h, d in zip(hardware[named], dtype[named])}:
        spec = hardware_spec(str(hw_id)) if not str(hw_id).startswith("cpu-") else None
        if spec is not None:
            peak = spec.peak_tflops(str(dt)) * 1e12
            out = np.where((hardware == hw_id) & (dtype == dt), peak if peak > 0 else np.nan, out)
    return out


def compute_seconds(frame: pd.DataFrame, hw: dict[str, np.ndarray] | None = None,
                    prim: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of compute work at the derated peaks: (FLOPs / peak, bytes / bandwidth) in seconds, each 0 where that
    work is unknown, and whether the roofline can size the row at all (its hardware, peak and some work known).
    `hw` and `prim` are the rows' `hardware_rates` and primitives when the caller has them already."""
    hw = hardware_rates(frame["hardware"].astype("string").fillna("")) if hw is None else hw
    prim = frame["primitive"].astype("string").fillna("").to_numpy() if prim is None else prim
    flops, moved, _ = compute_work(frame)
    size = dtype_bytes(frame["dtype"] if "dtype" in frame.columns else None, len(frame))
    dtype = frame["dtype"].astype("string").fillna("").to_numpy() if "dtype" in frame.columns \
        else np.full(len(frame), "")
    tensor = np.isin(prim, TENSOR_CORE_PRIMITIVES) & ((size <= 2) | (dtype == "tf32"))
    peak = np.where(tensor, tensor_peaks(frame["hardware"].astype("string").fillna("").to_numpy(), dtype, size, hw),
                    hw["vector_flops"]) * COMPUTE_EFFICIENCY
    with np.errstate(invalid="ignore", divide="ignore"):
        t_compute = np.nan_to_num(flops / peak, nan=0.0)
        t_memory = np.nan_to_num(moved / (hw["mem_bw"] * MEMORY_EFFICIENCY), nan=0.0)
    known = ~((np.isnan(flops) & np.isnan(moved)) | np.isnan(hw["mem_bw"]) | np.isnan(peak))
    return t_compute, t_memory, known


def estimate_us(frame: pd.DataFrame) -> np.ndarray:
    """Roofline time (µs) per row: max(FLOPs / peak, bytes / bandwidth) + launch overhead; collectives: ring
    traffic / link bandwidth + per-step latency. NaN where the hardware or the work is unknown."""
    hw = hardware_rates(frame["hardware"].astype("string").fillna(""))
    prim = frame["primitive"].astype("string").fillna("").to_numpy()
    t_compute, t_memory, known = compute_seconds(frame, hw, prim)
    compute_est = np.where(known, np.maximum(t_compute, t_memory) * 1e6 + KERNEL_OVERHEAD_US, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):

        nodes = np.nan_to_num(pd.to_numeric(frame["nodes"], errors="coerce").to_numpy(dtype="float64"), nan=1.0) \
            if "nodes" in frame.columns else np.ones(len(frame))
        group = pd.to_numeric(frame["group_size"], errors="coerce").to_numpy(dtype="float64") \
            if "group_size" in frame.columns else np.full(len(frame), np.nan)
        nbytes = pd.to_numeric(frame["bytes"], errors="coerce").to_numpy(dtype="float64") \
            if "bytes" in frame.columns else np.full(len(frame), np.nan)
        group = np.where(np.isnan(group), 2.0, group)
        inter = nodes > 1
        link = np.where(inter, hw["inter_bw"], hw["intra_bw"]) * LINK_EFFICIENCY
        steps = np.where(prim == "all_reduce", 2.0 * (group - 1.0), np.where(prim == "send_recv", 1.0, group - 1.0))
        latency = steps * np.where(inter, STEP_LATENCY_US["inter"], STEP_LATENCY_US["intra"])
        comm_est = ring_traffic(prim, nbytes, group) / link * 1e6 + latency + KERNEL_OVERHEAD_US
    is_coll = np.isin(prim, COLLECTIVE_PRIMITIVES)
    return np.where(is_coll, comm_est, compute_est)
