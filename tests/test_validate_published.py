"""`tracekit validate --published`: a real sample of the corpus e2e file, measured values and error arithmetic
checked independently of the code under test."""
from __future__ import annotations

import csv
import dataclasses
import json
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import E2E, SAMPLES
from tracekit.cli import app

SOURCE = E2E / "vtrain_a100_single_node.csv"
#: Data rows (1-based) picked to span 2–8 GPUs and different TP/PP/DP splits.
PICK = (1, 2, 3, 10, 40, 200, 500)


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> tuple[Path, list[dict]]:
    with SOURCE.open(newline="") as handle:
        reader = csv.DictReader(handle)
        records = list(reader)
        fields = reader.fieldnames
    picked = [records[i - 1] for i in PICK]
    path = tmp_path_factory.mktemp("published") / "sample.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(picked)
    return path, picked


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    """A small real model set: the forward QKV-projection GEMM of the seed paper's A100 samples."""
    from extractors.ett import read_file
    from predictor.costs.learned.training import train_models

    samples = read_file(SAMPLES / "estimate-train-time" / "Perlmutter" / "operator" /
                        "NVIDIAA100-SXM4-80GB_linear1_fp16.csv")
    out = tmp_path_factory.mktemp("published-models") / "models"
    train_models(samples[samples["pass"] == "fwd"], out, folds=2)
    return out


@pytest.fixture(scope="module")
def models(models_dir):
    from predictor.costs.learned.models import ModelSet

    return ModelSet.load(models_dir)


def test_published_rows_errors_and_order(sample, models):
    from predictor.predict import predict
    from tracekit.core.cluster import preset
    from tracekit.core.config import TrainingConfig
    from tracekit.core.stacks import get_stack
    from tracekit.validate import validate_published

    path, picked = sample
    result = validate_published(path, {"A100": "A100-SXM4-40GB"}, models)
    assert len(result["rows"]) == len(picked) and not result["failed"]
    # measured values are the file's, row by row (the first picked row is 0.37216 s in the source)
    by_row = {r["line"] - 1: r for r in result["rows"]}  # the header is line 1
    assert by_row[1]["measured_s"] == 0.37216
    for i, record in enumerate(picked, start=1):
        assert by_row[i]["measured_s"] == float(record["iteration_time_s"])
        assert (by_row[i]["tp"], by_row[i]["pp"], by_row[i]["dp"]) == (
            int(record["tp"]), int(record["pp"]), int(record["dp"]))
    # each prediction is what the predictor says for that row's configuration on the mapped hardware
    record = picked[2]
    config = TrainingConfig.from_mapping({
        # the row's framework, Megatron-DeepSpeed: its stack's settings (unfused attention, the pipeline's
        # hand-overs as tensor-parallel shares, no result checks, ...)
        **get_stack("megatron-deepspeed-2023").config,
        "num_layers": record["num_layers"], "hidden_size": record["hidden_size"],
        "ffn_hidden_size": record["ffn_hidden_size"], "num_attention_heads": record["num_attention_heads"],
        "seq_length": record["seq_length"], "vocab_size": record["vocab_size"],
        "global_batch_size": record["global_batch_size"], "micro_batch_size": record["micro_batch_size"],
        "tensor_model_parallel_size": record["tp"], "pipeline_model_parallel_size": record["pp"],
        "data_parallel_size": record["dp"], "recompute_granularity": "full", "precision": "fp16",
    })
    assert config.attention == "unfused"  # Megatron-DeepSpeed has no flash attention
    # the row's stack profile brings its host constants; its interconnect text states an 800 Gb/s network
    cluster = dataclasses.replace(preset("dgx-a100", "A100-SXM4-40GB"), inter_node_gbs=800 / 8 / 8,
                                  name="dgx-a100+stated-network")
    stack = get_stack("megatron-deepspeed-2023").calibration()
    direct = predict(config, cluster, models, stack).iteration_time_s
    assert by_row[3]["predicted_s"] == pytest.approx(direct, rel=1e-12)
    # error arithmetic, recomputed by hand from the file's measured values and the reported predictions
    apes = [abs(by_row[i]["predicted_s"] - float(r["iteration_time_s"])) / float(r["iteration_time_s"])
            for i, r in enumerate(picked, start=1)]
    assert result["mape"] == pytest.approx(sum(apes) / len(apes), rel=1e-12)
    assert result["median_ape"] == pytest.approx(statistics.median(apes), rel=1e-12)
    ordered = sorted(apes)
    position = 0.9 * (len(ordered) - 1)  # linear interpolation between closest ranks
    low = int(position)
    p90 = ordered[low] + (ordered[min(low + 1, len(ordered) - 1)] - ordered[low]) * (position - low)
    assert result["p90_ape"] == pytest.approx(p90, rel=1e-12)
    # worst rows first
    reported = [r["ape"] for r in result["rows"]]
    assert reported == sorted(reported, reverse=True)


def test_published_cli_json(sample, models_dir):
    path, picked = sample
    out = CliRunner().invoke(app, ["validate", "--published", str(path), "--hardware-map", "A100=A100-SXM4-40GB",
                                   "--models", str(models_dir), "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert set(doc) >= {"rows", "mape", "median_ape", "p90_ape"}
    assert sorted(r["measured_s"] for r in doc["rows"]) == sorted(float(r["iteration_time_s"]) for r in picked)
    assert {r["hardware"] for r in doc["rows"]} == {"A100-SXM4-40GB"}


def test_published_bad_inputs(tmp_path):
    not_csv = tmp_path / "trace.json"
    not_csv.write_text('{"traceEvents": []}')
    out = CliRunner().invoke(app, ["validate", "--published", str(not_csv)])
    assert out.exit_code == 2
    assert str(not_csv) in out.stderr and "missing column" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    # a configuration table without measured times cannot be scored
    unmeasured = tmp_path / "configs.csv"
    unmeasured.write_text("num_layers,hidden_size,num_attention_heads,seq_length,hardware_gpu\n2,64,4,32,A100\n")
    out = CliRunner().invoke(app, ["validate", "--published", str(unmeasured)])
    assert out.exit_code == 2 and "lacks column(s) iteration_time_s" in out.stderr
    out = CliRunner().invoke(app, ["validate", "--published", str(not_csv), "--hardware-map", "A100"])
    assert out.exit_code == 2 and "TEXT=HARDWARE_ID" in out.stderr
