"""What the corpus's GEMM measurements say each GPU achieves: `tracekit/data/gemm_rates.json` (a `make profiles` stage).

A datasheet gives a GPU's dense peak; what its GEMMs reach is lower, and by how much is a fact of the part (its
clocks under its power limit, its tensor-core generation), measured, not fitted to any end-to-end row. Per GPU with
bf16 (or fp16) GEMMs measured in the corpus:
- `bf16_large`: the median rate over the measured shapes of at least LARGE_FLOPS (2·4096³ / 2: every such shape fills
  the GPU with several waves of tiles, so the rate is the part's sustained tensor-core rate, not a latency) and its
  fraction of the dense datasheet peak (`tracekit/data/hardware.json`);
- `fp8_over_bf16` where fp8 was measured at the same shapes: the median speed-up over those large shapes, with its
  range;
- `lowp_speedup`: for the matmul tables no model was trained on (H200's), the fp8 speed-up curve of
  `predictor.costs.physics.lowp_gemm.learn` (f against the bf16 efficiency e), which a GPU of the same architecture
  without fp8 measurements of its own takes before the curves of other architectures.

Sources (the corpus's operator-samples/): the seed paper's linear-layer samples (A100-SXM4-80GB on Perlmutter, GH200
on Vista, fp16 forward), XLA's matmul tables (H100 sm_90 bf16; B200 bf16 and fp8 e4m3 × e4m3), and the matmul rates
measured with `h200-matmul/gemm_rates.py` on an H200 (bf16; fp8 e4m3 with tensorwise scales, CUDA-event timed).
`predictor.costs.physics.achieved_rates` reads the file: the transfer path scales a compute-bound GEMM between two GPUs
by their achieved fractions, not their datasheet peaks alone.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from extractors import ett, xla_gemm
from predictor.costs.physics.lowp_gemm import learn
from tracekit.core.hardware import hardware_spec

#: Shapes of at least this many FLOPs count as large (2·4096³ / 2).
LARGE_FLOPS = 2.0 * 4096**3 / 2
SEED = "operator-samples/estimate-train-time"
SEED_FILES = {"A100-SXM4-80GB": "Perlmutter/operator/NVIDIAA100-SXM4-80GB_linear{}_fp16.csv",
              "GH200-120GB": "Vista/operator/NVIDIAGH200120GB_linear{}_fp16.csv"}
LINEARS = ("1", "2", "3", "4", "_final")
XLA = {"H100-80GB-HBM3": "operator-samples/xla-matmul/h100_sm90.csv",
       "B200-180GB": "operator-samples/xla-matmul/b200_sm100.csv"}
H200 = ("H200-141GB", "operator-samples/h200-matmul/gemm.json")
SHAPE = ["m", "n", "k", "batch"]


def _gemms(frame: pd.DataFrame) -> pd.DataFrame:
    """Forward GEMM/bmm rows with their FLOPs, one median time per (dtype, shape)."""
    frame = frame[frame["primitive"].isin(("gemm", "bmm")) & (frame["pass"] == "fwd")].copy()
    frame["batch"] = pd.to_numeric(frame["batch"], errors="coerce").fillna(1.0)
    frame = frame.groupby(["hardware", "dtype", *SHAPE], as_index=False)["duration_us"].median()
    frame["flops"] = 2.0 * frame["m"] * frame["n"] * frame["k"] * frame["batch"]
    return frame


def _h200_samples(path: Path) -> pd.DataFrame:
    """H200's matmul table as forward GEMM samples: bf16, and fp8 e4m3 with tensorwise scales (the per-tensor scaled
    GEMM of Transformer Engine's fp8 recipes) as `fp8`."""
    rows = json.loads(path.read_text())["rows"]
    keep = [r for r in rows if "us" in r and (r["dtype"] == "bf16" or r.get("scaling") == "tensorwise")]
    return pd.DataFrame({"hardware": H200[0], "primitive": "gemm", "pass": "fwd",
                         "dtype": ["bf16" if r["dtype"] == "bf16" else "fp8" for r in keep],
                         "m": [float(r["m"]) for r in keep], "n": [float(r["n"]) for r in keep],
                         "k": [float(r["k"]) for r in keep], "batch": 1.0,
                         "duration_us": [float(r["us"]) for r in keep]})


def measured(corpus: Path) -> tuple[dict[str, tuple[pd.DataFrame, str]], list[str]]:
    """hardware → (its forward GEMM rows, where they come from), and the corpus files read."""
    out: dict[str, tuple[pd.DataFrame, str]] = {}
    read: list[str] = []
    for hardware, pattern in SEED_FILES.items():
        names = [f"{SEED}/{pattern.format(n)}" for n in LINEARS]
        frame = pd.concat([ett.read_file(corpus / n) for n in names], ignore_index=True)
        out[hardware] = (_gemms(frame.assign(hardware=hardware)), f"{SEED}: the seed paper's linear-layer samples, "
                                                                   "fp16 forward")
        read += names
    for hardware, name in XLA.items():
        frame = xla_gemm.read_file(corpus / name).samples
        out[hardware] = (_gemms(frame[frame["dtype"].isin(("bf16", "fp8"))]), f"{name}: XLA's matmul table")
        read.append(name)
    out[H200[0]] = (_gemms(_h200_samples(corpus / H200[1])), f"{H200[1]}: measured with gemm_rates.py beside it "
                                                             "(CUDA events)")
    read.append(H200[1])
    return out, read


def summary(frame: pd.DataFrame, hardware: str) -> dict:
    """A GPU's entry: its large-shape bf16 rate and fraction of peak, and its fp8 speed-up where measured."""
    spec = hardware_spec(hardware)
    assert spec is not None, f"{hardware}: not in the datasheet table"
    half = frame[frame["dtype"].isin(("bf16", "fp16")) & (frame["flops"] >= LARGE_FLOPS)]
    tflops = half["flops"] / half["duration_us"] / 1e6
    entry: dict = {"bf16_large": {"shapes": int(len(half)), "tflops": round(float(tflops.median()), 1),
                                  "fraction_of_peak": round(float(tflops.median()) / spec.peak_tflops_fp16, 4),
                                  "peak_tflops": spec.peak_tflops_fp16}}
    fp8 = frame[frame["dtype"] == "fp8"]
    if len(fp8):
        both = pd.concat({"bf16": half.set_index(SHAPE)["duration_us"],
                          "fp8": fp8.set_index(SHAPE)["duration_us"]}, axis=1).dropna()
        ratio = both["bf16"] / both["fp8"]
        entry["fp8_over_bf16"] = {"shapes": int(len(ratio)), "median": round(float(ratio.median()), 3),
                                  "range": [round(float(ratio.min()), 3), round(float(ratio.max()), 3)],
                                  "datasheet": round(spec.peak_tflops_fp8 / spec.peak_tflops_fp16, 3)}
    return entry


def fit(corpus: Path) -> tuple[dict, list[str], list[str]]:
    """(the document `tracekit/data/gemm_rates.json` holds, lines that report it, corpus files read)."""
    tables, read = measured(corpus)
    gpus = {}
    for hardware, (frame, source) in sorted(tables.items()):
        gpus[hardware] = {"source": source, **summary(frame, hardware)}
    samples = _h200_samples(corpus / H200[1])
    doc = {"format": "tracekit-gemm-rates/1", "by": "make profiles (tools/fit_gemm_rates.py)",
           "large_flops": LARGE_FLOPS, "gpus": gpus, "lowp_speedup": learn(samples)}
    lines = [f"{hw}: bf16 {e['bf16_large']['tflops']:.0f} TFLOP/s at large shapes, "
             f"{100 * e['bf16_large']['fraction_of_peak']:.1f}% of {e['bf16_large']['peak_tflops']:g}"
             + (f"; fp8 ×{e['fp8_over_bf16']['median']:.2f} (datasheet ×{e['fp8_over_bf16']['datasheet']:g})"
                if "fp8_over_bf16" in e else "") for hw, e in gpus.items()]
    return doc, lines, read

