"""Operator graph vs Megatron facts computed independently (Megatron-LM papers' FLOP and parameter formulas)."""
from __future__ import annotations

import pytest

from extractors.jobs.megatron import config_from_argv
from predictor.architecture.flops import model_flops_per_iteration
from predictor.assembly.graph import build_graph
from predictor.ir.placement import placements
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError


def gpt(**kw) -> TrainingConfig:
    base = dict(num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024, micro_batch_size=2,
                precision="fp16")
    base.update(kw)
    return TrainingConfig(**base)


def names(ops, graph, **match):
    return [o for o in ops if all(graph.specs[o.spec].get(k) == v for k, v in match.items())]


def layer_ops(seg):
    return [o for o in seg.fwd if o.per_layer], [o for o in seg.bwd if o.per_layer]


def test_forward_flops_match_megatron_formula():
    # Narayanan et al. 2021: one layer's forward = 24·b·s·h² + 4·b·s²·h, LM head 2·b·s·h·V
    c = gpt(tensor_model_parallel_size=2, attention="unfused")
    g = build_graph(c, "A100-SXM4-80GB", 8)
    seg = g.segments[0]
    b, s, h, v = 2, 1024, 1024, c.padded_vocab_size
    per_layer_rank = sum(o.flops for o in seg.fwd if o.per_layer)  # one layer on one of the 2 TP ranks
    assert per_layer_rank * 2 == pytest.approx(24 * b * s * h * h + 4 * b * s * s * h)
    assert all(o.count == 8 for o in seg.fwd if o.per_layer)
    head = sum(o.flops for o in seg.fwd if not o.per_layer)
    assert head * 2 == pytest.approx(2 * b * s * h * v)
    # backward does twice the forward's matrix work (dgrad + wgrad)
    assert sum(o.flops for o in seg.bwd if o.per_layer) == pytest.approx(2 * per_layer_rank)


def test_model_flops_formula():
    c = gpt(num_layers=24, hidden_size=2048, num_attention_heads=16, global_batch_size=16)
    B, s, L, h, V = 16, 1024, 24, 2048, c.padded_vocab_size
    expected = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    assert model_flops_per_iteration(c) == pytest.approx(expected)


def test_tensor_parallel_collectives_per_layer():
    g = build_graph(gpt(tensor_model_parallel_size=4), "A100-SXM4-80GB", 8)
    fwd, bwd = layer_ops(g.segments[0])
    assert len(names(fwd, g, primitive="all_reduce")) == 2  # after out-proj and FC2
    assert len(names(bwd, g, primitive="all_reduce")) == 2  # QKV and FC1 input gradients
    sp = build_graph(gpt(tensor_model_parallel_size=4, sequence_parallel=True), "A100-SXM4-80GB", 8)
    fwd, bwd = layer_ops(sp.segments[0])
    assert len(names(fwd, sp, primitive="all_gather")) == 2 and len(names(fwd, sp, primitive="reduce_scatter")) == 2
    assert not names(fwd + bwd, sp, primitive="all_reduce")
    # backward: each column-parallel input re-gathered + its gradient reduce-scattered; row-parallel grads gathered
    assert len(names(bwd, sp, primitive="all_gather")) == 4 and len(names(bwd, sp, primitive="reduce_scatter")) == 2
    # SP shards the message: all-gather input = [s/t, b, h] in fp16
    ag = names(fwd, sp, primitive="all_gather")[0]
    assert sp.specs[ag.spec]["bytes"] == 1024 // 4 * 2 * 1024 * 2
    solo = build_graph(gpt(), "A100-SXM4-80GB", 8)  # tp = 1: no collectives at all
    assert not [o for seg in solo.segments for o in seg.fwd + seg.bwd if o.group]


def test_gemm_shapes_gqa_swiglu():
    c = gpt(num_attention_heads=32, num_query_groups=8, swiglu=True, tensor_model_parallel_size=2,
            hidden_size=4096, position_embedding_type="rope", normalization="RMSNorm")
    g = build_graph(c, "H100-80GB-HBM3", 8)
    fwd, _ = layer_ops(g.segments[0])
    spec = {g.specs[o.spec]["variant"]: g.specs[o.spec] for o in fwd}
    d, t = 128, 2
    assert spec["linear1"]["n"] == (32 + 2 * 8) * d / t and spec["linear1"]["k"] == 4096
    ffn = int(8 * 4096 / 3 / 64) * 64  # Megatron's SwiGLU default
    assert spec["linear3"]["n"] == 2 * ffn / t and spec["linear4"]["k"] == ffn / t
    assert spec["linear1"]["m"] == 1024 * 2  # l·b
    assert "RoPE" in spec and "RMSlayernorm" in spec and "layernorm" not in spec
    assert spec["flash_atten"]["kv_heads"] == 8 / t and spec["flash_atten"]["heads"] == 32 / t


def test_unfused_attention_and_recompute():
    g = build_graph(gpt(attention="unfused", recompute_granularity="full"), "A100-SXM4-80GB", 8)
    fwd, bwd = layer_ops(g.segments[0])
    variants = [g.specs[o.spec]["variant"] for o in fwd]
    assert variants.index("baddbmm") < variants.index("ScaledUpperTriangMaskedSoftmax") < variants.index("bmm")
    assert "flash_atten" not in variants
    replayed = [o for o in bwd if o.recompute]
    assert [o.spec for o in replayed] == [o.spec for o in fwd]  # full recompute replays the whole layer forward
    sel = build_graph(gpt(recompute_granularity="selective"), "A100-SXM4-80GB", 8)
    replayed = [sel.specs[o.spec]["variant"] for o in layer_ops(sel.segments[0])[1] if o.recompute]
    assert replayed == ["flash_atten"]
    none = build_graph(gpt(), "A100-SXM4-80GB", 8)
    assert not any(o.recompute for o in none.segments[0].bwd)


def test_parameter_count_gpt_345m():
    # GPT-2 medium / Megatron 345M: 12·L·h² + 13·L·h + V·h + s·h + 2h (tied embeddings)
    c = gpt(num_layers=24, hidden_size=1024, num_attention_heads=16)
    L, h, s, V = 24, 1024, 1024, 50304
    g = build_graph(c, "A100-SXM4-80GB", 8)
    assert sum(seg.params for seg in g.segments) == 12 * L * h * h + 13 * L * h + V * h + s * h + 2 * h


def test_pipeline_segments_and_virtual_stages():
    c = gpt(num_layers=16, pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2,
            global_batch_size=16)
    g = build_graph(c, "A100-SXM4-80GB", 8)
    assert len(g.segments) == 8 and all(seg.layers == 2 for seg in g.segments)
    assert [seg.first for seg in g.segments].count(True) == 1 and g.segment(0, 0).first
    assert g.segment(3, 1).last and not g.segment(3, 0).last
    assert g.p2p is not None and g.specs[g.p2p]["bytes"] == 1024 * 2 * 1024 * 2
    emb = [g.specs[o.spec]["variant"] for o in g.grad_sync[0] if o.group == "embd"]
    assert emb == ["allreduce"]  # tied word embeddings are synchronised between first and last stage


def test_placement_megatron_rank_order():
    groups = placements(tp=8, cp=1, dp=2, pp=1, gpus_per_node=4)
    assert groups["tp"].nodes == 2 and groups["tp"].ranks_per_node == 4  # tp=8 on 4-GPU nodes crosses nodes
    groups = placements(tp=2, cp=1, dp=2, pp=4, gpus_per_node=4)
    assert groups["tp"].nodes == 1 and groups["dp"].nodes == 1  # tp·dp = 4 ranks fill one node
    assert groups["p2p"].nodes == 2 and groups["pp"].nodes == 4  # every pipeline hop changes node
    groups = placements(tp=4, cp=1, dp=4, pp=1, gpus_per_node=8)
    assert groups["dp"].nodes == 2 and groups["dp"].ranks_per_node == 2


@pytest.mark.parametrize("kw, message", [
    (dict(num_attention_heads=8, tensor_model_parallel_size=16, num_layers=8), "not divisible by tp"),
    (dict(num_layers=10, pipeline_model_parallel_size=4), "num_layers"),
    (dict(global_batch_size=10, micro_batch_size=4), "global_batch_size"),
    (dict(world_size=16, data_parallel_size=1), "world size"),
])
def test_invalid_configs(kw, message):
    with pytest.raises(ConfigError, match=message):
        build_graph(gpt(**kw), "A100-SXM4-80GB", 8)


def test_memory_follows_korthikanti_and_mixed_precision_adam():
    from predictor.memory.stages import memory_per_gpu

    c = gpt(num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=1024, micro_batch_size=1,
            attention="unfused")
    g = build_graph(c, "A100-SXM4-80GB", 8)
    mem, warnings = memory_per_gpu(g)
    s, b, h, a, L, V = 1024, 1, 1024, 16, 4, 50304
    params = 12 * L * h * h + 13 * L * h + V * h + s * h + 2 * h
    assert mem["weights"] == pytest.approx(params * 2 / 1e9)  # fp16 weights
    assert mem["optimizer_state"] == pytest.approx(params * 12 / 1e9)  # fp32 master + Adam m, v
    # Korthikanti et al. 2022, no parallelism: s·b·h·(34 + 5·a·s/h) bytes per layer (dropout 0.1); plus the loss's
    # s·b·V·6: Megatron's cross entropy holds the bf16 logits beside their fp32 copy (its backward: the fp32 softmax
    # beside the bf16 gradient)
    acts = L * s * b * h * (34 + 5 * a * s / h) + s * b * V * 6
    assert mem["activations"] == pytest.approx(acts / 1e9)
    assert not warnings
    full = memory_per_gpu(build_graph(gpt(num_layers=4, recompute_granularity="full", micro_batch_size=1,
                                          attention="unfused"), "A100-SXM4-80GB", 8))[0]
    # full recompute keeps each layer's input (2·s·b·h bytes) plus one layer's working set
    assert full["activations"] == pytest.approx((L * 2 * s * b * h + s * b * h * (34 + 5 * a * s / h)
                                                 + s * b * V * 6) / 1e9)


def test_cpu_offloading_keeps_the_offloaded_layers_activations_on_the_host():
    from predictor.memory.stages import config_memory

    c = gpt(num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=1024, micro_batch_size=1,
            attention="unfused")
    s, b, h, a, L, V = 1024, 1, 1024, 16, 4, 50304
    layer = s * b * h * (34 + 5 * a * s / h)  # Korthikanti, one layer
    for n in (1, 3):
        off = config_memory(TrainingConfig.from_mapping({**c.to_dict(), "cpu_offloading_num_layers": n},
                                                        strict=False), "A100-SXM4-80GB")[0]
        # the first n layers' activations on the host, one of them on its way in or out on the GPU
        assert off["activations"] == pytest.approx(((L - n) * layer + layer + s * b * V * 6) / 1e9)


def test_core_attention_is_one_host_operator_fused_or_not():
    """Megatron's unfused DotProductAttention issues baddbmm, masked softmax, dropout and bmm from one module call
    (their gradients from one autograd pass): the layer pays one host operator for core attention either way, and
    Megatron-core's local layer spec (`--transformer-impl local`) is the unfused one."""
    launched = {}
    for attention in ("flash", "unfused"):
        g = build_graph(gpt(attention=attention), "A100-SXM4-80GB", 8)
        fwd, bwd = layer_ops(g.segments[0])
        launched[attention] = [sum(o.launch for o in ops if "core_attention" in o.name) for ops in (fwd, bwd)]
        kernels = [sum(1 for o in ops if "core_attention" in o.name) for ops in (fwd, bwd)]
        assert kernels[0] == (1 if attention == "flash" else 4)  # baddbmm, softmax, dropout (p 0.1), bmm
    assert launched == {"flash": [1, 1], "unfused": [1, 1]}
    args = "--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --micro-batch-size 1"
    local = config_from_argv(args + " --global-batch-size 8 --transformer-impl local")
    te = config_from_argv(args + " --global-batch-size 8")
    assert (local.attention, te.attention) == ("unfused", "flash")
