"""`tracekit train --update`: a GPU's models added to an existing set (the way the bundled set gained H100, B200 and
the AMD parts), the other GPUs' models kept byte for byte; `--in-range-only` models of a table answer inside its
grid only; `tracekit models` says where each GPU's samples came from."""
from __future__ import annotations

import json

import pandas as pd
from typer.testing import CliRunner

from extractors import ett
from predictor.costs.learned.models import ModelSet
from predictor.costs.learned.training import train_models
from tests.conftest import SAMPLES
from tracekit.cli import app

runner = CliRunner()
LINEAR1 = SAMPLES / "estimate-train-time" / "Perlmutter" / "operator" / "NVIDIAA100-SXM4-80GB_linear1_fp16.csv"
H100 = SAMPLES / "xla-matmul" / "h100_sm90.csv"


def test_update_adds_a_gpu_and_keeps_the_others_byte_for_byte(tmp_path):
    out = tmp_path / "set"
    a100 = ett.read_file(LINEAR1)
    train_models(a100[a100["pass"] == "fwd"], out, {"data": ["A100 linear1"]}, folds=2)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.name != "index.json"}
    store = tmp_path / "store"
    result = runner.invoke(app, ["import", str(H100), "--format", "xla-gemm", "--store", str(store)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["train", "--store", str(store), "--models-out", str(out), "--update",
                                 "--in-range-only", "--folds", "2", "--data", "XLA H100", "--json"])
    assert result.exit_code == 0, result.output
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    assert all(after[name] == data for name, data in before.items())  # the A100 models, unchanged
    index = json.loads(after["index.json"])
    assert index["provenance"]["data"] == ["A100 linear1"] and index["updates"][0]["hardware"] == ["H100-80GB-HBM3"]
    assert {m["hardware"] for m in index["models"]} == {"A100-SXM4-80GB", "H100-80GB-HBM3"}
    models = ModelSet.load(out)
    h100 = [m for m in models.models if m.hardware == "H100-80GB-HBM3"]
    assert {(m.primitive, m.group) for m in h100} == {("gemm", "*"), ("gemm", "tf32"), ("bmm", "*"), ("bmm", "tf32")}
    assert all(m.meta["extrapolates"] is False and m.meta["dtypes"] for m in h100)

    shapes = pd.DataFrame({"hardware": "H100-80GB-HBM3", "primitive": "gemm", "pass": "fwd", "dtype": "bf16",
                           "m": [4096.0, 16384.0], "n": 4096.0, "k": 4096.0, "batch": 1.0})
    answer = models.predict(shapes)
    assert answer["path"].tolist() == ["model", "model"]
    # beyond the table's 4096 edge the H100 table answers at its edge's efficiency: a compute-bound GEMM with four
    # times the FLOPs takes nearly four times as long, less the fixed launch cost (not A100's efficiency carried
    # over by the transfer)
    assert 3.8 < answer["duration_us"].iloc[1] / answer["duration_us"].iloc[0] <= 4.0

    listed = runner.invoke(app, ["models", "--models", str(out), "--json"])
    assert listed.exit_code == 0, listed.output
    files = json.loads(listed.stdout)["samples_from"]["H100-80GB-HBM3"]
    assert files[0]["path"] == "h100_sm90.csv" and files[0]["kind"] == "import:xla-gemm"
    assert any("tensorflow/tensorflow" in origin for origin in files[0]["origin"])
    assert "kernel" in files[0]["unknown"]


def test_update_needs_a_set_to_update(tmp_path):
    store = tmp_path / "store"
    runner.invoke(app, ["import", str(H100), "--format", "xla-gemm", "--store", str(store)])
    result = runner.invoke(app, ["train", "--store", str(store), "--models-out", str(tmp_path / "none"), "--update"])
    assert result.exit_code == 2 and "no model set to update" in result.stderr
