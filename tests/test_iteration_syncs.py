"""The loss report and the logging barrier of Megatron's training loop (predictor.parallel.iteration_syncs): the last
stage all-reduces 2 fp32 values over the data- and context-parallel ranks every iteration; every rank joins a barrier
every `log_interval` iterations (Megatron's default 100); both end the iteration, exposed. Expected sizes come from
Megatron's code (module docstring), not from the code under test."""
from __future__ import annotations

import pytest

from predictor.assembly.graph import build_graph
from predictor.costs.learned.models import ModelSet
from predictor.predict import predict
from tracekit.core.cluster import preset
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError
from tracekit.core.megatron_arguments import flag_classes

HW = "H100-80GB-HBM3"


def config(**kw) -> TrainingConfig:
    base = dict(num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=2048, micro_batch_size=1,
                global_batch_size=64, world_size=16, tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    return TrainingConfig.from_mapping({**base, **kw})


def reports(c: TrainingConfig) -> dict[int, dict[str, tuple[dict, float]]]:
    g = build_graph(c, HW, 8)
    return {stage: {op.name: (g.specs[op.spec], times) for op, times in g.reports.get(stage, [])}
            for stage in range(c.pp)}


def test_the_last_stage_reports_the_loss_over_the_data_parallel_ranks_and_every_rank_joins_the_barrier():
    out = reports(config())
    assert set(out[0]) == {"log.interval_barrier"}  # the first stage holds no loss
    assert set(out[1]) == {"loss.report_all_reduce", "log.interval_barrier"}
    loss, every = out[1]["loss.report_all_reduce"]
    assert (loss["primitive"], loss["bytes"], loss["group_size"], every) == ("all_reduce", 8.0, 4.0, 1.0)  # dp 16/4
    barrier, share = out[0]["log.interval_barrier"]
    assert (barrier["primitive"], barrier["group_size"], barrier["nodes"], share) == ("all_reduce", 16.0, 2.0, 0.01)


def test_context_parallel_ranks_join_the_loss_report_and_the_log_interval_sets_the_barriers_share():
    out = reports(config(context_parallel_size=2, log_interval=4))
    assert out[1]["loss.report_all_reduce"][0]["group_size"] == 4.0  # dp 2 × cp 2
    assert out[1]["log.interval_barrier"][1] == 0.25


def test_one_rank_has_nothing_to_report_to():
    c = TrainingConfig.from_mapping(dict(num_layers=2, hidden_size=512, num_attention_heads=8, seq_length=1024,
                                         micro_batch_size=1, global_batch_size=4, world_size=1))
    assert reports(c) == {0: {}}


def test_a_barrier_every_iteration_slows_the_step_and_the_flag_is_modelled():
    models, cluster = ModelSet.load(), preset("dgx-h100")
    every = predict(config(log_interval=1), cluster, models)
    rare = predict(config(log_interval=1000), cluster, models)
    assert every.iteration_time_s > rare.iteration_time_s
    assert every.breakdown["exposed_communication"] > rare.breakdown["exposed_communication"]
    assert flag_classes()["--log-interval"] == "modelled"


@pytest.mark.parametrize("bad", [0, -3, 2.5, "often"])
def test_a_log_interval_that_is_not_a_positive_whole_number_is_refused_by_name(bad):
    with pytest.raises(ConfigError, match="log_interval"):
        reports(config(log_interval=bad))
