"""`tracekit search` never recommends something slower than what the user has: the input's own configuration is
evaluated beside the candidates, with the same prediction `predict` makes of it; both values of every boolean
setting are searched; nothing to rank is an error with a hint; the best candidate's warnings are `predict`'s."""
from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from extractors.jobs import parse_row, read_rows
from extractors.jobs.megatron import config_from_argv, parse_megatron_argv
from predictor import DEFAULT_STACK, ModelSet, get_stack, predict_iteration, predict_rows
from predictor.sweeps.search import SEARCH_KEYS, search
from tests.conftest import E2E, TRACES
from tracekit.cli import app
from tracekit.core.cluster import default_cluster, preset
from tracekit.core.config import TrainingConfig

runner = CliRunner()
#: Rows of each e2e file searched (evenly spaced among the rows that predict today): the whole corpus would take
#: minutes; these span its files, GPUs, stacks and sizes.
PER_FILE = 3
#: What the corpus searches open: the splits a user tries first; the rest stays as the row states it.
OPENED = {"tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size"}
JOB = "--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --global-batch-size 32 --fp16"


@pytest.fixture(scope="module")
def models():
    return ModelSet.load()


def _as_job(config: TrainingConfig) -> dict:
    """A configuration as Megatron argument names (what a search reads)."""
    data = {k: v for k, v in config.to_dict().items() if v is not None and k != "extra"}
    return {**data, **config.extra}


def corpus_jobs(models) -> list[tuple[str, TrainingConfig, object, object]]:
    """(name, configuration, cluster, calibration) of the shipped configurations and of PER_FILE rows of every e2e
    file that predict today."""
    jobs = []
    for path in sorted((TRACES / "configs").glob("*.yaml")):
        stack = get_stack(DEFAULT_STACK)
        config = TrainingConfig.from_mapping(yaml.safe_load(path.read_text()), stack.config)
        cluster, _ = default_cluster("A100-SXM4-80GB", 4)  # the tour's predict of it
        jobs.append((path.name, config, cluster, stack.calibration(cluster.hardware)))
    for path in sorted(E2E.glob("*.csv")):
        _, cells = read_rows(path)
        rows = [parse_row(c, i + 2, None, None) for i, c in enumerate(cells)]
        picked: list = []
        for i in range(PER_FILE):  # evenly spaced; a row that does not predict today gives way to the next
            for row in rows[round(i * (len(rows) - 1) / (PER_FILE - 1)):]:
                if row not in picked and not isinstance(predict_rows([row], models)[0], Exception):
                    picked.append(row)
                    break
        assert len(picked) == PER_FILE, f"{path.name}: rows that predict today are missing"
        for row in picked:
            config, cluster, _ = row.complete()
            jobs.append((f"{path.name}:{row.line}", config, cluster, row.calibration))
    return jobs


def test_the_best_of_a_search_is_never_slower_than_the_input_on_corpus_configurations(models):
    """Every shipped configuration and a sample of every e2e file's rows, searched over tp, pp and micro-batch
    size: the input is in the result with `predict`'s own time for it, and no recommendation is slower."""
    jobs = corpus_jobs(models)
    assert len(jobs) >= 1 + 6 * PER_FILE
    fitting = 0
    for name, config, cluster, calibration in jobs:
        alone = predict_iteration(config, cluster, models, calibration)
        result = search(_as_job(config), config.world_size, cluster, models, set(SEARCH_KEYS) - OPENED,
                        calibration)
        mine = result.input
        assert mine is not None and result.input_error is None, (name, result.input_error)
        assert mine["iteration_time_s"] == pytest.approx(alone.iteration_time_s, rel=1e-9), name
        assert mine["config"]["data_parallel_size"] == config.dp and mine["fits"] == alone.fits_in_memory, name
        if alone.fits_in_memory:
            fitting += 1
            assert result.candidates[0]["iteration_time_s"] <= alone.iteration_time_s, name
            assert result.candidates[mine["rank"] - 1] is mine, name
            assert sum(1 for c in result.candidates if c["config"] == mine["config"]) == 1, name  # not twice
        else:
            assert mine["rank"] is None and mine not in result.candidates, name
    assert fitting >= len(jobs) - 3  # the corpus's runs ran: nearly all fit


def test_the_issue_job_keeps_its_own_split_in_the_table(models):
    """The job of issue #23: tp 4, pp 2 on 64 H100s; predict says 3.108 s of it. The search used to rank first a
    split at 3.13 s because it tried only sequence parallelism on."""
    args = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention --num-query-groups 8 "
            "--swiglu --seq-length 8192 --micro-batch-size 1 --global-batch-size 256 --bf16 "
            "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2")
    stack = get_stack(DEFAULT_STACK)
    cluster, _ = default_cluster("H100-80GB-HBM3")
    base = {**stack.config, **parse_megatron_argv(args)}
    config = config_from_argv(args, stack.config)
    config = TrainingConfig.from_mapping({**{k: v for k, v in config.to_dict().items() if v is not None},
                                          "world_size": 64, "data_parallel_size": None})
    alone = predict_iteration(config, cluster, models, stack.calibration(cluster.hardware))
    fixed = {"tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size", "precision"}
    result = search(base, 64, cluster, models, fixed, stack.calibration(cluster.hardware))
    assert result.input["iteration_time_s"] == pytest.approx(alone.iteration_time_s, rel=1e-9)
    assert result.candidates[0]["iteration_time_s"] <= alone.iteration_time_s
    assert {c["config"]["sequence_parallel"] for c in result.candidates} == {False, True}
    # the search's warnings are those `predict` gives of its best candidate
    best = result.candidates[0]["config"]
    again = TrainingConfig.from_mapping({**base, **best, "world_size": 64})
    assert result.warnings == predict_iteration(again, cluster, models, stack.calibration(cluster.hardware)).warnings
    assert any(w.startswith("estimates: ") and "past their sampled range" in w  # H100 attention: out of range
               for w in result.warnings)


def test_every_boolean_setting_is_searched_both_ways(models):
    base = parse_megatron_argv(JOB + " --tensor-model-parallel-size 2 --sequence-parallel")
    closed = search(base, 8, preset("dgx-a100"), models, {"tensor_model_parallel_size", "sequence_parallel"})
    assert {c["config"]["sequence_parallel"] for c in closed.candidates} == {True}  # stated: kept
    opened = search(base, 8, preset("dgx-a100"), models, {"tensor_model_parallel_size"})
    splits = {}
    for c in opened.candidates:
        key = tuple((k, v) for k, v in sorted(c["config"].items()) if k != "sequence_parallel")
        splits.setdefault(key, set()).add(c["config"]["sequence_parallel"])
    assert splits and all(values == {False, True} for values in splits.values())  # tp 2: each split both ways
    dist = {c["config"]["use_distributed_optimizer"] for c in opened.candidates
            if c["config"]["data_parallel_size"] > 1}
    assert dist == {False, True}


def test_progress_follows_every_candidate(models):
    seen: list[tuple[int, int]] = []
    result = search(parse_megatron_argv(JOB), 8, preset("dgx-a100"), models, progress=lambda d, t: seen.append((d, t)))
    done = [d for d, _ in seen]
    assert done == sorted(done) and seen[-1][0] == seen[-1][1]
    assert seen[-1][1] == result.evaluated + result.pruned["memory"]  # every candidate Megatron accepts


def test_nothing_to_rank_is_one_line_with_a_hint_and_a_non_zero_exit():
    config = TRACES / "configs" / "llemma-7b-a100.yaml"
    res = runner.invoke(app, ["search", str(config), "--gpus", "12", "--hardware", "A100-SXM4-80GB"])
    assert res.exit_code == 2 and not res.stdout
    assert len(res.stderr.strip().splitlines()) == 1
    assert "no configuration of 12 GPUs fits" in res.stderr and "--vary tp,pp" in res.stderr
    # on 4 GPUs the input's own split (tp 2 · pp 4) is none, the opened splits are: ranked, the input said why not
    opened = runner.invoke(app, ["search", str(config), "--gpus", "4", "--hardware", "A100-SXM4-80GB", "--vary",
                                 "tp,pp", "--json"])
    assert opened.exit_code == 0, opened.output
    doc = json.loads(opened.stdout)
    assert doc["candidates"] and doc["input"] is None and "no configuration of 4 GPUs" in doc["input_error"]


def test_the_cli_shows_the_input_with_its_rank_and_the_assumption_as_predict_does():
    config = TRACES / "configs" / "llemma-7b-a100.yaml"
    searched = runner.invoke(app, ["search", str(config), "--gpus", "16", "--hardware", "A100-SXM4-80GB", "--vary",
                                   "tp,pp", "--top", "3"])
    assert searched.exit_code == 0, searched.output
    assert "← input" in searched.stdout and "input: rank " in searched.stdout
    predicted = runner.invoke(app, ["predict", str(config), "--hardware", "A100-SXM4-80GB"])
    note = "note: cluster dgx-a100 assumed (8 GPUs per node, nvswitch)"
    # one rule, said the same way: on stderr, first, by both commands
    assert searched.stderr.splitlines()[0] == predicted.stderr.splitlines()[0] == note
    assert note not in searched.stdout and note not in predicted.stdout
    doc = json.loads(runner.invoke(app, ["search", str(config), "--gpus", "16", "--hardware", "A100-SXM4-80GB",
                                         "--vary", "tp,pp", "--json"]).stdout)
    assert doc["warnings"][0] == note.removeprefix("note: ") and doc["input"]["rank"] >= 1
    assert doc["fixed"] == ["micro_batch_size"] or "micro_batch_size" in doc["fixed"]
