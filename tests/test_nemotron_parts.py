"""Nemotron 3's parts that fit the existing layers: latent MoE (the dispatch and the experts at the latent width),
squared-ReLU experts, and the CUDA graph scopes its recipes use (attn, mamba, moe_router, moe_preprocess)."""
from __future__ import annotations

import pytest

from predictor.architecture.params import layer_params
from predictor.assembly.graph import build_graph
from predictor.ir.ops import OpBuilder
from predictor.layers.ssm import mamba
from predictor.schedule.framework_costs import capture
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError
from tracekit.core.hybrid import HybridSettings
from tracekit.core.runtime import RuntimeSettings

HW = "H100-80GB-HBM3"


def model(**kw) -> TrainingConfig:
    base = dict(num_layers=2, hidden_size=2688, num_attention_heads=32, num_query_groups=2, kv_channels=128,
                seq_length=4096, micro_batch_size=1, global_batch_size=8, world_size=8, position_embedding_type="none",
                normalization="RMSNorm", add_bias_linear=False, num_experts=128, moe_router_topk=6,
                moe_ffn_hidden_size=1856, moe_shared_expert_intermediate_size=3712, expert_model_parallel_size=8,
                moe_token_dispatcher_type="alltoall", moe_grouped_gemm=True, moe_router_force_load_balancing=True)
    base.update(kw)
    return TrainingConfig.from_mapping(base)


def ops_named(graph, prefix: str):
    return [o for o in graph.segments[0].fwd if o.name.startswith(prefix)]


def test_a_latent_moe_dispatches_and_computes_at_the_latent_width():
    plain, latent = build_graph(model(), HW), build_graph(model(moe_latent_size=1024), HW)
    sent = [sum(g.specs[o.spec]["bytes"] for o in ops_named(g, "mlp.token_dispatcher.dispatch")) for g in
            (plain, latent)]
    assert sent[1] == pytest.approx(sent[0] * 1024 / 2688)
    fc1 = [g.specs[ops_named(g, "mlp.experts.linear_fc1")[0].spec] for g in (plain, latent)]
    assert (fc1[0]["k"], fc1[1]["k"]) == (2688, 1024)
    assert fc1[0]["n"] == fc1[1]["n"]  # the experts' width is unchanged
    projections = [o.name for o in ops_named(latent, "mlp.fc")]
    assert projections == ["mlp.fc1_latent_proj", "mlp.fc2_latent_proj"] and not ops_named(plain, "mlp.fc")
    # parameters: the experts' FC1 and FC2 at the latent width, two replicated projections on the dense side
    (d0, e0), (d1, e1) = layer_params(model(), 0), layer_params(model(moe_latent_size=1024), 0)
    assert e1 == pytest.approx(e0 * 1024 / 2688)
    assert d1 - d0 == 2 * 2688 * 1024


def test_latent_moe_settings_megatron_refuses():
    with pytest.raises(ConfigError, match="MoE latent projection dimension has to be greater than zero"):
        model(moe_latent_size=0)
    with pytest.raises(ConfigError, match="Shared expert overlap with MoE latent projections is not supported"):
        model(moe_latent_size=1024, moe_shared_expert_overlap=True).validate()


def test_squared_relu_experts_are_their_own_activation_rows_moving_what_gelu_moves():
    gelu, relu2 = build_graph(model(), HW), build_graph(model(squared_relu=True), HW)
    rows = [g.specs[ops_named(g, "mlp.experts.activation")[0].spec] for g in (gelu, relu2)]
    assert (rows[0]["variant"], rows[1]["variant"]) == ("gelu", "squared_relu")
    assert rows[0]["numel"] == rows[1]["numel"]


def test_the_hybrid_graph_scopes_capture_what_their_modules_name():
    c = model(cuda_graph_impl="transformer_engine",
              cuda_graph_modules=["attn", "mamba", "moe_router", "moe_preprocess"])
    cap = capture(c)
    b = OpBuilder(c, HW, 8)
    shape = HybridSettings(hybrid_layer_pattern="M", mamba_num_heads=64).mamba(2688)
    mamba_ops = [op.placed(1, False, "mamba") for op, _, _ in mamba.ops(b, shape, True) if op is not None]
    assert all(cap.region(op) is not None for op in mamba_ops)
    graph = build_graph(c, HW)
    permute = ops_named(graph, "mlp.token_dispatcher.permute")[0]
    router = ops_named(graph, "mlp.router")[0]
    experts = ops_named(graph, "mlp.experts.linear_fc1")[0]
    assert cap.region(permute) == cap.region(router) is not None
    assert cap.region(experts) is None  # the expert GEMMs' token counts change each step: never captured
    without = capture(model(cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn", "moe_router"]))
    assert without.region(permute) is None
    only_mamba = capture(model(cuda_graph_impl="transformer_engine", cuda_graph_modules=["mamba"]))
    assert only_mamba.region(router) is None and all(only_mamba.region(op) is not None for op in mamba_ops)


def test_graph_scopes_megatron_refuses():
    with pytest.raises(ConfigError, match="moe_preprocess cuda graph is only supported with moe_router"):
        RuntimeSettings(cuda_graph_impl="transformer_engine", cuda_graph_modules=("moe_preprocess",)).validate(
            model())
    with pytest.raises(ConfigError, match="must not contain both moe and moe_router"):
        RuntimeSettings(cuda_graph_impl="local", cuda_graph_modules=("moe", "moe_router")).validate(model())
