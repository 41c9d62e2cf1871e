"""Every layer kind answers the questions of `predictor.layers.block.Block` consistently: its parameters, FLOPs,
Muon's matrices and its parameter tensors describe the same weights, and a layer's answers are its blocks' sums.
Checked on dense, GQA, MLA, MoE (with shared experts), latent MoE and SwiGLU layers, and on the hybrid models'
kinds — Mamba2, Gated DeltaNet (in a pattern and as a GPT model's linear attention), DSA (with its indexer and
reusing an earlier layer's top-k), MLA as `+`, attention, MLP and MoE layers alone — at tp = ep = 1, where one GPU
holds whole matrices."""
from __future__ import annotations

from typing import Any

import pytest

from predictor.architecture.flops import layer_flops_per_token
from predictor.architecture.params import layer_params
from predictor.layers import dsa
from predictor.layers.block import Block, norm_params
from predictor.layers.decoder import blocks_named, kind_name, layer_blocks, mtp_layer
from predictor.layers.ssm import gated_delta_net as gdn, mamba
from predictor.layers.ssm.scan_work import conv_work, gdn_work
from tracekit.core.config import TrainingConfig

BASE = dict(num_layers=2, hidden_size=1024, num_attention_heads=16, seq_length=2048, add_bias_linear=False,
            normalization="RMSNorm")
CONFIGS: dict[str, dict[str, Any]] = {
    "dense": {},
    "gqa-swiglu": dict(num_query_groups=4, swiglu=True),
    "mla": dict(multi_latent_attention=True, q_lora_rank=384, kv_lora_rank=256, qk_head_dim=64,
                qk_pos_emb_head_dim=32, v_head_dim=64),
    "moe": dict(num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=512, swiglu=True,
                moe_shared_expert_intermediate_size=1024),
    "latent-moe": dict(num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=512, moe_latent_size=256,
                       squared_relu=True),
    # hybrid patterns: one block a layer (the MTP depth after `/`: its pattern's blocks)
    "mamba": dict(hybrid_layer_pattern="M*M-ME/M-", mamba_num_heads=32, mamba_head_dim=64, mamba_state_dim=64,
                  mamba_num_groups=4, num_query_groups=4, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=512,
                  moe_shared_expert_intermediate_size=1024, position_embedding_type="rope"),
    "mamba-layernorm": dict(hybrid_layer_pattern="M-M*", mamba_num_heads=16, normalization="LayerNorm"),
    "gdn": dict(hybrid_layer_pattern="G-G*GE", linear_num_key_heads=4, linear_num_value_heads=8,
                linear_key_head_dim=64, linear_value_head_dim=64, num_experts=8, moe_router_topk=2),
    "gdn2": dict(hybrid_layer_pattern="G-G-", experimental_attention_variant="gdn2", linear_num_key_heads=4,
                 linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=64),
    "gpt-gdn": dict(num_layers=4, experimental_attention_variant="gdn", linear_attention_freq=2,
                    linear_num_key_heads=4, linear_num_value_heads=8),
    "dsa": dict(hybrid_layer_pattern="DDDDE-", q_lora_rank=384, kv_lora_rank=256, qk_head_dim=64,
                qk_pos_emb_head_dim=32, v_head_dim=64, dsa_indexer_n_heads=8, dsa_indexer_head_dim=64,
                dsa_indexer_topk=512, dsa_indexer_topk_freq=2, dsa_kernel_backend="tilelang", num_experts=8,
                moe_router_topk=2),
    "dsa-torch": dict(hybrid_layer_pattern="D-D-", q_lora_rank=384, kv_lora_rank=256, qk_head_dim=64,
                      qk_pos_emb_head_dim=32, v_head_dim=64, dsa_indexer_n_heads=8, dsa_indexer_head_dim=64,
                      dsa_indexer_topk=512, dsa_indexer_loss_coeff=0.01),
    "mla-pattern": dict(hybrid_layer_pattern="+-+E", q_lora_rank=384, kv_lora_rank=256, qk_head_dim=64,
                        qk_pos_emb_head_dim=32, v_head_dim=64, num_experts=8, moe_router_topk=2),
}
#: Parameters of the SSM layers that are neither a linear layer's weight nor a norm's, listed from Megatron's
#: modules (MambaMixer: conv1d weight and bias, dt_bias, A_log, D; _GDNBase: conv1d weight without bias, dt_bias,
#: A_log), as element counts of one layer at tp 1.
def _ssm_non_matrix(c: TrainingConfig, block: Block) -> int:
    if block.name == "mamba":
        m = mamba.shape_of(c)
        return m.conv_dim * m.d_conv + m.conv_dim + 3 * m.heads
    if block.name == "gdn":
        g = gdn.shape_of(c)
        gates = 2 * g.value_heads if g.variant == "gdn" else g.qk_dim + g.key_heads
        return g.conv_dim * g.conv_kernel + gates
    return 0


def _config(name: str) -> TrainingConfig:
    return TrainingConfig.from_mapping({**BASE, **CONFIGS[name]}).validate()


def _norms(c: TrainingConfig, block: Block) -> int:
    """Norm parameters of a block: each of its norms over its width (the hidden size, or MLA's compressed ranks and
    a head with qk_layernorm; a Mamba layer's gated RMSNorm over d_inner, a GDN layer's output norm over a value
    head; the DSA indexer's LayerNorm over its head dim)."""
    a = c.attn
    if block.name in ("attention", "mla") and a is not None and a.multi_latent_attention:
        return norm_params(c, c.hidden_size) + norm_params(c, a.q_lora_rank or 0) + norm_params(c, a.kv_lora_rank)
    if block.name.startswith("dsa"):
        assert a is not None and c.hybrid is not None
        indexer = 2 * (c.hybrid.dsa_indexer_head_dim or 0) if block.name == "dsa" else 0  # LayerNorm: weight, bias
        return norm_params(c, c.hidden_size) + norm_params(c, a.q_lora_rank or 0) + norm_params(c, a.kv_lora_rank) \
            + indexer
    if block.name == "mamba":
        return norm_params(c, c.hidden_size) + mamba.shape_of(c).d_inner
    if block.name == "gdn":
        return norm_params(c, c.hidden_size) + norm_params(c, gdn.shape_of(c).value_dim)
    return norm_params(c, c.hidden_size)


def _layers(c: TrainingConfig) -> list[int]:
    """Every decoder layer, and an MTP depth's where the model has one."""
    return list(range(c.num_layers)) + ([mtp_layer(c)] if c.layout is not None and c.layout.mtp_num_layers else [])


@pytest.mark.parametrize("name", CONFIGS)
def test_matrices_hold_every_parameter_but_the_norms_and_count_the_linear_tensors(name):
    c = _config(name)
    for layer in _layers(c):
        for block in layer_blocks(c, layer):
            dense, expert = block.matrices(c, split_qkv=False)
            held_dense, held_expert = block.params(c)
            assert sum(r * k for r, k in dense) == held_dense - _norms(c, block) - _ssm_non_matrix(c, block), \
                block.name
            assert sum(r * k for r, k in expert) == held_expert, block.name
            assert block.tensors(c).linears == len(dense) + len(expert), block.name


@pytest.mark.parametrize("name", ["mamba", "mamba-layernorm", "gdn", "gdn2"])
def test_the_ssm_layers_tensors_are_the_ones_megatrons_modules_register(name):
    """Tensors (weights, biases, norms and the rest) against the parameter list of part 1, written from MambaMixer's
    and _GDNBase's code: every tensor counted once, the norm's bias only with LayerNorm."""
    c = _config(name)
    per_norm = 1 if c.normalization == "RMSNorm" else 2
    for layer in range(c.num_layers):
        for block in layer_blocks(c, layer):
            if block.name not in ("mamba", "gdn"):
                continue
            held = block.tensors(c)
            count = held.linears + held.biased * c.add_bias_linear + held.norms * per_norm + held.other
            module = mamba if block.name == "mamba" else gdn
            tensors = module.param_tensors(module.shape_of(c), c.tp, c.normalization)
            assert count == len(tensors)
            assert sum(_numel(dims) for _, dims in tensors) == sum(block.params(c))


@pytest.mark.parametrize("name", CONFIGS)
def test_forward_flops_are_two_per_weight_a_token_touches_plus_the_scores(name):
    """Without scores (an MLP, an MoE) a token's forward is 2 FLOPs per weight it multiplies: the router, its top-k
    experts and the shared experts of an MoE layer; attention adds its scores, which causal masking halves."""
    c = _config(name)
    for layer in _layers(c):
        for block in layer_blocks(c, layer):
            dense, expert = block.matrices(c, split_qkv=False)
            flops = block.flops_per_token(c, layer, causal=False)
            if block.name in ("attention", "mla"):
                half = block.flops_per_token(c, layer, causal=True)
                scores = 2.0 * (flops - half)  # the causal half removed is half the scores
                assert scores > 0
                assert flops - scores == pytest.approx(2.0 * sum(r * k for r, k in dense))
            elif block.name == "moe":
                moe = c.moe
                assert moe is not None
                per_expert = sum(r * k for r, k in expert) / moe.num_experts  # ep 1: every expert is local
                assert flops == pytest.approx(2.0 * (sum(r * k for r, k in dense) + moe.moe_router_topk * per_expert))
            elif block.name == "mamba":  # the convolution and the scan beside the projections
                m = mamba.shape_of(c)
                scan = mamba.scan_flops(m, 1, c.seq_length) / c.seq_length
                conv = conv_work(1, m.conv_dim, m.d_conv)[0]
                assert scan > 0 and flops == pytest.approx(2.0 * sum(r * k for r, k in dense) + conv + scan)
            elif block.name == "gdn":  # the convolution and the chunked delta rule
                g = gdn.shape_of(c)
                rule = gdn_work(1, c.seq_length, g.value_heads, g.key_dim, g.value_dim, g.chunk)[0] / c.seq_length
                conv = conv_work(1, g.conv_dim, g.conv_kernel)[0]
                assert flops == pytest.approx(2.0 * sum(r * k for r, k in dense) + conv + rule)
            elif block.name.startswith("dsa"):  # core attention over the selected keys and the indexer's scores
                a, shape = dsa.settings_of(c)
                n, latent = c.num_attention_heads, a.kv_lora_rank + a.qk_pos_emb_head_dim
                fused = shape.kernel_backend != "none"
                keys = dsa.mean_keys(c.seq_length, shape.topk) if fused else c.seq_length
                core = dsa.sparse_attention_work(1, 1, keys, n, latent, a.kv_lora_rank)[0]
                extra = 0.0
                if block.name == "dsa":
                    extra = dsa.index_scores_work(1, 1, c.seq_length, shape.heads, shape.head_dim, fused)[0]
                    extra += 2.0 * n * c.seq_length * latent if shape.loss_coeff > 0 else 0.0
                assert flops == pytest.approx(2.0 * sum(r * k for r, k in dense) + core + extra)
            else:
                assert flops == pytest.approx(2.0 * sum(r * k for r, k in dense))


@pytest.mark.parametrize("name", CONFIGS)
def test_a_layer_is_the_sum_of_its_blocks(name):
    c = _config(name)
    for layer in _layers(c):
        blocks = layer_blocks(c, layer)
        assert blocks_named(kind_name(blocks)) == blocks
        assert layer_params(c, layer) == tuple(map(sum, zip(*(b.params(c) for b in blocks))))
        assert layer_flops_per_token(c, layer) == sum(b.flops_per_token(c, layer, False) for b in blocks)


def test_a_gpt_layer_is_attention_then_its_mlp_or_moe():
    moe = TrainingConfig.from_mapping({**BASE, **CONFIGS["moe"], "moe_layer_freq": [0, 1]}).validate()
    assert [b.name for b in layer_blocks(moe, 0)] == ["attention", "mlp"]
    assert [b.name for b in layer_blocks(moe, 1)] == ["attention", "moe"]


def test_a_hybrid_layer_is_its_symbols_block_and_an_mtp_depth_its_patterns():
    mamba_model = _config("mamba")
    names = [kind_name(layer_blocks(mamba_model, layer)) for layer in range(mamba_model.num_layers)]
    assert names == ["mamba_layer", "attention_layer", "mamba_layer", "mlp_layer", "mamba_layer", "moe_layer"]
    assert [b.name for b in layer_blocks(mamba_model, mtp_layer(mamba_model))] == ["mamba", "mlp"]
    assert kind_name(layer_blocks(mamba_model, mtp_layer(mamba_model))) == "mamba+mlp"
    # dsa_indexer_topk_freq 2: layers 1 and 3 (Megatron numbers from 1) run their indexer, 2 and 4 reuse its top-k
    shared = _config("dsa")
    assert [b.name for layer in range(shared.num_layers) for b in layer_blocks(shared, layer)] == \
        ["dsa", "dsa_shared_topk", "dsa", "dsa_shared_topk", "moe", "mlp"]
    # a GPT model's linear attention: every second layer stays softmax attention (freq 2)
    gpt = _config("gpt-gdn")
    assert [kind_name(layer_blocks(gpt, layer)) for layer in range(gpt.num_layers)] == \
        ["gdn+mlp", "dense", "gdn+mlp", "dense"]


def _numel(dims: tuple[int, ...]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out
