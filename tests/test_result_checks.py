"""Megatron-LM's result checks (tracekit.core.runtime.result_checks): each micro-batch's loss checked for NaN and Inf
on the host (pretrain_gpt.py's loss_func) and each gradient bucket's norm before its collective
(param_and_grad_buffer.py's check_grads), on by default and off with --no-check-for-nan-in-loss-and-grad, under fp16
without a static loss scale, with a full-iteration CUDA graph, and in the stacks whose loops have none. Facts: the
synchronisations each check makes and the bucket bytes its norm reads."""
from __future__ import annotations

import math

import pytest

from extractors.jobs.megatron import config_from_argv
from predictor.architecture.params import chunk_params
from predictor.assembly.graph import build_graph
from predictor.costs.physics.roofline import MEMORY_EFFICIENCY
from predictor.schedule.framework_costs import pass_costs
from tracekit.core.hardware import hardware_spec
from tracekit.core.stacks import get_stack

HW = "A100-SXM4-80GB"
JOB = ("--num-layers 16 --hidden-size 4096 --num-attention-heads 32 --seq-length 2048 --micro-batch-size 1 "
       "--global-batch-size 64 --pipeline-model-parallel-size 2 --bf16 --overlap-grad-reduce")


def graph(extra: str = ""):
    return build_graph(config_from_argv(f"{JOB} {extra}", {"world_size": 16}), HW, 8)


def loss_syncs(g) -> int:
    """Synchronisations of the last stage's loss per micro-batch."""
    last = g.segment(g.config.pp - 1, g.config.vp - 1)
    return sum(o.syncs * o.count for o in last.fwd if o.name == "loss.vocab_parallel_cross_entropy")


@pytest.mark.parametrize("extra, stack, syncs", [
    ("", "megatron-core", 2),  # isnan and isinf of the loss
    ("--no-check-for-nan-in-loss-and-grad", "megatron-core", 0),
    ("--check-for-spiky-loss", "megatron-core", 3),
    ("--fp16", "megatron-core", 0),  # a dynamic loss scale: Megatron turns the checks off
    ("--fp16 --loss-scale 4096", "megatron-core", 2),
    ("", "megatron-deepspeed-2023", 0), ("", "torchtitan", 0), ("", "megatron-bridge", 0),
])
def test_the_loss_is_checked_on_the_host_per_micro_batch(extra, stack, syncs):
    job = JOB.replace("--bf16", "") if "--fp16" in extra else JOB
    g = build_graph(config_from_argv(f"{job} {extra}", {"world_size": 16, **get_stack(stack).config}), HW, 8)
    assert loss_syncs(g) == syncs


def test_each_buckets_norm_is_read_and_checked_before_its_collective():
    """Stage 0's first chunk is cut in 40M-element buckets (overlap_grad_reduce), stage 1's buffer is one: two
    synchronisations per bucket, and a read of every fp32 gradient."""
    checked, plain = pass_costs(graph()), pass_costs(graph("--no-check-for-nan-in-loss-and-grad"))
    c = graph().config
    bandwidth = hardware_spec(HW).mem_bw_gbs * 1e3 * MEMORY_EFFICIENCY
    for stage in (0, 1):
        dense, _ = chunk_params(c, stage, 0)
        buckets = math.ceil(dense / 40_000_000) if stage == 0 else 1
        assert checked.iteration_syncs[stage] == 2 * buckets and plain.iteration_syncs[stage] == 0
        read = (checked.iteration_device_us[stage] - plain.iteration_device_us[stage]) * bandwidth
        assert read == pytest.approx(dense * 4, rel=1e-3)
    large = pass_costs(graph("--no-check-for-nan-in-loss-and-grad --check-for-large-grads"))
    assert large.iteration_syncs[0] == checked.iteration_syncs[0] / 2
    assert large.iteration_device_us[0] == pytest.approx(checked.iteration_device_us[0])


def test_a_full_iteration_graph_runs_without_the_nan_checks():
    """Megatron allows --cuda-graph-impl full_iteration only with the NaN/Inf checks off: such a run ran without
    them (a spiky-loss check it still allows)."""
    for extra, syncs in (("", 0), ("--check-for-spiky-loss", 1)):
        g = build_graph(config_from_argv(f"{JOB} --cuda-graph-impl full_iteration {extra}", {"world_size": 16}), HW, 8)
        assert loss_syncs(g) == syncs
        assert pass_costs(g).iteration_syncs == [0.0, 0.0]
