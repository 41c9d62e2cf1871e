"""Fit the scalar (`align1`) GEMM path's rate of `predictor.costs.physics.kernel_paths` on another GPU's traces.

Data: the A100 GEMM kernels of the corpus's HTA traces (kineto/hta: trace_diff_control, timeline_analysis_sampled,
trace_filter_sampled) that cuBLAS ran as CUTLASS `*_align1` tensor-core kernels, read with tracekit's own trace
reader (shapes from the launching op), at least one wave of 128×128 tiles (tiles ≥ SMs: no wave-quantisation
effect). No H100 kernel is used: `benchmarks/operator_accuracy.py --transfer` scores the constant on the H100
kernels of the TraceLens traces.

The GPU-side kernel floor (`gpu_kernel_floor_us`): the shortest compute kernel (not a copy or a memset) of the same
A100 traces; kernel durations in a trace are GPU-side, without the host's launch cost. Printed beside it: the
shortest GEMM kernel (not used: a GEMM keeps the 5 µs fixed time, see `predictor.costs.physics.kernel_paths`).

For each kernel: elements moved by a 128×128-tiled GEMM (`kernel_paths.scalar_gemm_elements`) / ((time − the
fixed time min(5 µs, time / 2)) · SMs · tensor clock (`kernel_paths.tensor_clock_hz`; A100's is its table
clock)); the constant is their median. Printed beside it: the same median and spread for the FLOP rate per SM per
clock (the model not chosen: its spread is larger), so the choice is made on the fit data.

Usage: python benchmarks/fit_kernel_paths.py [--corpus ../shared/corpus]   (prints the fit; `make profiles`, which
runs `fit` through tools/fit_profiles.py, writes tracekit/data/kernel_paths.json)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from extractors.kineto import read_trace, trace_samples  # noqa: E402
from predictor.costs.physics.kernel_paths import TILE, scalar_gemm_elements, tensor_clock_hz  # noqa: E402
from predictor.costs.physics.roofline import KERNEL_OVERHEAD_US  # noqa: E402
from tracekit.core.hardware import hardware_spec  # noqa: E402
from tracekit.core.samples import COLLECTIVE_PRIMITIVES  # noqa: E402

TRACES = ("trace_diff_control_control.json.gz", "timeline_analysis_sampled_rank-0.json.gz",
          "trace_filter_sampled_rank-1.json.gz")


def trace_kernels(corpus: Path) -> pd.DataFrame:
    """Every kernel of the A100 traces, as tracekit's trace reader reads them."""
    frames = [trace_samples(read_trace(corpus / "kineto" / "hta" / name), name) for name in TRACES]
    return pd.concat(frames, ignore_index=True)


def kernel_floor(rows: pd.DataFrame, primitives: tuple[str, ...] = ()) -> float:
    """The shortest compute kernel (µs) of a GPU in the datasheet table: no copy, memset or collective; of
    `primitives` only where given."""
    known = rows["hardware"].map(lambda hw: hardware_spec(str(hw)) is not None).astype(bool)
    compute = ~rows["primitive"].isin((*COLLECTIVE_PRIMITIVES, "memcpy", "memset")) & (rows["duration_us"] > 0)
    if primitives:
        compute &= rows["primitive"].isin(primitives)
    return float(rows.loc[compute & known, "duration_us"].min())


def kernels(rows: pd.DataFrame) -> pd.DataFrame:
    """The align1 tensor-core GEMM kernels with shapes, at least one wave of tiles, with their SMs × clock."""
    rows = rows[(rows["primitive"] == "gemm") & rows["kernel"].str.contains("tensorop", na=False)
                & rows["kernel"].str.contains("_align1", na=False) & rows["m"].notna()].reset_index(drop=True)
    specs = {hw: hardware_spec(hw) for hw in rows["hardware"].unique()}
    rows["sms"] = rows["hardware"].map(lambda hw: specs[hw].sms if specs[hw] else np.nan)
    rows["clock_hz"] = rows["hardware"].map(lambda hw: tensor_clock_hz(hw) if specs[hw] else np.nan)
    m, n, k = (rows[c].to_numpy("float64") for c in ("m", "n", "k"))
    batch = rows["batch"].fillna(1).to_numpy("float64")
    tiles = batch * np.ceil(m / TILE) * np.ceil(n / TILE)
    rows["elements"] = scalar_gemm_elements(m, n, k, batch)
    rows["flops"] = 2 * batch * m * n * k
    return rows[(tiles >= rows["sms"]) & rows["sms"].notna()].reset_index(drop=True)


def spread(values: pd.Series) -> float:
    """Median absolute percentage error of predicting every kernel by the median."""
    return float(np.median(np.abs(values.median() / values - 1)))


def fit(corpus: Path) -> tuple[dict, list[str]]:
    """(the document `tracekit/data/kernel_paths.json` holds, the lines that report the fit) from the corpus."""
    every = trace_kernels(corpus)
    floor = kernel_floor(every)
    gemm_floor = kernel_floor(every, ("gemm", "bmm"))
    rows = kernels(every)
    busy_s = (rows["duration_us"] - np.minimum(KERNEL_OVERHEAD_US, rows["duration_us"] / 2)) * 1e-6
    per_sm_clock = busy_s * rows["sms"] * rows["clock_hz"]
    elements = rows["elements"] / per_sm_clock
    flops = rows["flops"] / per_sm_clock
    lines = [f"{len(rows)} align1 tensor-core GEMM kernels ({', '.join(sorted(rows['hardware'].unique()))}), "
             f"≥ 1 wave of {TILE}×{TILE} tiles",
             f"GPU-side kernel floor: {floor:.2f} µs (shortest compute kernel of {len(every)} kernels), "
             f"GEMM kernel floor {gemm_floor:.2f} µs",
             f"elements per SM per clock: median {elements.median():.3f}, "
             f"spread (median APE) {100 * spread(elements):.1f}%",
             f"FLOPs per SM per clock:    median {flops.median():.1f}, spread (median APE) {100 * spread(flops):.1f}%"]
    doc = {
        "format": "tracekit-kernel-paths/1",
        "by": "make profiles (tools/fit_profiles.py)",
        "scalar_gemm_elements_per_sm_clock": round(float(elements.median()), 4),
        "gpu_kernel_floor_us": round(floor, 3),
        "fit": {"kernels": int(len(rows)), "hardware": sorted(rows["hardware"].unique().tolist()),
                "traces": [f"kineto/hta/{name}" for name in TRACES],
                "spread_median_ape": round(spread(elements), 4),
                "flop_model_spread_median_ape": round(spread(flops), 4)},
    }
    return doc, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default=str(ROOT.parent / "shared" / "corpus"))
    args = parser.parse_args()
    _, lines = fit(Path(args.corpus))
    print("\n".join(lines))
    print("(`make profiles` writes these constants to tracekit/data/kernel_paths.json)")


if __name__ == "__main__":
    main()
