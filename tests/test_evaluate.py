"""`tracekit evaluate`: models trained on part of a real sample file, evaluated on the whole file; the JSON schema,
counts per group, and out-of-range counts checked against the raw rows."""
from __future__ import annotations

import csv
import json
import shutil

import pytest
from typer.testing import CliRunner

from extractors import ett
from predictor.costs.learned.training import train_models
from tests.conftest import SAMPLES
from tracekit.cli import app

FILE = SAMPLES / "estimate-train-time" / "Perlmutter" / "operator" / "NVIDIAA100-SXM4-80GB_layernorm_fp16.csv"
runner = CliRunner()
MAX_DIM = 4096


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    frame = ett.read_file(FILE)
    out = tmp_path_factory.mktemp("eval") / "models"
    train_models(frame[frame["width"] <= MAX_DIM], out, {}, folds=3)
    return out


def test_evaluate_json_counts_and_ranges(models, tmp_path):
    src = tmp_path / "ett"
    src.mkdir()
    shutil.copy(FILE, src)
    result = runner.invoke(app, ["evaluate", "--models", str(models), str(src), "--format", "ett", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert list(doc) == ["models"]
    with open(FILE, newline="") as handle:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(handle)]
    trained = [r for r in rows if r["dim"] <= MAX_DIM]
    lb = [r["l"] * r["b"] for r in trained]
    numel = [r["l"] * r["b"] * r["dim"] for r in trained]
    outside = sum(r["dim"] > MAX_DIM or not min(lb) <= r["l"] * r["b"] <= max(lb)
                  or not min(numel) <= r["l"] * r["b"] * r["dim"] <= max(numel) for r in rows)
    assert outside > 0
    assert [(m["pass"], m["variant"]) for m in doc["models"]] == [("bwd", "layernorm"), ("fwd", "layernorm")]
    for entry in doc["models"]:
        assert list(entry) == ["hardware", "primitive", "pass", "variant", "n", "mape", "median_ape", "p90_ape",
                               "out_of_range", "paths", "sources"]
        assert entry["paths"] == {"model": len(rows)} and entry["sources"] == []
        assert entry["hardware"] == "A100-SXM4-80GB" and entry["primitive"] == "norm"
        assert entry["n"] == len(rows)
        assert entry["out_of_range"] == outside
        assert 0 < entry["median_ape"] <= entry["p90_ape"] and entry["mape"] < 0.5


def test_evaluate_from_a_store_and_table(models, tmp_path):
    store = tmp_path / "store"
    imported = runner.invoke(app, ["import", str(FILE), "--format", "ett", "--store", str(store)])
    assert imported.exit_code == 0
    result = runner.invoke(app, ["evaluate", "--models", str(models), "--store", str(store)],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "layernorm" in result.stdout and "model" in result.stdout


def test_evaluate_errors(tmp_path):
    missing = runner.invoke(app, ["evaluate", "--models", str(tmp_path / "none"), str(FILE), "--format", "ett"])
    assert missing.exit_code == 2 and "not a model directory" in missing.stderr
    empty = runner.invoke(app, ["evaluate", "--store", str(tmp_path / "empty-store")])
    assert empty.exit_code == 2 and "no samples to evaluate on" in empty.stderr


def test_evaluate_a_kineto_trace_without_models_for_its_gpu():
    """An H100 trace against the bundled models (no H100 model covers its shapes): every estimate flagged."""
    from tests.conftest import KINETO

    trace = KINETO / "tracelens" / "h100__gaunernst_bert-small-uncased__1016001.json.gz"
    result = runner.invoke(app, ["evaluate", str(trace), "--format", "kineto", "--json"])
    assert result.exit_code == 0, result.output
    entries = json.loads(result.stdout)["models"]
    assert entries and {e["hardware"] for e in entries} == {"H100-80GB-HBM3"}
    assert all(e["out_of_range"] == e["n"] for e in entries)
    gemm = [e for e in entries if e["primitive"] == "gemm"]
    assert gemm and all(e["mape"] is not None for e in gemm)


def test_evaluate_counts_each_row_once_by_the_path_that_answered_it():
    """The MI300X ResNet trace holds GEMM kernels without an op or shapes (their launches are not in the trace):
    they are `no estimate`, not also counted under the path that could not size them."""
    from tests.conftest import KINETO

    trace = KINETO / "tracelens" / "mi300__resnet_act_checkpoint.json.gz"
    result = runner.invoke(app, ["evaluate", str(trace), "--format", "kineto", "--json"])
    assert result.exit_code == 0, result.output
    entries = json.loads(result.stdout)["models"]
    assert all(sum(e["paths"].values()) == e["n"] for e in entries)
    unshaped = [e for e in entries if e["primitive"] == "gemm" and not e["variant"]]
    assert unshaped and all(e["paths"] == {"no estimate": e["n"]} and e["mape"] is None for e in unshaped)
