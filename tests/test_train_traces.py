"""Training on samples ingested from a real Kineto trace (not the clean published sets): `other` is not learned,
groups whose kernels carry no shapes are reported as not trained, and evaluate's JSON stays strict."""
from __future__ import annotations

import json

import pandas as pd
from typer.testing import CliRunner

from tests.conftest import KINETO
from tracekit.cli import app
from tracekit.core.store import SampleStore

TRACE = KINETO / "hta" / "nccl_parser_config_nccl_data.json.gz"  # A100 DDP step, most kernels without shapes
runner = CliRunner()


def _strict(text: str):
    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def test_train_and_evaluate_on_an_ingested_trace(tmp_path):
    store = tmp_path / "store"
    assert runner.invoke(app, ["ingest", str(TRACE), "--store", str(store)]).exit_code == 0
    samples = SampleStore(store).read()
    assert (samples["primitive"] == "other").any()
    out = tmp_path / "models"
    result = runner.invoke(app, ["train", "--store", str(store), "--models-out", str(out), "--folds", "3", "--json"])
    assert result.exit_code == 0, result.output
    doc = _strict(result.stdout)
    trained = {(m["primitive"], m["pass"]) for m in doc["models"]}
    skipped = {(s["primitive"], s["pass"]) for s in doc["skipped"]}
    assert not any(p == "other" for p, _ in trained | skipped)
    shaped = samples[samples["primitive"] != "other"]
    feature_cols = ["m", "n", "k", "rows", "width", "numel", "bytes", "params", "seq"]
    has_shape = shaped[feature_cols].notna().any(axis=1)
    for (prim, pass_), group in shaped.groupby(["primitive", "pass"]):
        if not has_shape[group.index].any():
            assert (prim, pass_) in skipped and (prim, pass_) not in trained
    assert trained, "the collectives of this trace carry bytes and group size"

    evaluated = runner.invoke(app, ["evaluate", "--models", str(out), "--store", str(store), "--json"])
    assert evaluated.exit_code == 0, evaluated.output
    entries = _strict(evaluated.stdout)["models"]
    assert sum(e["n"] for e in entries) == len(shaped)


def test_rows_without_shapes_do_not_blur_a_shaped_model(tmp_path):
    """A shaped set plus rows that only carry a duration (as CPU autograd nodes do): the shapeless rows are set
    aside and reported, and the model is the one the shaped rows alone give."""
    import numpy as np

    from extractors import ett
    from predictor.costs.learned.models import ModelSet
    from predictor.costs.learned.training import train_models
    from tests.conftest import SAMPLES

    shaped = ett.read_file(SAMPLES / "estimate-train-time" / "Perlmutter" / "operator"
                           / "NVIDIAA100-SXM4-80GB_linear1_fp16.csv")
    shaped = shaped[shaped["pass"] == "fwd"].head(200)
    blurred = shaped.head(60).assign(m=np.nan, n=np.nan, k=np.nan, batch=np.nan,
                                     duration_us=shaped.head(60)["duration_us"] * 50)
    clean = train_models(shaped, tmp_path / "clean", folds=3)
    mixed = train_models(pd.concat([shaped, blurred], ignore_index=True), tmp_path / "mixed", folds=3)
    assert [m["samples"] for m in mixed] == [m["samples"] for m in clean] == [len(shaped)]
    index = json.loads((tmp_path / "mixed" / "index.json").read_text())
    assert [(s["primitive"], s["pass"], s["rows"]) for s in index["skipped"]] == [("gemm", "fwd", 60)]
    ask = shaped.tail(20)
    np.testing.assert_allclose(ModelSet.load(tmp_path / "mixed").predict(ask)["duration_us"],
                               ModelSet.load(tmp_path / "clean").predict(ask)["duration_us"], rtol=1e-9)
