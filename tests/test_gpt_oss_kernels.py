"""GPT-OSS's attention and expert-parallel schedule as the software runs them (issue #21): a sliding-window layer's
fused kernel computes whole key tiles (predictor.layers.attention.tiles), and the combined 1F1B schedule of
`overlap_moe_expert_parallel_comm` runs its first forward and last backward alone (predictor.schedule.ep_overlap).
Checked against tile geometry worked by hand, the graph's FLOPs and predictions with the bundled models."""
from __future__ import annotations

import pytest

from predictor.assembly.graph import build_graph
from predictor.costs.learned.models import ModelSet
from predictor.layers.attention.tiles import KEY_TILE, window_keys
from predictor.predict import predict
from tracekit.core.cluster import preset
from tracekit.core.config import TrainingConfig

HW = "H100-80GB-HBM3"


def test_a_128_key_window_over_4096_queries_computes_two_key_tiles_per_query_tile():
    # 32 query tiles of 128: the first touches its own key tile, the other 31 their own and the one before
    assert window_keys(4096, 128) == pytest.approx((1 + 31 * 2) / 32 * 128)


@pytest.mark.parametrize("seq", [512, 1000, 4096, 8192])
@pytest.mark.parametrize("window", [1, 64, 128, 200, 1024])
def test_window_keys_lie_between_the_band_and_the_causal_kernel(seq, window):
    keys = window_keys(seq, window)
    exact = sum(min(q + 1, window) for q in range(seq)) / seq  # keys the band itself holds, per query
    tiles = -(-seq // KEY_TILE)
    causal = KEY_TILE * (tiles + 1) / 2  # the causal kernel's mean key tiles per query tile (aligned seq)
    assert keys >= exact
    assert keys <= causal + KEY_TILE  # never more than the causal kernel (up to the ragged last tile)


def test_window_keys_grow_with_the_window_and_reach_the_causal_kernel():
    keys = [window_keys(4096, w) for w in (1, 128, 256, 1024, 4096, 10_000)]
    assert keys == sorted(keys)
    assert keys[-1] == keys[-2] == KEY_TILE * (4096 // KEY_TILE + 1) / 2


def gpt_oss_like(**kw) -> TrainingConfig:
    base = dict(num_layers=4, hidden_size=1024, num_attention_heads=16, kv_channels=64, num_query_groups=4,
                seq_length=4096, micro_batch_size=1, global_batch_size=8, swiglu=True, normalization="RMSNorm",
                position_embedding_type="rope", window_size=128, window_attn_skip_freq=2)
    base.update(kw)
    return TrainingConfig.from_mapping(base)


def attention_flops(graph) -> dict[str, float]:
    out: dict[str, float] = {}
    for op in graph.segments[0].fwd:
        if op.name == "self_attention.core_attention":
            out[op.block] = op.flops
    return out


def test_a_window_layers_attention_work_is_the_tiles_not_more_than_causal_nor_less_than_the_band():
    c = gpt_oss_like()
    flops = attention_flops(build_graph(c, HW))
    window = next(v for k, v in flops.items() if "w128" in k)
    full = next(v for k, v in flops.items() if "w128" not in k)
    per_key = 4.0 * 1 * 16 * 4096 * 64  # 4 · b · heads · seq · head_dim per key of every query
    assert window == pytest.approx(per_key * window_keys(4096, 128))
    assert per_key * 128 < window < full  # more than the band (whole tiles), less than the full layer


def moe_config(**kw) -> TrainingConfig:
    base = dict(num_experts=8, moe_router_topk=2, expert_model_parallel_size=8, world_size=8,
                moe_token_dispatcher_type="alltoall", moe_grouped_gemm=True, global_batch_size=32)
    return gpt_oss_like(**{**base, **kw})


def expert_collectives_s(p) -> float:
    """One iteration's expert-parallel collectives on the critical stage, all of them: M micro-batches' forwards and
    backwards."""
    from predictor.schedule.stage_work import EXPERT_GROUPS

    seg = p.graph.segment(p.critical_stage, 0)
    per_mb = sum(p.durations_us[o.spec] * o.count for o in seg.fwd + seg.bwd if o.group in EXPERT_GROUPS)
    return per_mb * p.config.num_microbatches / 1e6


@pytest.mark.parametrize("batch", [16, 32, 64])
def test_the_overlaps_first_forward_and_last_backward_expose_their_expert_collectives(batch):
    models, cluster = ModelSet.load(), preset("dgx-h100")
    over = predict(moe_config(global_batch_size=batch, overlap_moe_expert_parallel_comm=True), cluster, models)
    plain = predict(moe_config(global_batch_size=batch), cluster, models)
    m = over.config.num_microbatches
    ep = expert_collectives_s(plain)
    assert ep > 0
    rest = plain.breakdown["exposed_communication"] - ep  # without the overlap every EP collective is exposed
    # with it, one forward's and one backward's of the M: 1/M of them (the layers' compute covers the others)
    assert over.breakdown["exposed_communication"] - rest == pytest.approx(ep / m, rel=0.02)
    assert over.iteration_time_s < plain.iteration_time_s


def test_with_pipelining_the_overlap_keeps_hiding_every_pass():
    from predictor.schedule.ep_overlap import alone_share

    assert alone_share(moe_config(pipeline_model_parallel_size=2, overlap_moe_expert_parallel_comm=True)) == 0.0
    assert alone_share(moe_config(overlap_moe_expert_parallel_comm=True)) == pytest.approx(1 / 4)
    assert alone_share(moe_config()) == 0.0


@pytest.mark.parametrize("moe", [False, True])
def test_a_glu_activation_is_sized_as_the_bytes_it_moves(moe):
    """SwiGLU/quick-GEGLU reads both halves of FC1's output: 3 element moves per output element forward (the GELU
    the models learned moves 2), 5 backward (GELU: 3); a plain GELU keeps its own size."""
    extra = dict(num_experts=8, moe_router_topk=2, moe_grouped_gemm=True) if moe else {}
    name = "mlp.experts.activation" if moe else "mlp.activation"
    for swiglu, want in ((True, (3 / 2, 5 / 3)), (False, (1.0, 1.0))):
        g = build_graph(gpt_oss_like(swiglu=swiglu, **extra), HW)
        seg = g.segments[0]
        (fwd,) = {o.spec for o in seg.fwd if o.name == name}
        (bwd,) = {o.spec for o in seg.bwd if o.name == name}
        width = g.specs[fwd]["width"]
        outputs = 1 * 4096 * (2 if moe else 1)  # tokens (× top-k routed copies for the experts)
        assert g.specs[fwd]["numel"] == pytest.approx(outputs * width * want[0])
        assert g.specs[bwd]["numel"] == pytest.approx(outputs * width * want[1])
        assert g.specs[fwd]["numel"] == pytest.approx(g.specs[fwd]["rows"] * width)
