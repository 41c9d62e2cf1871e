"""Megatron-core's Muon optimizer as work (predictor.parallel.muon): a Newton–Schulz iteration's FLOPs from the matrix's
shape, worked out by hand; which matrices a stage orthogonalises and how the layer-wise distributed optimizer shares
them; the flags; settings Megatron refuses are refused."""
from __future__ import annotations

import pytest

from predictor.assembly.graph import build_graph
from predictor.parallel.muon import muon_settings, ns_gemms, ns_step_flops, stage_matrices
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError
from tracekit.core.megatron_arguments import flag_classes

H, A, L, F = 512, 8, 4, 2048
BASE = dict(num_layers=L, hidden_size=H, num_attention_heads=A, seq_length=1024, micro_batch_size=4,
            ffn_hidden_size=F, add_bias_linear=False, untie_embeddings_and_output_weights=True)


def _config(**more) -> TrainingConfig:
    return TrainingConfig.from_mapping({**BASE, "optimizer": "muon", **more})


def test_one_newton_schulz_iteration_is_its_three_matmuls():
    # X is 512 × 2048 (an FC1 weight transposed to m ≤ n): X·Xᵀ 2·512·512·2048, A·A 2·512³, B·X 2·512·512·2048
    by_hand = 2 * 512 * 512 * 2048 + 2 * 512 ** 3 + 2 * 512 * 512 * 2048
    assert ns_step_flops(2048, 512) == ns_step_flops(512, 2048) == by_hand
    assert sum(2 * m * n * k for m, n, k in ns_gemms(2048, 512)) == by_hand


def test_a_stage_orthogonalises_every_2d_weight_but_the_embedding_and_output_layer():
    c = _config()
    counts = stage_matrices(c, 0, muon_settings(c))
    # per layer: q, k, v (QKV split) and the output projection (512 × 512), FC1 (2048 × 512), FC2 (512 × 2048)
    assert counts == {(H, H): 4 * L, (F, H): L, (H, F): L}
    graph = build_graph(c, "H100-80GB-HBM3")
    steps = 5  # Megatron's --muon-num-ns-steps default
    flops = sum(o.count * o.flops for o in graph.casts[0] if o.name.startswith("optimizer.muon"))
    assert flops == steps * L * (4 * ns_step_flops(H, H) + 2 * ns_step_flops(F, H))
    three = _config(muon_num_ns_steps=3)
    assert sum(o.count * o.flops for o in build_graph(three, "H100-80GB-HBM3").casts[0]) == flops * 3 / 5


def test_the_layer_wise_distributed_optimizer_shares_the_matrices_over_the_data_parallel_ranks():
    alone = _config(world_size=4)
    shared = _config(world_size=4, use_distributed_optimizer=True)
    whole = stage_matrices(alone, 0, muon_settings(alone))
    share = stage_matrices(shared, 0, muon_settings(shared))
    assert share == {shape: n / 4 for shape, n in whole.items()}
    assert muon_settings(_config(optimizer="dist_muon")).layer_wise


def test_adam_has_no_muon_work_and_what_megatron_refuses_is_refused():
    adam = TrainingConfig.from_mapping(BASE)
    assert muon_settings(adam) is None
    assert not [o for o in build_graph(adam, "H100-80GB-HBM3").casts[0] if o.name.startswith("optimizer.muon")]
    with pytest.raises(ConfigError, match="muon_tp_mode"):
        muon_settings(_config(muon_tp_mode="rowwise"))
    with pytest.raises(ConfigError, match="at least 1"):
        muon_settings(_config(muon_num_ns_steps=0))
    with pytest.raises(ConfigError, match="not modelled"):
        muon_settings(_config(optimizer="soap"))


def test_muon_flags_are_classified():
    classes = flag_classes()
    assert classes["--optimizer"] == classes["--muon-num-ns-steps"] == classes["--muon-tp-mode"] == "modelled"
    assert classes["--muon-momentum"] == "no_effect"
