"""The attention block of one decoder layer as Megatron-core runs it, as a list of `Pair`s (predictor.ir.ops).

Multi-head / grouped-query attention (Transformer Engine spec): norm → [SP all-gather] → QKV GEMM (heads + 2 · query
groups head slices per TP rank; the local implementation adds its bias with a kernel of its own) → [q/k layernorm] →
RoPE → [CP ring exchanges] → core attention (flash/fused kernel, or unfused: baddbmm, the masked softmax, dropout, bmm
as predictor.layers.local_kernels has them — the local implementation's DotProductAttention whatever --use-flash-attn
says) → output projection → all-reduce (reduce-scatter with SP) → bias-dropout-add. Multi-latent attention
(tracekit.core.attention) replaces the QKV GEMM with its down projections (replicated over TP, on the gathered
sequence), their norms and the up projections (split over TP), and runs attention with query/key head dim qk + rope dims
and value head dim v. A sliding window bounds the keys each query reads: `seq_kv` = the keys the fused kernel's tiles
cover around the band (predictor.layers.attention.tiles), not causal (the unfused path computes every score and masks
the rest). Backward mirrors forward. Ring attention with CP exchanges K/V blocks cp − 1 times forward and twice that
backward (dK/dV too).
"""
from __future__ import annotations

from predictor.ir.ops import OpBuilder, Pair
from predictor.layers.attention.tiles import window_keys
from predictor.layers.local_kernels import core_attention, linear_bias
from predictor.layers.mlp.bias_dropout_add import bias_add
from predictor.layers.norm_rope import norm, rope_ops
from tracekit.core.attention import AttentionSettings


def attention_block(b: OpBuilder, window: int | None, lowp: bool) -> list[Pair]:
    """The attention half of a decoder layer; `window`: keys per query of a sliding-window layer (None: full);
    `lowp`: the precision recipe applies to its linear layers."""
    c, t, h = b.c, b.t, b.h
    a_t = c.num_attention_heads // t
    rows = b.tokens
    pairs: list[Pair] = []
    fwd, bwd = norm(b, "input_layernorm")
    pairs.append((fwd, bwd, "layernorm"))
    pairs.extend(b.tp_in("self_attention.linear_qkv", "attention"))
    mla = c.attn if c.attn is not None and c.attn.multi_latent_attention else None
    if mla is not None:
        pairs.extend(_mla_projections(b, mla, lowp))
        qk_dim, v_dim = mla.q_head_dim, mla.v_head_dim
        kv_t = a_t
        rope_dim = mla.qk_pos_emb_head_dim
    else:
        d = c.head_dim
        g_t = c.num_query_groups // t
        pairs.extend(b.linear("self_attention.linear_qkv", "linear1", rows, (a_t + 2 * g_t) * d, h, "attention", lowp,
                              bias=c.qkv_bias))
        pairs.extend(linear_bias(b, "self_attention.linear_qkv", rows, (a_t + 2 * g_t) * d, "attention",  # local
                                 bias=c.qkv_bias))
        if c.attn is not None and c.attn.qk_layernorm:
            for name, heads in (("q_layernorm", a_t), ("k_layernorm", g_t)):
                fwd, bwd = norm(b, f"self_attention.{name}", rows=rows * heads, width=d)
                pairs.append((fwd, bwd, "attention"))
        qk_dim = v_dim = d
        kv_t = g_t
        rope_dim = d
    if c.rotary_positions:
        pairs.extend(rope_ops(b, rows, a_t, 1 if mla is not None else kv_t, rope_dim))
    s, cp, mb = b.s, c.cp, b.b
    if cp > 1:  # ring attention: (cp−1) K/V block exchanges forward, twice that backward (dK/dV too)
        kv = rows * kv_t * (qk_dim + v_dim) * b.bytes
        for step in range(cp - 1):
            pairs.append((b.collective(f"self_attention.cp_kv.{step}", "send_recv", "cp", kv),
                          b.collective(f"self_attention.cp_dkv.{step}", "send_recv", "cp", 2 * kv), "attention"))
    # a window layer's kernel computes whole key tiles around the band (predictor.layers.attention.tiles)
    seq_kv = s * cp if window is None else min(window_keys(s * cp, window), s * cp)
    causal = 1 if window is None else 0
    head_dim = (qk_dim + v_dim) / 2  # scores use qk_dim, context v_dim: the kernel's work is their mean × 2
    attn_flops = 4.0 * mb * a_t * s * seq_kv * head_dim
    attn_dtype = "fp8" if c.attn is not None and c.attn.fp8_dot_product_attention and lowp else None
    if c.attention == "flash":
        fwd, bwd = b.compute("self_attention.core_attention", "attention", "flash_atten", attn_flops, True,
                             dtype=attn_dtype, batch=mb, heads=a_t, kv_heads=kv_t, seq=s, seq_kv=seq_kv,
                             head_dim=head_dim, causal=causal)
        pairs.append((fwd, bwd, "core_attn"))
    else:  # the unfused path computes every score of the sequence and masks the window's outside
        pairs.extend(core_attention(b, a_t, kv_t, s, s * cp, qk_dim, v_dim, causal))  # predictor.layers.local_kernels
    pairs.extend(b.linear("self_attention.linear_proj", "linear2", rows, h, a_t * v_dim, "attention", lowp))
    pairs.extend(b.tp_out("self_attention.linear_proj", "attention"))
    # unfused bias-dropout-add (predictor.layers.mlp.bias_dropout_add)
    pairs.extend(bias_add(b, "self_attention", "attention"))
    fwd, bwd = b.residual("self_attention.bias_dropout_add")
    pairs.append((fwd, bwd, "attention"))
    return pairs


def _mla_projections(b: OpBuilder, a: AttentionSettings, lowp: bool) -> list[Pair]:
    """MLA's query and key/value projections (tracekit.core.attention): down projections on every TP rank over the
    whole gathered sequence, their norms, up projections split over TP (module `mla_up_proj`)."""
    c, h, rows = b.c, b.h, b.tokens
    a_t = c.num_attention_heads // b.t
    pairs: list[Pair] = []
    if a.q_lora_rank:
        pairs.extend(b.linear("self_attention.linear_q_down_proj", "linear_q_down", rows, a.q_lora_rank, h,
                              "attention", lowp, bias=False))
        fwd, bwd = norm(b, "self_attention.q_layernorm", rows=rows, width=a.q_lora_rank)
        pairs.append((fwd, bwd, "attention"))
        pairs.extend(b.linear("self_attention.linear_q_up_proj", "linear_q_up", rows, a_t * a.q_head_dim,
                              a.q_lora_rank, "mla_up_proj", lowp, bias=False))
    else:
        pairs.extend(b.linear("self_attention.linear_q_proj", "linear_q", rows, a_t * a.q_head_dim, h, "attention",
                              lowp, bias=False))
    pairs.extend(b.linear("self_attention.linear_kv_down_proj", "linear_kv_down", rows,
                          a.kv_lora_rank + a.qk_pos_emb_head_dim, h, "attention", lowp, bias=False))
    fwd, bwd = norm(b, "self_attention.kv_layernorm", rows=rows, width=a.kv_lora_rank)
    pairs.append((fwd, bwd, "attention"))
    pairs.extend(b.linear("self_attention.linear_kv_up_proj", "linear_kv_up", rows,
                          a_t * (a.qk_head_dim + a.v_head_dim), a.kv_lora_rank, "mla_up_proj", lowp, bias=False))
    return pairs
