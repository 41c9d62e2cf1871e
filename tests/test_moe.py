"""MoE layers, expert parallelism, MLA and pipeline layouts: facts that cannot drift (FLOPs, bytes moved, groups,
monotonicity), checked against the graph, the placement and predictions with the bundled models."""
from __future__ import annotations

import pytest

from predictor.assembly.graph import build_graph
from predictor.ir.placement import placements
from predictor.layers.moe.dispatch import distinct_ranks
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError

HW = "H100-80GB-HBM3"


def model(**kw) -> TrainingConfig:
    base = dict(num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=1024, micro_batch_size=2,
                global_batch_size=16, swiglu=True, position_embedding_type="rope", normalization="RMSNorm",
                add_bias_linear=False)
    base.update(kw)
    return TrainingConfig.from_mapping(base)


def expert_flops(graph, pass_="fwd") -> float:
    seg = graph.segments[0]
    ops = seg.fwd if pass_ == "fwd" else seg.bwd
    return sum(o.flops * o.count for o in ops if o.name.startswith("mlp.experts.linear_fc"))


def dense_mlp_flops(graph) -> float:
    return sum(o.flops * o.count for o in graph.segments[0].fwd if o.name in ("mlp.linear_fc1", "mlp.linear_fc2"))


def test_one_expert_top1_has_the_dense_models_mlp_flops():
    dense = build_graph(model(), HW)
    moe = build_graph(model(num_experts=1, moe_router_topk=1, moe_grouped_gemm=True), HW)
    assert expert_flops(moe) == pytest.approx(dense_mlp_flops(dense))
    assert expert_flops(moe, "bwd") == pytest.approx(2 * dense_mlp_flops(dense))


def test_top2_of_8_has_twice_the_expert_flops_of_top1():
    top1 = build_graph(model(num_experts=8, moe_router_topk=1, moe_grouped_gemm=True), HW)
    top2 = build_graph(model(num_experts=8, moe_router_topk=2, moe_grouped_gemm=True), HW)
    assert expert_flops(top2) == pytest.approx(2 * expert_flops(top1))
    # without grouped GEMMs: one GEMM per local expert, the same work
    seq = build_graph(model(num_experts=8, moe_router_topk=2), HW)
    assert expert_flops(seq) == pytest.approx(expert_flops(top2))


@pytest.mark.parametrize("ep, tp", [(2, 1), (4, 1), (8, 1), (4, 2)])
def test_ep_all_to_all_moves_tokens_topk_hidden_bytes_per_rank(ep, tp):
    """Each rank's dispatch buffer is tokens·k·h·bytes, of which (EP−1)/EP leaves the rank (the collective's
    convention: `bytes` the whole buffer; predictor.costs.features.ring_traffic the bytes on the wire)."""
    import pandas as pd

    from predictor.costs.features import ring_traffic

    c = model(num_experts=8, moe_router_topk=2, expert_model_parallel_size=ep, tensor_model_parallel_size=tp,
              sequence_parallel=tp > 1, moe_token_dispatcher_type="alltoall", world_size=8 * tp)
    g = build_graph(c, HW)
    (spec,) = {o.spec for o in g.segments[0].fwd if o.name == "mlp.token_dispatcher.dispatch"}
    row = g.specs[spec]
    tokens = 1024 * 2 // tp
    assert row["bytes"] == tokens * 2 * 1024 * 2 and row["group_size"] == ep
    wire = ring_traffic(pd.Series(["all_to_all"]).to_numpy(), pd.Series([row["bytes"]]).to_numpy(),
                        pd.Series([ep]).to_numpy())[0]
    assert wire == pytest.approx(tokens * 2 * 1024 * 2 * (ep - 1) / ep)


def test_flex_dispatch_sends_a_token_once_per_rank():
    assert distinct_ranks(8, 8, 1) == pytest.approx(1.0)
    assert distinct_ranks(8, 1, 2) == pytest.approx(1.0)  # every expert on one rank
    assert distinct_ranks(128, 8, 8) < 8 and distinct_ranks(256, 64, 8) < 8 and distinct_ranks(256, 256, 8) == 8


def test_flex_dispatch_across_nodes_sends_a_token_once_per_remote_node():
    """DeepEP/HybridEP across nodes: the network carries a token once per distinct remote node, never more than
    once per remote rank (the per-rank count) nor once per expert (alltoall); within one node nothing changes."""
    from predictor.layers.moe.dispatch import dispatch_tokens, remote_nodes

    # DeepSeek-V3: 256 experts top-8 over EP 32 on 4 nodes of 8
    nodes, r, ep = 4, 8, 32
    u = remote_nodes(256, ep, 8, nodes)
    assert 0 < u < nodes - 1 and u < distinct_ranks(256, ep, 8) * (ep - r) / ep
    assert remote_nodes(256, ep, 8, 1) == 0.0
    assert remote_nodes(8, 8, 8, 2) == pytest.approx(1.0)  # top-k of every expert: the other node always
    net = {d: dispatch_tokens(d, 1.0, 256, ep, 8, nodes, r) * (ep - r) / ep for d in ("alltoall", "deepep")}
    assert net["deepep"] == pytest.approx(u) and net["deepep"] < net["alltoall"]
    assert dispatch_tokens("deepep", 1.0, 256, 8, 8, 1, 8) == pytest.approx(distinct_ranks(256, 8, 8))
    # NCCL's EP backend is not known to forward inside the node: one copy per destination rank
    assert dispatch_tokens("ncclep", 1.0, 256, ep, 8, nodes, r) == pytest.approx(distinct_ranks(256, ep, 8))
    # more nodes for the same EP: more remote nodes hit, never more than k
    assert remote_nodes(256, 64, 8, 8) > u and remote_nodes(256, 256, 8, 32) <= 8


def test_flex_dispatch_across_nodes_is_not_slower_than_alltoall():
    """The same MoE run across 4 DGX H100 nodes: the flex dispatcher's exchanges (a token once per remote node)
    take less time than alltoall's (once per expert) and than counting the token once per remote rank."""
    from predictor.costs.learned.models import ModelSet
    from predictor.layers.moe.dispatch import distinct_ranks as per_rank
    from predictor.predict import predict
    from tracekit.core.cluster import preset

    base = dict(num_experts=64, moe_router_topk=8, expert_model_parallel_size=32, world_size=32,
                moe_grouped_gemm=True, global_batch_size=64)
    models, cluster = ModelSet.load(), preset("dgx-h100")

    def a2a(**kw):
        p = predict(model(**{**base, **kw}), cluster, models)
        return sum(op["time_s"] for op in p.operators if op["primitive"] == "all_to_all"), p.iteration_time_s

    flex, alltoall = a2a(moe_token_dispatcher_type="flex"), a2a(moe_token_dispatcher_type="alltoall")
    assert flex[0] < alltoall[0] and flex[1] <= alltoall[1]
    g = build_graph(model(**base, moe_token_dispatcher_type="flex"), HW)
    (spec,) = {o.spec for o in g.segments[0].fwd if o.name == "mlp.token_dispatcher.dispatch"}
    tokens = 1024 * 2
    assert g.specs[spec]["bytes"] * 24 / 32 < tokens * per_rank(64, 32, 8) * 24 / 32 * 1024 * 2


def test_expert_groups_follow_megatrons_expert_rank_order():
    """Expert order tp-ep-dp-pp: EP ranks are etp apart, expert-DP ranks etp·ep apart (parallel_state)."""
    groups = placements(tp=2, cp=1, dp=8, pp=1, gpus_per_node=8, ep=4, etp=1)
    assert groups["ep"].stride == 1 and groups["ep"].size == 4 and groups["ep"].nodes == 1
    assert groups["edp"].size == 4 and groups["edp"].stride == 4
    wide = placements(tp=1, cp=1, dp=64, pp=1, gpus_per_node=8, ep=64)
    rack = placements(tp=1, cp=1, dp=64, pp=1, gpus_per_node=72, ep=64)
    assert wide["ep"].nodes == 8 and rack["ep"].nodes == 1


def test_dispatch_inside_an_nvl72_rack_is_never_slower_than_across_racks():
    from predictor.costs.learned.models import ModelSet
    from predictor.predict import predict
    from tracekit.core.cluster import preset

    c = model(num_experts=64, moe_router_topk=4, expert_model_parallel_size=64, world_size=64,
              moe_token_dispatcher_type="alltoall", moe_grouped_gemm=True, global_batch_size=128)
    rack = preset("gb200-nvl72")
    trays = preset("gb200-nvl72")
    import dataclasses

    trays = dataclasses.replace(trays, nvlink_domain=None, name="gb200-trays")
    models = ModelSet.load()
    inside, across = predict(c, rack, models), predict(c, trays, models)

    def a2a(p):
        return sum(op["time_s"] for op in p.operators if op["primitive"] == "all_to_all")

    assert a2a(inside) < a2a(across)
    assert inside.iteration_time_s <= across.iteration_time_s


def test_moe_settings_change_the_prediction_in_the_right_direction():
    from predictor.costs.learned.models import ModelSet
    from predictor.predict import predict
    from tracekit.core.cluster import preset

    models = ModelSet.load()
    cluster = preset("dgx-h100")
    base = dict(num_experts=8, moe_router_topk=2, expert_model_parallel_size=8, world_size=8,
                moe_token_dispatcher_type="alltoall", moe_grouped_gemm=True)

    def time(**kw):
        return predict(model(**{**base, **kw}), cluster, models).iteration_time_s

    ref = time()
    assert time(moe_router_topk=4) > ref  # more experts per token
    assert time(moe_imbalance=1.5) > ref  # the busiest rank waits
    # dispatch under the other micro-batch's compute; with one micro-batch its only forward and backward run alone
    assert time(overlap_moe_expert_parallel_comm=True, global_batch_size=64) < time(global_batch_size=64)
    assert time(overlap_moe_expert_parallel_comm=True) == pytest.approx(ref)
    assert time(moe_ffn_hidden_size=4096) > ref
    dense = predict(model(world_size=8), cluster, models).iteration_time_s
    assert dense != ref  # MoE settings are not ignored


def test_moe_layer_freq_and_first_dense_layers():
    c = model(num_experts=8, moe_layer_freq="([0]*1+[1]*3)")
    assert c.moe.pattern(4) == (0, 1, 1, 1)
    g = build_graph(c, HW)
    blocks = {o.block for o in g.segments[0].fwd if o.per_layer}
    assert blocks == {"dense", "moe"}
    with pytest.raises(ConfigError, match="moe_layer_freq gives 3 layers"):
        model(num_experts=8, moe_layer_freq="[1,1,1]").validate()
    with pytest.raises(ConfigError, match="not divisible by expert_model_parallel_size"):
        model(num_experts=6, expert_model_parallel_size=4, world_size=4).validate()
    with pytest.raises(ConfigError, match="requires sequence_parallel"):
        model(num_experts=8, expert_model_parallel_size=2, tensor_model_parallel_size=2, world_size=4).validate()


def test_mla_projections_and_attention_dims():
    c = model(num_attention_heads=16, multi_latent_attention=True, q_lora_rank=512, kv_lora_rank=256,
              qk_head_dim=64, qk_pos_emb_head_dim=32, v_head_dim=64)
    g = build_graph(c, HW)
    specs = {o.name: g.specs[o.spec] for o in g.segments[0].fwd}
    assert specs["self_attention.linear_q_up_proj"]["n"] == 16 * (64 + 32)
    assert specs["self_attention.linear_kv_up_proj"]["n"] == 16 * (64 + 64)
    assert specs["self_attention.linear_kv_down_proj"]["n"] == 256 + 32
    assert specs["self_attention.linear_proj"]["k"] == 16 * 64
    assert specs["self_attention.core_attention"]["head_dim"] == (96 + 64) / 2


def test_uneven_pipeline_layouts_hold_every_layer_once():
    from tracekit.core.pipeline_layout import chunks

    c = model(num_layers=13, pipeline_model_parallel_size=2, pipeline_model_parallel_layout="Et|(tt|)*6mL",
              mtp_num_layers=1, world_size=2, global_batch_size=16)
    parts = chunks(c)
    layers = sorted(layer for row in parts for part in row for layer in part.layers)
    assert layers == list(range(13)) and c.vp == 4
    assert parts[0][0].embedding and parts[1][3].loss and parts[1][3].mtp == 1
    first_last = model(num_layers=10, pipeline_model_parallel_size=4, decoder_first_pipeline_num_layers=1,
                       decoder_last_pipeline_num_layers=3, world_size=4)
    assert [len(p[0].layers) for p in chunks(first_last)] == [1, 3, 3, 3]


def test_layout_settings_change_the_pipeline_they_should():
    """A lighter first stage (fewer layers beside the embedding) moves the busiest stage's work; a layout string
    and the first/last counts that give the same split predict the same time."""
    from predictor.costs.learned.models import ModelSet
    from predictor.predict import predict
    from tracekit.core.cluster import preset

    models, cluster = ModelSet.load(), preset("dgx-h100")
    base = dict(num_layers=8, pipeline_model_parallel_size=2, world_size=2, global_batch_size=16)
    even = predict(model(**base), cluster, models)
    uneven = predict(model(**base, decoder_first_pipeline_num_layers=2), cluster, models)
    same = predict(model(**base, pipeline_model_parallel_layout="Ett|t*6L"), cluster, models)
    assert uneven.iteration_time_s != even.iteration_time_s
    assert same.iteration_time_s == pytest.approx(uneven.iteration_time_s)
    assert [s["chunks"][0]["layers"] for s in uneven.per_stage] == [2, 6]
