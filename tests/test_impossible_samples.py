"""Samples that cannot be real: tensor-core rows timed faster than their FLOPs at the part's dense peak
(predictor.costs.learned.regressor.faster_than_peak), on the seed paper's published flash-attention samples."""
from __future__ import annotations

import json

import numpy as np

from extractors.ett import read_file
from predictor.costs.features import compute_work
from predictor.costs.learned.regressor import PEAK_SLACK, faster_than_peak, flag_outliers
from predictor.costs.learned.training import train_models
from tests.conftest import CORPUS
from tracekit.core.hardware import hardware_spec

ETT = CORPUS / "operator-samples" / "estimate-train-time"
GH200 = ETT / "Vista" / "operator" / "NVIDIAGH200120GB_flash_atten_fp16.csv"
A100 = ETT / "Perlmutter" / "operator" / "NVIDIAA100-SXM4-80GB_flash_atten_fp16.csv"


def test_the_gh200_flash_attention_backward_is_beyond_the_peak_and_the_a100s_is_not():
    gh, a100 = read_file(GH200), read_file(A100)
    for frame, broken in ((gh, True), (a100, False)):
        bwd = frame[frame["pass"] == "bwd"]
        flagged = faster_than_peak(bwd, "attention")
        # by hand: FLOPs / (fp16 dense peak) is the least time any row can take
        spec = hardware_spec(str(bwd["hardware"].iloc[0]))
        assert spec is not None
        least_us = compute_work(bwd)[0] / (spec.peak_tflops("fp16") * 1e12) * 1e6
        expected = least_us > PEAK_SLACK * bwd["duration_us"].to_numpy()
        assert (flagged == expected).all()
        assert (flagged.mean() > 0.5) == broken
        fwd = frame[frame["pass"] == "fwd"]
        assert not faster_than_peak(fwd, "attention").any()  # every forward row is possible on both parts


def test_a_set_mostly_beyond_the_peak_is_set_aside_whole_and_named_in_the_index(tmp_path):
    frame = read_file(GH200)
    beyond = faster_than_peak(frame[frame["pass"] == "bwd"], "attention")
    drop, report = flag_outliers(np.zeros(len(beyond)), np.zeros(len(beyond), dtype=bool), beyond)
    assert drop.all() and report["impossible"] == len(beyond)
    train_models(frame, tmp_path / "models", folds=2)
    index = json.loads((tmp_path / "models" / "index.json").read_text())
    assert [(m["primitive"], m["pass"]) for m in index["models"]] == [("attention", "fwd")]
    skipped = [s for s in index["skipped"] if s["pass"] == "bwd"]
    assert len(skipped) == 1 and skipped[0]["rows"] == len(beyond) and "impossible" in skipped[0]["reason"]
