"""GEMM rates in the dtypes a GPU has no model for: the bf16 estimate scaled by a learned, physically bounded factor.

A GEMM row in fp8, fp8_block, MXFP8, NVFP4 or MXFP4 is answered by a model where that dtype was measured on that GPU
(`predictor.costs.learned.model_keys.DTYPE_GROUPS`: B200's fp8 from XLA's table, MI355X's block-scaled fp8 from aiter).
Anywhere else it is estimated from the same row in bf16 (every path: model, transfer, roofline) and a speed-up learned
from the GPUs that measured both:

    e = FLOPs / (t_bf16 · P_bf16)          how close the bf16 GEMM runs to its dense peak (0: latency/memory bound)
    f(e) ∈ [0, 1]                          learned: (t_bf16 / t_low − 1) / (R − 1) on the measuring GPUs, R their
                                           datasheet peak ratio P_low / P_bf16; isotonic (non-decreasing) in e
    t_low = max(t_bf16 / (1 + f(e) · (R_T − 1)),  FLOPs / P_low)    R_T the target GPU's own peak ratio

so a small GEMM gains nothing (f ≈ 0), a large one a learned share of its own GPU's peak ratio; never slower than
bf16, never faster than the dtype's dense peak (`HardwareSpec.peak_tflops`). A GPU takes the curves of its dtype
measured on its own architecture first (H100 takes H200's measured fp8 table, `predictor.costs.physics.achieved_rates`:
Hopper's fp8 GEMMs gain 1.5–1.9× at transformer shapes, not Blackwell's ~2×), else those of its dtype on any GPU; a
dtype measured nowhere takes the curve pooled over every measured one. A set that learned no curve uses f = 1 (the
datasheet ratio: the old rule, known to be too fast for small GEMMs), and says so. A dtype above bf16 (fp32) keeps
the bf16 time where the row is latency or memory bound and is never faster than its own peak at the roofline's
achievable fraction: t = max(t_bf16, FLOPs / (P_fp32 · COMPUTE_EFFICIENCY)).

Curves are learned at training (`learn`) and kept in the model index under `lowp_speedup`: per (hardware, dtype)
the points' count and f on a fixed grid of e.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from predictor.costs.features import compute_work
from predictor.costs.physics.roofline import COMPUTE_EFFICIENCY
from tracekit.core.errors import ConfigError
from tracekit.core.hardware import architecture, hardware_spec

#: Dtypes below bf16 the curve answers, and those above it the roofline bound answers.
LOW = ("fp8", "fp8_block", "fp8_row", "mxfp8", "nvfp4", "mxfp4")
HIGH = ("fp32",)
#: Grid of e (bf16 efficiency) the learned curves are kept on.
GRID = np.round(np.linspace(0.0, 1.0, 21), 3)
#: Least shapes measured in both dtypes for a curve.
MIN_POINTS = 10
SHAPE = ["m", "n", "k", "batch"]


def peak_flops(hardware: str, dtype: str) -> float:
    """Dense tensor-core peak (FLOP/s) of `hardware` for a GEMM dtype; NaN for a part without a datasheet entry.
    ConfigError when the datasheet gives the part no tensor cores for that dtype (peak 0)."""
    spec = hardware_spec(hardware)
    if spec is None or hardware.startswith("cpu-"):
        return float("nan")
    peak = spec.peak_tflops(dtype)
    if peak <= 0:
        runs = "bf16 or fp8" if spec.peak_tflops_fp8 else "bf16"
        raise ConfigError(f"{hardware} has no tensor cores for {dtype} GEMMs (dense {dtype} peak 0 in the datasheet "
                          f"table): choose a recipe its GPUs run (e.g. {runs})")
    return peak * 1e12


def learn(samples: pd.DataFrame) -> list[dict]:
    """Curves from the samples: for each (hardware, low-precision dtype) measured at ≥ MIN_POINTS of the same forward
    GEMM shapes as bf16 (or fp16) on that hardware, the isotonic fit of f against e (module docstring) on GRID."""
    from sklearn.isotonic import IsotonicRegression  # training only (scikit-learn is slow to import)

    gemm = samples[samples["primitive"].isin(("gemm", "bmm")) & (samples["pass"] == "fwd")]
    out = []
    for (hardware, dtype), low in gemm[gemm["dtype"].isin(LOW)].groupby(["hardware", "dtype"], sort=True):
        spec = hardware_spec(str(hardware))
        half = gemm[(gemm["hardware"] == hardware) & gemm["dtype"].isin(("bf16", "fp16"))]
        if spec is None or half.empty or not spec.peak_tflops(str(dtype)):
            continue
        t16 = half.groupby(SHAPE)["duration_us"].median()
        t_low = low.groupby(SHAPE)["duration_us"].median()
        both = pd.concat({"t16": t16, "low": t_low}, axis=1).dropna()
        if len(both) < MIN_POINTS:
            continue
        flops = 2.0 * np.prod(np.array(both.index.tolist(), dtype="float64"), axis=1)
        e = flops / (both["t16"].to_numpy() * 1e-6 * spec.peak_tflops_fp16 * 1e12)
        ratio = spec.peak_tflops(str(dtype)) / spec.peak_tflops_fp16
        f = (both["t16"].to_numpy() / both["low"].to_numpy() - 1.0) / (ratio - 1.0)
        fit = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip").fit(e, f)
        out.append({"hardware": str(hardware), "dtype": str(dtype), "shapes": int(len(both)),
                    "e_range": [round(float(e.min()), 4), round(float(e.max()), 4)],
                    "f": [round(float(v), 4) for v in fit.predict(GRID)]})
    return out


def curve(curves: list[dict], dtype: str, hardware: str = "") -> tuple[np.ndarray | None, str]:
    """f on GRID for a dtype on `hardware` (the dtype's curves of `hardware`'s GPU architecture, else the dtype's on
    any GPU, else all pooled, each weighted by its shapes) and a note naming where it comes from; (None, note) when
    the set learned none."""
    own = [c for c in curves if c["dtype"] == dtype]
    arch = architecture(hardware) if hardware else None
    kin = [c for c in own if arch is not None and architecture(c["hardware"]) == arch]
    use = kin or own or curves
    if not use:
        return None, "no measured low-precision speed-up in this model set: the datasheet peak ratio"
    weights = np.array([c["shapes"] for c in use], dtype="float64")
    f = np.average(np.array([c["f"] for c in use], dtype="float64"), axis=0, weights=weights)
    named = ", ".join(f"{c['hardware']} {c['dtype']}" for c in use)
    return f, f"speed-up learned from {named}" + ("" if own else f" (no {dtype} measured)")


def bounded(frame: pd.DataFrame, bf16_us: np.ndarray, curves: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(µs, note) for GEMM/bmm rows of dtypes LOW or HIGH on GPUs of the datasheet, from their bf16 estimates
    (module docstring). ConfigError for a dtype the part has no tensor cores for."""
    duration = np.asarray(bf16_us, dtype="float64").copy()
    notes = np.full(len(frame), "", dtype=object)
    flops, _, _ = compute_work(frame.assign(dtype="bf16"))
    hardware = frame["hardware"].astype(str).to_numpy()
    dtype = frame["dtype"].astype(str).to_numpy()
    for hw, dt in sorted({(h, d) for h, d in zip(hardware, dtype)}):
        rows = (hardware == hw) & (dtype == dt)
        p_low = peak_flops(hw, dt)
        p16 = peak_flops(hw, "bf16")
        if not np.isfinite(p_low) or not np.isfinite(p16):
            notes[rows] = f"{dt} as bf16 ({hw} has no datasheet peaks)"
            continue
        t16 = duration[rows]
        floor = flops[rows] / p_low * 1e6
        if dt in HIGH:
            duration[rows] = np.fmax(t16, flops[rows] / (p_low * COMPUTE_EFFICIENCY) * 1e6)
            notes[rows] = f"{dt} from the bf16 estimate, at most {COMPUTE_EFFICIENCY:.0%} of the {dt} peak"
            continue
        f, where = curve(curves, dt, hw)
        with np.errstate(invalid="ignore", divide="ignore"):
            e = np.clip(flops[rows] / (t16 * 1e-6 * p16), 0.0, 1.0)
        share = np.interp(e, GRID, f) if f is not None else np.ones(int(rows.sum()))
        speedup = 1.0 + share * (p_low / p16 - 1.0)
        duration[rows] = np.fmax(t16 / speedup, floor)
        notes[rows] = f"{dt} = bf16 estimate / learned speed-up ≤ {p_low / p16:g}× ({where}), ≥ the {dt} peak time"
    return duration, notes


__all__ = ["GRID", "HIGH", "LOW", "bounded", "curve", "learn", "peak_flops"]
