"""Every layer kind answers the questions of `predictor.layers.block.Block` consistently: its parameters, FLOPs,
Muon's matrices and its parameter tensors describe the same weights, and a layer's answers are its blocks' sums.
Checked on dense, GQA, MLA, MoE (with shared experts), latent MoE and SwiGLU layers at tp = ep = 1, where one GPU
holds whole matrices."""
from __future__ import annotations

import pytest

from predictor.architecture.flops import layer_flops_per_token
from predictor.architecture.params import layer_params
from predictor.layers.block import Block, norm_params
from predictor.layers.decoder import blocks_named, kind_name, layer_blocks
from tracekit.core.config import TrainingConfig

BASE = dict(num_layers=2, hidden_size=1024, num_attention_heads=16, seq_length=2048, add_bias_linear=False,
            normalization="RMSNorm")
CONFIGS = {
    "dense": {},
    "gqa-swiglu": dict(num_query_groups=4, swiglu=True),
    "mla": dict(multi_latent_attention=True, q_lora_rank=384, kv_lora_rank=256, qk_head_dim=64,
                qk_pos_emb_head_dim=32, v_head_dim=64),
    "moe": dict(num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=512, swiglu=True,
                moe_shared_expert_intermediate_size=1024),
    "latent-moe": dict(num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=512, moe_latent_size=256,
                       squared_relu=True),
}


def _config(name: str) -> TrainingConfig:
    return TrainingConfig.from_mapping({**BASE, **CONFIGS[name]}).validate()


def _norms(c: TrainingConfig, block: Block) -> int:
    """Norm parameters of a block: each of its norms over its width (the hidden size, or MLA's compressed ranks and
    a head with qk_layernorm)."""
    a = c.attn
    if block.name == "attention" and a is not None and a.multi_latent_attention:
        return norm_params(c, c.hidden_size) + norm_params(c, a.q_lora_rank) + norm_params(c, a.kv_lora_rank)
    return norm_params(c, c.hidden_size)


@pytest.mark.parametrize("name", CONFIGS)
def test_matrices_hold_every_parameter_but_the_norms_and_count_the_linear_tensors(name):
    c = _config(name)
    for layer in range(c.num_layers):
        for block in layer_blocks(c, layer):
            dense, expert = block.matrices(c, split_qkv=False)
            held_dense, held_expert = block.params(c)
            assert sum(r * k for r, k in dense) == held_dense - _norms(c, block), block.name
            assert sum(r * k for r, k in expert) == held_expert, block.name
            assert block.tensors(c).linears == len(dense) + len(expert), block.name


@pytest.mark.parametrize("name", CONFIGS)
def test_forward_flops_are_two_per_weight_a_token_touches_plus_the_scores(name):
    """Without scores (an MLP, an MoE) a token's forward is 2 FLOPs per weight it multiplies: the router, its top-k
    experts and the shared experts of an MoE layer; attention adds its scores, which causal masking halves."""
    c = _config(name)
    for layer in range(c.num_layers):
        for block in layer_blocks(c, layer):
            dense, expert = block.matrices(c, split_qkv=False)
            flops = block.flops_per_token(c, layer, causal=False)
            if block.name == "attention":
                half = block.flops_per_token(c, layer, causal=True)
                scores = 2.0 * (flops - half)  # the causal half removed is half the scores
                assert scores > 0
                assert flops - scores == pytest.approx(2.0 * sum(r * k for r, k in dense))
            elif block.name == "moe":
                moe = c.moe
                assert moe is not None
                per_expert = sum(r * k for r, k in expert) / moe.num_experts  # ep 1: every expert is local
                assert flops == pytest.approx(2.0 * (sum(r * k for r, k in dense) + moe.moe_router_topk * per_expert))
            else:
                assert flops == pytest.approx(2.0 * sum(r * k for r, k in dense))


@pytest.mark.parametrize("name", CONFIGS)
def test_a_layer_is_the_sum_of_its_blocks(name):
    c = _config(name)
    for layer in range(c.num_layers):
        blocks = layer_blocks(c, layer)
        assert blocks_named(kind_name(blocks)) == blocks
        assert layer_params(c, layer) == tuple(map(sum, zip(*(b.params(c) for b in blocks))))
        assert layer_flops_per_token(c, layer) == sum(b.flops_per_token(c, layer, False) for b in blocks)


def test_a_gpt_layer_is_attention_then_its_mlp_or_moe():
    moe = TrainingConfig.from_mapping({**BASE, **CONFIGS["moe"], "moe_layer_freq": [0, 1]}).validate()
    assert [b.name for b in layer_blocks(moe, 0)] == ["attention", "mlp"]
    assert [b.name for b in layer_blocks(moe, 1)] == ["attention", "moe"]
