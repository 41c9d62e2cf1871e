"""The plausibility guard (`predictor.report.plausibility`): no prediction above the GPU's dense peak for its GEMM dtype
(over search spaces of every datasheet GPU and every precision the configuration accepts), a typed error when one
would be, a warning naming the extrapolated parts above the best published MFU, and a table of published MFUs whose
corpus entries are the corpus's own figures."""
from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from extractors.jobs.megatron import parse_megatron_argv
from predictor import ModelSet, predict_iteration
from predictor.architecture.flops import model_flops_per_iteration
from predictor.report.plausibility import PUBLISHED, TABLE, best_published, check
from tests.conftest import E2E
from tracekit.cli import app
from tracekit.core.cluster import default_cluster
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError, PlausibilityError
from tracekit.core.hardware import PEAK_KIND, SPECS, hardware_spec
from tracekit.core.precision import recipe, recipe_name

runner = CliRunner()
#: A job whose splits reach the highest utilisations the models give (big GEMMs, few GPUs, no recompute).
#: Small enough that some split fits a 16 GB V100.
JOB = ("--num-layers 8 --hidden-size 6144 --num-attention-heads 48 --seq-length 4096 --global-batch-size 32 "
       "--swiglu --recompute-granularity none --use-distributed-optimizer")


def accepted_precisions() -> list[str]:
    """Every precision (recipe) a configuration accepts."""
    from tracekit.core.precision import RECIPES

    out = []
    for name in RECIPES:
        try:
            TrainingConfig(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, precision=name)
        except ConfigError:
            continue
        out.append(name)
    return out


@pytest.fixture(scope="module")
def models():
    return ModelSet.load()


def test_no_prediction_exceeds_the_dense_peak_of_its_gemm_dtype(models):
    """The search space of the job on 8 GPUs (every tp, pp and micro-batch Megatron accepts, that fits the GPU's
    memory), on every datasheet GPU, in every precision the configuration accepts and the GPU's tensor cores take,
    predicted in one batched call: model FLOP/s per GPU, recomputed here from the model's FLOPs and the predicted
    time, stay below the peak, and the guard removed none (it would have: a bug)."""
    from predictor.memory.stages import config_memory
    from predictor.predict import predict_many
    from predictor.sweeps.search import enumerate_configs

    fixed = {"recompute_granularity", "use_distributed_optimizer", "virtual_pipeline_model_parallel_size",
             "sequence_parallel", "precision"}
    configs, clusters, seen = [], [], set()
    for hardware in sorted(SPECS):
        cluster, _ = default_cluster(hardware)
        spec = hardware_spec(hardware)
        for dtype in accepted_precisions():
            if not spec.peak_tflops(TrainingConfig(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
                                                   precision=dtype).gemm_dtype):
                continue  # refused: no tensor cores for it
            space, _ = enumerate_configs({**parse_megatron_argv(JOB), "precision": dtype}, 8, fixed)
            fitting = [c for c in space if config_memory(c, hardware)[0]["total"] <= spec.memory_gb]
            configs += fitting
            clusters += [cluster] * len(fitting)
            seen.update((hardware, dtype) for _ in fitting[:1])
    assert {hw for hw, _ in seen} == set(SPECS)  # every GPU has splits that fit
    assert {dtype for _, dtype in seen} == set(accepted_precisions())
    assert {"bf16", "fp8", "mxfp8", "nvfp4"} <= set(accepted_precisions())
    for config, cluster, prediction in zip(configs, clusters, predict_many(configs, clusters, models)):
        assert not isinstance(prediction, Exception), (cluster.hardware, config.precision, prediction)
        peak = hardware_spec(cluster.hardware).peak_tflops(config.gemm_dtype)
        rate = model_flops_per_iteration(config) / prediction.iteration_time_s / config.world_size / 1e12
        assert rate < peak, (cluster.hardware, config.gemm_dtype, config.tp, config.pp, config.micro_batch_size, rate)


def test_above_the_peak_is_a_typed_error_and_above_the_best_published_a_warning(models):
    config = TrainingConfig(num_layers=16, hidden_size=8192, num_attention_heads=64, seq_length=4096,
                            micro_batch_size=1, global_batch_size=64, precision="bf16", world_size=8)
    cluster, _ = default_cluster("H100-80GB-HBM3")
    prediction = predict_iteration(config, cluster, models)
    peak = hardware_spec("H100-80GB-HBM3").peak_tflops("bf16")
    fallbacks, seconds = prediction.fallbacks, prediction.iteration_time_s
    with pytest.raises(PlausibilityError, match="above its dense bf16 peak of 989") as raised:
        check(config, "H100-80GB-HBM3", 1.01 * peak, fallbacks, seconds)
    assert "H100-80GB-HBM3" in str(raised.value) and "other GPUs' models" in str(raised.value)  # what is behind it
    best = best_published("H100-80GB-HBM3", "bf16")
    assert best is not None and best.hardware == "H100-80GB-HBM3"
    warned = check(config, "H100-80GB-HBM3", (best.mfu + 0.01) * peak, fallbacks, seconds)
    assert len(warned) == 1 and f"{100 * best.mfu:.0f}%" in warned[0] and "extrapolated" in warned[0]
    assert "from other GPUs' models" in warned[0]  # H100 has no models of its own: transferred
    assert check(config, "H100-80GB-HBM3", (best.mfu - 0.01) * peak, fallbacks, seconds) == []
    # fp8 is measured against the fp8 peak, twice the bf16 one: 60% of bf16's peak is no more than 30% of fp8's
    fp8 = TrainingConfig(num_layers=16, hidden_size=8192, num_attention_heads=64, seq_length=4096,
                         micro_batch_size=1, global_batch_size=64, precision="fp8", world_size=8)
    assert check(fp8, "H100-80GB-HBM3", 0.6 * peak, fallbacks, seconds) == []


def test_a_gpu_without_an_entry_takes_its_dies_then_any_gpus():
    assert best_published("H200-141GB", "bf16").hardware == "H100-80GB-HBM3"  # the same GH100 die
    assert best_published("A100-PCIE-80GB", "fp16").hardware in ("A100-SXM4-80GB", "A100-SXM4-40GB")
    fp8 = max((p for p in PUBLISHED if p.precision == "fp8"), key=lambda p: p.mfu)
    assert best_published("MI300X", "fp8") == fp8  # no CDNA 3 entry: the best of any GPU
    assert best_published("H100-80GB-HBM3", "fp32") is None


def test_every_entry_has_a_source_and_its_corpus_figures_are_the_corpus_rows():
    entries = json.loads(TABLE.read_text())["entries"]
    assert entries and len(entries) == len(PUBLISHED)
    for entry in entries:
        spec = hardware_spec(entry["hardware"])
        assert spec is not None and spec.name == entry["hardware"], entry
        assert entry["source"] and entry["cite"] and entry["precision"] in set(PEAK_KIND.values())
        peak = {"fp16": spec.peak_tflops_fp16, "fp8": spec.peak_tflops_fp8, "fp4": spec.peak_tflops_fp4}[
            entry["precision"]]
        assert entry["mfu"] == pytest.approx(entry["tflops_per_gpu"] / peak, abs=0.002), entry
        where = entry.get("corpus")
        if where is None:
            continue
        with open(E2E / where["file"], newline="") as fh:
            row = list(csv.DictReader(fh))[where["line"] - 2]  # the header is line 1
        assert float(row[where["column"]]) == entry["tflops_per_gpu"], entry
        from extractors.jobs.table import hardware_text

        assert hardware_text(row)[0] == entry["hardware"], entry
        assert PEAK_KIND[recipe(recipe_name(row["precision"].split()[0])).gemm_dtype] == entry["precision"], entry


def test_a_configuration_that_does_not_fit_says_so_first():
    args = ["predict", "--megatron-args", "--num-layers 80 --hidden-size 8192 --num-attention-heads 64 --seq-length "
            "4096 --micro-batch-size 1 --global-batch-size 8 --tensor-model-parallel-size 8 --bf16",
            "--hardware", "A100-SXM4-80GB"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    first = res.stdout.splitlines()[0]
    assert first.startswith("does not fit: needs about") and "80 GB of A100-SXM4-80GB" in first
    assert "will not fit" not in res.stderr  # said once, first
    doc = json.loads(runner.invoke(app, args + ["--json"]).stdout)
    assert doc["fits_in_memory"] is False and doc["memory_capacity_gb"] == 80
    assert doc["memory_gb_per_gpu"]["total"] > doc["memory_capacity_gb"]
    small = json.loads(runner.invoke(app, ["predict", "--megatron-args", "--num-layers 2 --hidden-size 256 "
                                           "--num-attention-heads 4 --seq-length 128 --global-batch-size 8 --bf16",
                                           "--hardware", "A100-SXM4-80GB", "--json"]).stdout)
    assert small["fits_in_memory"] is True
