"""`tracekit search`: every split Megatron accepts, pruned by memory, ranked by the same predictions `predict` makes."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from extractors.jobs.megatron import parse_megatron_argv
from predictor.costs.learned.models import ModelSet
from predictor.predict import predict
from predictor.sweeps.search import search
from tracekit.cli import app
from tracekit.core.cluster import preset
from tracekit.core.config import TrainingConfig
from tracekit.core.hardware import hardware_spec

JOB = "--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --global-batch-size 32 --fp16"
runner = CliRunner()


@pytest.fixture(scope="module")
def models():
    return ModelSet.load()


def test_candidates_are_valid_splits_of_the_gpus_and_keep_what_the_input_states(models):
    base = parse_megatron_argv(JOB + " --micro-batch-size 2")
    result = search(base, 8, preset("dgx-a100"), models, fixed={"micro_batch_size"})
    assert result.evaluated == len(result.candidates) > 20
    seen = set()
    for c in result.candidates:
        cfg = c["config"]
        assert cfg["micro_batch_size"] == 2
        assert cfg["tensor_model_parallel_size"] * cfg["pipeline_model_parallel_size"] * \
            cfg["context_parallel_size"] * cfg["data_parallel_size"] == 8
        assert 16 % cfg["tensor_model_parallel_size"] == 0 and 8 % cfg["pipeline_model_parallel_size"] == 0
        seen.add((cfg["tensor_model_parallel_size"], cfg["pipeline_model_parallel_size"]))
        assert not (cfg["sequence_parallel"] and cfg["tensor_model_parallel_size"] == 1)
    assert {(1, 1), (8, 1), (1, 8), (2, 4)} <= seen  # every tp·pp split of 8 GPUs that divides heads and layers
    times = [c["iteration_time_s"] for c in result.candidates]
    assert times == sorted(times)


def test_the_ranking_is_what_predict_says_of_each_candidate(models):
    base = parse_megatron_argv(JOB)
    result = search(base, 8, preset("dgx-a100"), models)
    for c in (result.candidates[0], result.candidates[len(result.candidates) // 2]):
        cfg = TrainingConfig.from_mapping({**base, **c["config"], "world_size": 8})
        assert predict(cfg, preset("dgx-a100"), models).iteration_time_s == pytest.approx(c["iteration_time_s"],
                                                                                        rel=1e-12)
    assert result.notes and result.notes[0].startswith("best vs next:")


def test_configurations_that_do_not_fit_are_pruned_and_counted(models):
    big = parse_megatron_argv("--num-layers 24 --hidden-size 8192 --num-attention-heads 64 --seq-length 2048 "
                              "--global-batch-size 64 --bf16")
    result = search(big, 8, preset("dgx-a100"), models)
    limit = hardware_spec("A100-SXM4-80GB").memory_gb
    assert result.pruned["memory"] > 0 and result.candidates
    assert all(c["memory_gb_per_gpu"] <= limit for c in result.candidates)
    # ~20B parameters with 16 bytes of weights, gradients and Adam state each: 2-way model parallelism leaves
    # ~160 GB (or ~70 GB sharded plus activations) per GPU, past 80 GB
    assert all(c["config"]["tensor_model_parallel_size"] * c["config"]["pipeline_model_parallel_size"] >= 4
               for c in result.candidates)


def test_cli_json_contract_vary_and_objectives():
    res = runner.invoke(app, ["search", "--megatron-args", JOB + " --tensor-model-parallel-size 2", "--gpus", "8",
                              "--hardware", "A100-SXM4-80GB", "--top", "3", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert set(doc) >= {"candidates", "evaluated", "pruned", "seconds", "objective"} and len(doc["candidates"]) == 3
    first = doc["candidates"][0]
    assert set(first) >= {"config", "iteration_time_s", "memory_gb_per_gpu", "fits", "breakdown", "mfu"}
    assert {c["config"]["tensor_model_parallel_size"] for c in doc["candidates"]} == {2}  # stated: fixed
    opened = runner.invoke(app, ["search", "--megatron-args", JOB + " --tensor-model-parallel-size 2", "--gpus", "8",
                                 "--hardware", "A100-SXM4-80GB", "--vary", "tp", "--json"])
    assert len({c["config"]["tensor_model_parallel_size"] for c in json.loads(opened.stdout)["candidates"]}) > 1
    bad = runner.invoke(app, ["search", "--megatron-args", JOB, "--gpus", "8", "--hardware", "A100-SXM4-80GB",
                              "--vary", "tensr_model_parallel_size"])
    assert bad.exit_code == 2 and "did you mean" in bad.stderr
    cost = runner.invoke(app, ["search", "--megatron-args", JOB, "--gpus", "8", "--hardware", "A100-SXM4-80GB",
                               "--objective", "cost"])
    assert cost.exit_code == 2 and "price per GPU-hour" in cost.stderr
    priced = json.loads(runner.invoke(app, ["search", "--megatron-args", JOB, "--gpus", "8", "--hardware",
                                            "A100-SXM4-80GB", "--objective", "tokens-per-s", "--json"]).stdout)
    rates = [c["tokens_per_s"] for c in priced["candidates"]]
    assert priced["objective"] == "tokens_per_s" and rates == sorted(rates, reverse=True)
    no_batch = runner.invoke(app, ["search", "--megatron-args", JOB.replace("--global-batch-size 32 ", ""),
                                   "--gpus", "8", "--hardware", "A100-SXM4-80GB"])
    assert no_batch.exit_code == 2 and "global batch size" in no_batch.stderr
    typo = ["search", "--megatron-args", JOB + " --sequence-paralel", "--gpus", "8", "--hardware", "A100-SXM4-80GB"]
    refused = runner.invoke(app, typo)
    assert refused.exit_code == 2 and "did you mean 'sequence_parallel'?" in refused.stderr
    allowed = runner.invoke(app, typo + ["--allow-unknown", "--json"])
    assert allowed.exit_code == 0 and "not a flag of Megatron-LM" in allowed.stderr
    assert json.loads(allowed.stdout)["candidates"]  # the unknown flag was kept aside, the search ran


def test_ray_executor_gives_the_local_ranking(models, ray_local):
    from predictor.sweeps.ray_executor import RayExecutor

    base = parse_megatron_argv(JOB)
    local = search(base, 8, preset("dgx-a100"), models)
    sharded = search(base, 8, preset("dgx-a100"), models, executor=RayExecutor(shard=64))
    assert len(local.candidates) > 64  # more than one shard
    assert sharded.candidates == local.candidates and sharded.pruned == local.pruned
    assert sharded.evaluated == local.evaluated


def test_ray_executor_without_ray_says_how_to_install_it(monkeypatch):
    import sys

    from predictor.sweeps.ray_executor import RayExecutor
    from tracekit.core.errors import ConfigError
    from tracekit.core.ray_runtime import INSTALL_HINT

    monkeypatch.setitem(sys.modules, "ray", None)  # as on a machine without the extra
    with pytest.raises(ConfigError, match="pip install 'tracekit\\[ray\\]'"):
        RayExecutor().run([], preset("dgx-a100"), None)
    assert "tracekit[ray]" in INSTALL_HINT


def test_batched_search_ranks_as_one_prediction_at_a_time(models, monkeypatch):
    """The search simulates candidates of one pipeline shape together as arrays; each candidate's iteration time
    and breakdown equal `predict` of it alone, simulated task by task, exactly: the ranking is the same."""
    from predictor.schedule import pipeline as schedule

    base = parse_megatron_argv(JOB)
    result = search(base, 8, preset("dgx-a100"), models)
    monkeypatch.setattr(schedule, "VECTOR_MIN", 10 ** 9)
    alone = []
    for c in result.candidates:
        p = predict(TrainingConfig.from_mapping({**base, **c["config"], "world_size": 8}), preset("dgx-a100"), models)
        alone.append((p.iteration_time_s, p.breakdown))
    assert [(c["iteration_time_s"], c["breakdown"]) for c in result.candidates] == alone
    assert len({c["config"]["pipeline_model_parallel_size"] for c in result.candidates}) >= 3


def test_context_parallelism_is_searched_when_opened(models):
    base = parse_megatron_argv(JOB)
    closed = search(base, 8, preset("dgx-a100"), models)
    opened = search(base, 8, preset("dgx-a100"), models, context_parallel=True)
    cps = {c["config"]["context_parallel_size"] for c in opened.candidates}
    assert {c["config"]["context_parallel_size"] for c in closed.candidates} == {1}
    assert cps == {1, 2, 4, 8}  # 2·cp divides the 1024-token sequence for every divisor of 8 GPUs
    for c in opened.candidates:
        cfg = c["config"]
        assert cfg["tensor_model_parallel_size"] * cfg["pipeline_model_parallel_size"] * \
            cfg["context_parallel_size"] * cfg["data_parallel_size"] == 8
    res = runner.invoke(app, ["search", "--megatron-args", JOB, "--gpus", "8", "--hardware", "A100-SXM4-80GB",
                              "--vary", "context_parallel_size", "--json", "--top", "1000"])
    assert {c["config"]["context_parallel_size"] for c in json.loads(res.stdout)["candidates"]} == cps


def test_an_moe_search_opens_expert_parallelism():
    """EP divides the experts, EP·ETP a stage's GPUs, ETP is 1 or the TP size; every such split is a candidate."""
    from predictor.sweeps.search import enumerate_configs

    base = {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "seq_length": 1024,
            "global_batch_size": 32, "num_experts": 8, "moe_router_topk": 2, "swiglu": True}
    configs, _ = enumerate_configs(base, 8, {"micro_batch_size", "recompute_granularity",
                                             "use_distributed_optimizer", "virtual_pipeline_model_parallel_size"})
    splits = {(c.tp, c.pp, c.moe.ep, c.moe.etp(c.tp)) for c in configs}
    assert all(8 % ep == 0 and (8 // pp) % (ep * etp) == 0 and etp in (1, tp) for tp, pp, ep, etp in splits)
    assert {ep for _, _, ep, _ in splits} == {1, 2, 4, 8}
    assert (2, 1, 4, 2) in splits and (2, 1, 4, 1) in splits and (1, 2, 4, 1) in splits
    fixed, _ = enumerate_configs({**base, "expert_model_parallel_size": 2}, 8, {"expert_model_parallel_size"})
    assert {c.moe.ep for c in fixed} == {2}
