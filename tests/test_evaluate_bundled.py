"""The bundled default models: what `tracekit models` lists (checked against the corpus files they came from) and
that they load and answer real measurements on a fresh install, with no training step."""
from __future__ import annotations

import csv
import json

import pandas as pd
from typer.testing import CliRunner

from predictor.costs.learned.models import ModelSet, bundled_models_dir
from tests.conftest import SAMPLES
from tracekit.cli import app

runner = CliRunner()


def test_models_command_lists_the_bundled_set_and_its_data():
    result = runner.invoke(app, ["models", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {m["hardware"] for m in doc["models"]} == {"A100-SXM4-80GB", "GH200-120GB", "A100-SXM4-40GB",
                                                     "H100-80GB-HBM3", "B200-180GB", "MI300X", "MI355X",
                                                     "H200-141GB"}
    corpus_files = {p.name for p in (SAMPLES / "estimate-train-time").rglob("*_fp16*.csv")} | \
        {p.name for p in (SAMPLES / "vtrain-allreduce" / "a100").glob("*.csv")}
    sources = {s["path"] for s in doc["provenance"]["sources"]}
    assert sources == corpus_files
    assert any("estimate-train-time" in line for line in doc["provenance"]["data"])
    # the published tables' GPUs (#24), added as an update: their files and where each came from
    table_files = {p.name for p in (SAMPLES / "xla-matmul").glob("*.csv")} | {"h100_sm90.csv"} | \
        {p.name for p in (SAMPLES / "rocm-aiter").glob("*gemm*.csv")}
    # then the GH200 models retrained with the tensor-core peak rule (#24), then H200's from its samples (#35)
    update, retrained, h200 = doc["updates"]
    assert {s["path"] for s in update["provenance"]["sources"]} == table_files
    assert all(s["kind"].startswith("import:") and s.get("origin") or s["kind"] == "import:aiter-gemm"
               for s in update["provenance"]["sources"])
    assert retrained["hardware"] == ["GH200-120GB"]
    assert {s["path"] for s in retrained["provenance"]["sources"]} == \
        {f for f in corpus_files if f.startswith("NVIDIAGH200120GB")}
    assert not any(m["hardware"] == "GH200-120GB" and m["primitive"] == "attention" and m["pass"] == "bwd"
                   for m in doc["models"])  # its samples are beyond the peak (tests/test_impossible_samples.py)
    h200_store = json.loads((SAMPLES / "h200-tracekit-sample" / "store" / "sources.json").read_text())
    assert h200["hardware"] == ["H200-141GB"]
    assert {s["id"] for s in h200["provenance"]["sources"]} == set(h200_store)
    assert {meta["hardware"] for meta in h200_store.values()} == {"H200"}  # the store's id, read as H200-141GB
    assert doc["clusters"]["H100-80GB-HBM3"] == "dgx-h100"
    sampled = {meta["path"] for meta in h200_store.values()}
    for model in doc["models"]:
        assert model["samples"] > 0 and model["cv_mape"] is not None
        assert set(model["sources"]) <= corpus_files | table_files | (sampled if model["hardware"] == "H200-141GB"
                                                                      else set())
    size = sum(p.stat().st_size for p in bundled_models_dir().iterdir())
    assert size < 8 * 2**20  # small enough to ship in the wheel
    assert not list(bundled_models_dir().glob("*.pkl"))


def test_bundled_models_answer_vtrain_all_reduce_measurements():
    with open(SAMPLES / "vtrain-allreduce" / "a100" / "AR_GPU8_1M_1024M_LUT.csv", newline="") as handle:
        rows = list(csv.reader(handle))[1:]
    ops = pd.DataFrame({"hardware": "A100-SXM4-40GB", "primitive": "all_reduce", "pass": "comm", "dtype": "fp32",
                        "variant": None, "bytes": [float(r[0]) for r in rows], "group_size": 8.0,
                        "ranks_per_node": 8.0, "nodes": 1.0})
    out = ModelSet.load().predict(ops)
    measured = pd.Series([float(r[3]) / 1000 for r in rows])
    ape = (out["duration_us"] - measured).abs() / measured
    assert (out["path"] == "model").all() and not out["out_of_range"].any()
    assert ape.mean() < 0.03  # these rows are in the bundled training data: the shipped model reproduces them
