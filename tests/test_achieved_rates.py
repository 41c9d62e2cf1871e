"""What a GPU's GEMMs achieve is hardware data (#35 item 4, #36 item 3): `tracekit/data/gemm_rates.json`, made from
the corpus's matmul tables by `make profiles`, and used where a GPU is predicted from others' models.

Facts are recomputed here from the corpus files themselves (XLA's H100 table, H200's matmul table, the seed paper's
GH200 linear samples): the shipped fractions must be theirs, and a GEMM moved between two GPUs of one die must take
the ratio of what each was measured to achieve."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from extractors import ett
from predictor.costs.learned.models import ModelSet
from predictor.costs.physics import achieved_rates
from tests.conftest import SAMPLES

LARGE = 2.0 * 4096**3 / 2  # FLOPs of the shapes the fraction is taken over
PEAK_HOPPER = 989.0  # dense bf16 TFLOP/s of H100 SXM, H200 and GH200 (datasheets)


@pytest.fixture(scope="module")
def models() -> ModelSet:
    return ModelSet.load()


def h100_table() -> float:
    """H100's median bf16 TFLOP/s over the large shapes of XLA's table."""
    t = pd.read_csv(SAMPLES / "xla-matmul" / "h100_sm90.csv")
    t = t[t["dtype_key"] == "bf16xbf16->bf16"]
    flops = 2.0 * t["b"] * t["m"] * t["n"] * t["k"]
    return float(np.median(t.loc[flops >= LARGE, "tflops"]))


def h200_table() -> tuple[float, pd.DataFrame]:
    """H200's median bf16 TFLOP/s over the large shapes of its matmul table, and its rows."""
    rows = pd.DataFrame([r for r in json.loads((SAMPLES / "h200-matmul" / "gemm.json").read_text())["rows"]
                         if "us" in r])
    bf16 = rows[rows["dtype"] == "bf16"]
    return float(np.median(bf16.loc[2.0 * bf16["m"] * bf16["n"] * bf16["k"] >= LARGE, "tflops"])), rows


def gh200_samples() -> float:
    """GH200's median fp16 TFLOP/s over the large forward shapes of the seed paper's linear-layer samples."""
    root = SAMPLES / "estimate-train-time" / "Vista" / "operator"
    frame = pd.concat([ett.read_file(p) for p in sorted(root.glob("NVIDIAGH200120GB_linear*_fp16.csv"))])
    frame = frame[frame["pass"] == "fwd"]
    median = frame.groupby(["m", "n", "k"])["duration_us"].median().reset_index()
    flops = 2.0 * median["m"] * median["n"] * median["k"]
    return float(np.median((flops / median["duration_us"] / 1e6)[flops >= LARGE]))


def test_the_shipped_fractions_are_the_corpus_tables_own(corpus):
    assert achieved_rates.fraction("H100-80GB-HBM3") == pytest.approx(h100_table() / PEAK_HOPPER, rel=2e-3)
    assert achieved_rates.fraction("H200-141GB") == pytest.approx(h200_table()[0] / PEAK_HOPPER, rel=2e-3)
    assert achieved_rates.fraction("GH200-120GB") == pytest.approx(gh200_samples() / PEAK_HOPPER, rel=2e-3)
    # a part never measured takes its GPU family's (the parts that share models): GB200's GPU is a B200
    assert achieved_rates.fraction("GB200-186GB") == achieved_rates.fraction("B200-180GB")
    assert achieved_rates.fraction("B300-288GB") is None  # never measured, no measured part of its family
    assert achieved_rates.fraction("H800-80GB-HBM3") is None  # one die with H100, but another part
    for f in achieved_rates.measured_fractions().values():
        assert 0.3 < f < 1.0  # below the datasheet peak, as every measured GEMM is


def test_a_gemm_moved_between_two_parts_of_one_die_takes_the_ratio_of_their_measured_rates(models, corpus):
    """One source GPU (GH200's models): a compute-bound bf16 GEMM backward on H100 and on H200 — one die, the same
    peaks, SMs and clock, another HBM — differs by what the two were measured to achieve, nothing else; with H200
    left out (leave-one-GPU-out), no H200 was measured: it takes GH200's datasheet scaling alone, not another part
    of its die's rate (GH200 ran at 81% of the peak, H100 at 76%, H200 at 68.5%)."""
    gh200 = ModelSet(models.path, models.index, [m for m in models.models if m.hardware == "GH200-120GB"])
    frame = pd.DataFrame([{"hardware": hw, "primitive": "gemm", "pass": "bwd", "dtype": "bf16", "variant": None,
                           "m": 8192.0, "n": 8192.0, "k": 8192.0, "batch": 1.0}
                          for hw in ("H100-80GB-HBM3", "H200-141GB")])
    out = gh200.predict(frame)
    assert list(out["path"]) == ["transfer", "transfer"]
    h100, h200 = out["duration_us"]
    assert h200 / h100 == pytest.approx(h100_table() / h200_table()[0], rel=2e-3)  # H200 ran slower: 68% vs 76%
    h100_out, h200_out = gh200.without("H200-141GB").predict(frame)["duration_us"]
    assert h100_out == pytest.approx(h100)
    assert h200_out / h100_out == pytest.approx(h100_table() / gh200_samples(), rel=2e-3)


def test_hopper_fp8_gemms_gain_what_the_h200_table_measured_not_the_datasheet(models, corpus):
    """H100 has no fp8 model: its fp8 GEMMs are its bf16 estimates at a learned speed-up. The curve of its own
    architecture comes from H200's measured table (one die), ~1.7–1.8× at large transformer shapes; without it
    (H200 left out) the only fp8 curve is Blackwell's, near the datasheet's 2×."""
    frame = pd.DataFrame([{"hardware": "H100-80GB-HBM3", "primitive": "gemm", "pass": "fwd", "dtype": dtype,
                           "variant": None, "m": 8192.0, "n": 8192.0, "k": 8192.0, "batch": 1.0}
                          for dtype in ("bf16", "fp8")])
    bf16, fp8 = models.predict(frame)["duration_us"]
    _, rows = h200_table()
    pairs = rows[rows["scaling"].isin([None, "tensorwise"]) | rows["scaling"].isna()]
    both = pairs.pivot_table(index=["m", "n", "k"], columns="dtype", values="us").dropna()
    large = both[2.0 * np.prod(np.array(both.index.tolist()), axis=1) >= LARGE]
    measured = large["bf16"] / large["fp8_e4m3"]
    assert measured.min() <= bf16 / fp8 <= measured.quantile(0.9)
    assert bf16 / fp8 < 1.9
    bf16_out, fp8_out = models.without("H200-141GB").predict(frame)["duration_us"]
    assert bf16_out / fp8_out > 1.9
