"""How the fp8 speed-up over bf16 depends on the GEMM's shape, in the measured tables and in H100's bounded estimate
(issue #24 item 3, issue #21's H100 fp8 rows of the Megatron-Bridge table).

1. The tables that measured bf16 and fp8 with one harness (XLA's B200 table; the openxla H100 section, whose fp8 rows
   tracekit refuses: `extractors.tables.implausible_lowp`): per table and dtype, the least-squares fit
   t = t_fixed + FLOPs / rate (relative error), and the fp8 rows predicted from the same table's bf16 rows with the
   datasheet peak ratio applied to all but the bf16 fit's fixed part, t8 = t_fixed + (t16 − t_fixed) / R:
   how much of the speed-up's shape dependence a fixed cost that does not shrink with the dtype explains.
2. Where the H100 "fp8" rows sit: their time against B200's fp8 rows and H100's bf16 rows of the same shape, per
   FLOP decade (a part faster than H100's dense fp8 peak on the large shapes, tracking B200's fp8 and not H100's).
3. tracekit's H100 estimates (the bundled set) for the GEMMs of the Bridge table's H100 fp8 models (Llama 3 8B,
   70B at TP 4, Qwen3-30B-A3B's attention and grouped experts): bf16 and fp8 time, fp8/bf16 speed-up and the share
   of the dense peak, forward and whole backward.

Run: python benchmarks/lowp_shape.py [--json out.json]   (about 30 s)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from predictor.costs.learned.models import ModelSet  # noqa: E402
from tracekit.core.hardware import hardware_spec  # noqa: E402

TABLES = ROOT.parent / "shared" / "corpus" / "operator-samples" / "xla-matmul"
KEYS = {"bf16": "bf16xbf16->bf16", "fp8": "f8e4m3fnxf8e4m3fn->bf16"}
#: (name, m, n, k, batch): the Bridge table's H100 fp8 GEMMs per micro-batch (tokens × out × in).
SHAPES = [("Llama 3 8B qkv", 8192, 6144, 4096, 1), ("Llama 3 8B fc1", 8192, 28672, 4096, 1),
          ("Llama 3 8B fc2", 8192, 4096, 14336, 1), ("Llama 3 70B TP4 qkv", 8192, 2560, 8192, 1),
          ("Llama 3 70B TP4 fc1", 8192, 14336, 8192, 1), ("Llama 3 70B TP4 fc2", 8192, 8192, 7168, 1),
          ("Qwen3-30B-A3B qkv", 4096, 5120, 2048, 1), ("Qwen3 experts fc1 ×8", 4096, 1536, 2048, 8),
          ("Qwen3 experts fc2 ×8", 4096, 2048, 768, 8)]


def _table(name: str) -> pd.DataFrame:
    frame = pd.read_csv(TABLES / name)
    frame = frame[frame["dtype_key"].isin(KEYS.values())]
    wide = frame.pivot_table(index=["b", "m", "n", "k"], columns="dtype_key", values="time_us")
    wide = wide.rename(columns={v: k for k, v in KEYS.items()})
    wide["flops"] = [2.0 * b * m * n * k for b, m, n, k in wide.index]
    return wide


def _fixed_rate(flops: np.ndarray, us: np.ndarray) -> tuple[float, float]:
    """(t_fixed µs, rate TFLOP/s) of t = t_fixed + FLOPs / rate, least squares on the relative error."""
    design = np.c_[np.ones_like(flops), flops] / us[:, None]
    (fixed, inverse), *_ = np.linalg.lstsq(design, np.ones_like(us), rcond=None)
    return float(fixed), float(1.0 / inverse / 1e6)


def fixed_part(hardware: str, name: str) -> list[dict]:
    wide = _table(name)
    spec = hardware_spec(hardware)
    assert spec is not None
    ratio = spec.peak_tflops("fp8") / spec.peak_tflops("bf16")
    out = []
    fits = {d: _fixed_rate(wide["flops"].to_numpy(), wide[d].to_numpy()) for d in KEYS}
    fixed16 = fits["bf16"][0]
    t16, t8 = wide["bf16"].to_numpy(), wide["fp8"].to_numpy()
    kept = np.clip(fixed16 + (t16 - fixed16) / ratio, wide["flops"].to_numpy() / (spec.peak_tflops("fp8") * 1e6), t16)
    big = wide["flops"].to_numpy() >= 1e11
    for dtype, (fixed, rate) in fits.items():
        out.append({"table": name, "dtype": dtype, "t_fixed_us": round(fixed, 2), "rate_tflops": round(rate),
                    "share_of_dense_peak": round(rate / spec.peak_tflops(dtype), 3)})
    out.append({"table": name, "dtype": "fp8 from bf16 (fixed part kept, datasheet ratio)",
                "mdape": round(float(np.median(np.abs(kept / t8 - 1))), 3),
                "median_pred_over_measured": round(float(np.median(kept / t8)), 3),
                "mdape_flops_ge_1e11": round(float(np.median(np.abs(kept[big] / t8[big] - 1))), 3)})
    return out


def h100_fp8_rows() -> list[dict]:
    h100, b200 = _table("h100_sm90_openxla.csv"), _table("b200_sm100.csv")
    out = []
    for lo, hi in ((1e6, 1e9), (1e9, 1e10), (1e10, 1e12)):
        rows = (h100["flops"] >= lo) & (h100["flops"] < hi)
        out.append({"flops": f"{lo:.0e}–{hi:.0e}", "shapes": int(rows.sum()),
                    "h100_fp8_over_b200_fp8": round(float((h100["fp8"] / b200["fp8"])[rows].median()), 2),
                    "h100_bf16_over_b200_bf16": round(float((h100["bf16"] / b200["bf16"])[rows].median()), 2),
                    "h100_fp8_speedup_over_its_bf16": round(float((h100["bf16"] / h100["fp8"])[rows].median()), 2)})
    peak = hardware_spec("H100-80GB-HBM3").peak_tflops("fp8")  # type: ignore[union-attr]
    above = int((h100["flops"] / h100["fp8"] / 1e6 > peak).sum())
    out.append({"flops": "all", "shapes": len(h100), "fp8_rows_above_h100_dense_fp8_peak": above})
    return out


def h100_estimates(models: ModelSet) -> list[dict]:
    spec = hardware_spec("H100-80GB-HBM3")
    assert spec is not None
    rows = []
    for name, m, n, k, batch in SHAPES:
        for pass_ in ("fwd", "bwd"):
            rows.append({"name": name, "hardware": "H100-80GB-HBM3", "primitive": "gemm", "pass": pass_,
                         "m": float(m), "n": float(n), "k": float(k), "batch": float(batch)})
    frame = pd.DataFrame(rows)
    shape = frame.drop(columns="name")
    half = models.predict(shape.assign(dtype="bf16"))["duration_us"].to_numpy()
    low = models.predict(shape.assign(dtype="fp8"))
    flops = (2.0 * frame["m"] * frame["n"] * frame["k"] * frame["batch"]
             * np.where(frame["pass"] == "bwd", 2.0, 1.0)).to_numpy()
    us = low["duration_us"].to_numpy()
    return [{"gemm": r["name"], "pass": r["pass"], "bf16_us": round(float(h), 1), "fp8_us": round(float(t), 1),
             "speedup": round(float(h / t), 3),
             "bf16_share_of_peak": round(float(f / h / 1e6 / spec.peak_tflops_fp16), 3),
             "fp8_share_of_peak": round(float(f / t / 1e6 / spec.peak_tflops("fp8")), 3), "path": p}
            for r, h, t, f, p in zip(rows, half, us, flops, low["path"])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the three tables here")
    args = parser.parse_args()
    result = {"fixed_part": fixed_part("B200-180GB", "b200_sm100.csv") + fixed_part("H100-80GB-HBM3",
                                                                                       "h100_sm90_openxla.csv"),
              "h100_fp8_table": h100_fp8_rows(), "h100_estimates": h100_estimates(ModelSet.load())}
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        for key, table in result.items():
            print(f"== {key}")
            print(pd.DataFrame(table).to_string(index=False))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
