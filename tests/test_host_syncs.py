"""Megatron-core's device synchronisations in MoE layers (predictor.layers.moe.host_syncs) and what they cost the
schedule (predictor.schedule.stage_work): where they are (token counts before the experts' first GEMM, the quick-GELU
GLU's offset tensor), where they are not (fixed-size experts, CUDA graphs), their replay in recompute, and the idle time
each adds to a layer pass, from the bundled models and the stack's host constants."""
from __future__ import annotations

import dataclasses

import pytest

from predictor.assembly.graph import build_graph
from predictor.costs.estimates import calibrated_durations
from predictor.costs.learned.models import ModelSet
from predictor.predict import compose, prepare_many
from predictor.schedule.framework_costs import SYNC_US, Capture
from predictor.schedule.stage_work import _work
from tests.test_grouped_mlp_ops import gpt_oss_like
from tracekit.core.cluster import preset
from tracekit.core.config import TrainingConfig
from tracekit.core.stacks import get_stack

HW = "H100-80GB-HBM3"


def moe(**kw) -> TrainingConfig:
    """A small GPT-OSS-shaped MoE: biased linears, a clamped GLU, grouped GEMMs, 4 MoE layers, GPT-OSS's all-to-all
    dispatcher (the all-gather dispatcher's `masked_select` synchronises too: tests/test_moe_host_calls.py); without
    Megatron-LM's result checks, whose loss check synchronises too (tests/test_result_checks.py)."""
    return gpt_oss_like(**{"moe_token_dispatcher_type": "alltoall", "check_for_nan_in_loss_and_grad": False, **kw})


def syncs(config: TrainingConfig) -> tuple[int, int]:
    """(forward, backward) synchronisations of one micro-batch of the first segment, over its layers."""
    seg = build_graph(config, HW).segments[0]
    return sum(o.syncs * o.count for o in seg.fwd), sum(o.syncs * o.count for o in seg.bwd)


def test_each_moe_layer_forward_brings_its_token_counts_to_the_host_and_makes_the_glu_offset():
    assert syncs(moe()) == (4 * 2, 0)
    assert syncs(moe(activation_func_clamp_value=None)) == (4, 0)  # no quick-GELU GLU: the token counts only
    assert syncs(moe(num_experts=None, moe_router_topk=None, moe_grouped_gemm=None, moe_ffn_hidden_size=None)) \
        == (0, 0)  # a dense model has none


def test_fixed_size_experts_need_no_token_counts_on_the_host():
    padded = moe(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True,
                 activation_func_clamp_value=None)
    assert syncs(padded) == (0, 0)
    assert syncs(moe(moe_expert_capacity_factor=1.0, activation_func_clamp_value=None)) == (4, 0)  # dropping, unpadded


def test_recompute_replays_the_synchronisations_of_what_it_replays():
    assert syncs(moe(recompute_granularity="selective", recompute_modules=["moe_act"])) == (8, 4)  # the GLU's
    assert syncs(moe(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)) == (8, 8)


def test_te_op_fuser_runs_the_glu_without_the_offset_tensor():
    assert syncs(moe(use_transformer_engine_op_fuser=True)) == (4, 0)


def _forward_work(config: TrainingConfig, zero_syncs: bool = False, graphs: Capture | None = None):
    """The first segment's forward Work of one micro-batch on a DGX H100, with the megatron-core stack's constants;
    `zero_syncs`: the same ops without their synchronisations."""
    [(graph, est, _, _)] = prepare_many([config], preset("dgx-h100"), ModelSet.load())
    cal = get_stack("megatron-core").calibration(HW)
    ops = graph.segments[0].fwd
    if zero_syncs:
        ops = [dataclasses.replace(o, syncs=0) for o in ops]
    return _work(ops, calibrated_durations(graph, est, cal), cal, graphs=graphs), cal, ops


#: A compute-bound MoE layer (the host issues its ops faster than the device runs them).
BIG = dict(hidden_size=4096, moe_ffn_hidden_size=8192, seq_length=4096, num_attention_heads=32)


def test_a_synchronisation_idles_the_device_for_its_return_and_the_next_issue():
    """Each sync adds SYNC_US + one host op's issue time to a compute-bound pass, and changes nothing else."""
    with_syncs, cal, ops = _forward_work(moe(**BIG))
    without, _, _ = _forward_work(moe(**BIG), zero_syncs=True)
    n = sum(o.syncs * o.count for o in ops)
    assert n == 8 and cal.host_op_us > 0
    assert with_syncs.compute == pytest.approx(without.compute) and with_syncs.comm == pytest.approx(without.comm)
    assert with_syncs.other - without.other == pytest.approx(n * (SYNC_US + cal.host_op_us))


def test_cuda_graphs_capture_no_synchronisation():
    full = Capture(full=True)
    assert _forward_work(moe(**BIG), graphs=full)[0].other == \
        pytest.approx(_forward_work(moe(**BIG), zero_syncs=True, graphs=full)[0].other)


def test_synchronisations_make_the_iteration_longer():
    models, cluster = ModelSet.load(), preset("dgx-h100")
    config = moe(world_size=8, expert_model_parallel_size=8, activation_func_clamp_value=None)
    cal = get_stack("megatron-core").calibration(HW)
    [(graph, est, _, _)] = prepare_many([config], cluster, models)
    synced = compose(graph, est, cluster, calibration=cal).iteration_time_s
    for seg in graph.segments:
        seg.fwd[:] = [dataclasses.replace(o, syncs=0) for o in seg.fwd]
    assert synced > compose(graph, est, cluster, calibration=cal).iteration_time_s
