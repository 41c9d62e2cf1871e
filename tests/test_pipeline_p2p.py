"""The activation handed between pipeline stages (predictor.parallel.pipeline_p2p): Megatron-core sends the whole
activation from each tensor-parallel rank; Megatron-LM 2021's scatter/gather (`megatron/p2p_communication.py`,
Narayanan et al. 2021 §4.1) and DeepSpeed's pipeline engine (Megatron-DeepSpeed's, GPT-NeoX's: `pipe_partitioned` and
`grad_partitioned`, true by default) send each rank's 1/tp share and all-gather it over the tensor-parallel group
inside the receiving node, except with sequence parallelism. Facts: the bytes of [s, b, h] in fp16, the groups' sizes
and spans, and that fewer bytes cross between nodes."""
from __future__ import annotations

import pytest

from extractors.jobs.megatron import config_from_argv
from predictor.assembly.graph import build_graph
from predictor.costs.learned.models import ModelSet
from predictor.predict import prepare_many
from predictor.schedule.stage_work import hand_over_us
from tracekit.core.cluster import preset
from tracekit.core.stacks import get_stack

HW = "A100-SXM4-80GB"
S, B, H = 2048, 2, 8192
JOB = (f"--num-layers 8 --hidden-size {H} --num-attention-heads 64 --seq-length {S} --max-position-embeddings {S} "
       f"--micro-batch-size {B} --global-batch-size 64 --tensor-model-parallel-size 8 "
       "--pipeline-model-parallel-size 2 --fp16")
ACTIVATION = S * B * H * 2  # [s, b, h] fp16


def graph(stack: str, extra: str = "", **settings):
    defaults = {"world_size": 32, **get_stack(stack).config, **settings}
    return build_graph(config_from_argv(f"{JOB} {extra}", defaults), HW, 8)


@pytest.mark.parametrize("stack", ["megatron-lm-2021", "megatron-deepspeed-2023", "gpt-neox"])
def test_megatron_lm_2021_and_deepspeeds_pipeline_send_a_share_per_rank_and_gather_it_inside_the_node(stack):
    g = graph(stack)
    send, gather = g.specs[g.p2p], g.specs[g.p2p_gather]
    assert send["primitive"] == "send_recv" and send["bytes"] == ACTIVATION / 8
    assert send["nodes"] == 2  # tp 8 fills a node: the next stage is on the next node
    # all_gather's `bytes` is each rank's input share (predictor.costs.features): 1/8 each, 8 ranks, one node
    assert gather["primitive"] == "all_gather" and gather["bytes"] == ACTIVATION / 8
    assert gather["group_size"] == 8 and gather["nodes"] == 1


@pytest.mark.parametrize("stack, extra, settings, sent", [
    ("megatron-core", "", {}, ACTIVATION),  # Megatron-core has no scatter/gather
    ("megatron-bridge", "", {}, ACTIVATION),
    # sequence parallelism: the activation is already split over tp; Megatron skips the scatter/gather
    ("megatron-lm-2021", "--sequence-parallel", {}, ACTIVATION / 8),
    # a 2021 log's arguments block printing it off (--no-scatter-gather-tensors-in-pipeline)
    ("megatron-lm-2021", "", {"scatter_gather_tensors_in_pipeline": False}, ACTIVATION),
])
def test_the_whole_activation_goes_where_there_is_no_scatter_gather(stack, extra, settings, sent):
    g = graph(stack, extra, **settings)
    assert g.p2p_gather is None and g.specs[g.p2p]["bytes"] == sent


def test_no_gather_without_tensor_or_pipeline_parallelism():
    no_tp = graph("megatron-lm-2021", "--tensor-model-parallel-size 1")
    assert no_tp.p2p_gather is None and no_tp.specs[no_tp.p2p]["bytes"] == ACTIVATION
    no_pp = graph("megatron-lm-2021", "--pipeline-model-parallel-size 1")
    assert no_pp.p2p is None and no_pp.p2p_gather is None


def test_the_hand_over_between_nodes_is_shorter_with_the_shares():
    """1/8 of the bytes on the inter-node link plus an all-gather over NVLink inside the node take less than the
    whole activation on the inter-node link (Selene: one 25 GB/s HDR port per GPU, 600 GB/s NVLink)."""
    models = ModelSet.load()
    shared, whole = (graph("megatron-lm-2021", **s) for s in ({}, {"scatter_gather_tensors_in_pipeline": False}))
    (g1, e1, *_), (g2, e2, *_) = prepare_many([shared.config, whole.config], preset("selene"), models)
    assert hand_over_us(g1, e1.duration_us) < 0.5 * hand_over_us(g2, e2.duration_us)
    # the hand-over is the transfer and the gather, each priced as its own collective
    assert hand_over_us(g1, e1.duration_us) == pytest.approx(
        float(e1.duration_us[g1.p2p]) + float(e1.duration_us[g1.p2p_gather]))
