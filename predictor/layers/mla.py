"""Multi-latent attention as a hybrid pattern's `+` layer (`mla_layer` of `hybrid_stack_spec`: a TransformerLayer
with a TENorm input norm and `MLASelfAttention`, no MLP), as pure functions of the MLA settings
(`tracekit.core.attention.AttentionSettings`) and the model's sizes. Its operators are the decoder layer's MLA
attention half (`predictor.layers.attention.ops.attention_block` with the configuration's MLA settings); these answer
the other questions for one `+` layer on its own: the parameters, FLOPs per token and saved bytes of MLA, as
`predictor.architecture.params`, `predictor.architecture.flops` and `predictor.memory.stages` count them for a GPT
layer's attention half.
"""
from __future__ import annotations

from predictor.ir.ops import OpBuilder, Pair
from predictor.layers.attention.block import Attention
from predictor.layers.attention.ops import attention_block
from tracekit.core.attention import AttentionSettings


def params(a: AttentionSettings, hidden: int, heads: int, tp: int, normalization: str = "RMSNorm",
           bias: bool = False) -> int:
    """One `+` layer's parameters on one TP rank: the input norm, the down projections (replicated over TP) and
    their norms, the up projections and the output projection (split over TP; its bias with linear biases)."""
    norm = 1 if normalization == "RMSNorm" else 2
    n = heads // tp
    q = (hidden * a.q_lora_rank + norm * a.q_lora_rank + a.q_lora_rank * n * a.q_head_dim) if a.q_lora_rank \
        else hidden * n * a.q_head_dim
    kv = hidden * (a.kv_lora_rank + a.qk_pos_emb_head_dim) + norm * a.kv_lora_rank \
        + a.kv_lora_rank * n * (a.qk_head_dim + a.v_head_dim)
    return q + kv + n * a.v_head_dim * hidden + hidden * bias + norm * hidden


def flops_per_token(a: AttentionSettings, hidden: int, heads: int, seq: int, causal: bool = False) -> float:
    """Forward FLOPs per token (all TP ranks): projections and scores over `seq` keys (half with `causal`)."""
    q = (hidden * a.q_lora_rank + a.q_lora_rank * heads * a.q_head_dim) if a.q_lora_rank \
        else hidden * heads * a.q_head_dim
    kv = hidden * (a.kv_lora_rank + a.qk_pos_emb_head_dim) + a.kv_lora_rank * heads * (a.qk_head_dim + a.v_head_dim)
    scores = heads * seq * (a.q_head_dim + a.v_head_dim) * (0.5 if causal else 1.0)
    return 2.0 * (q + kv + heads * a.v_head_dim * hidden + scores)


def activation_bytes(a: AttentionSettings, hidden: int, heads: int, lowp_bytes: float = 1.0,
                     hidden_dropout: bool = False) -> tuple[float, float]:
    """(replicated, split) bytes per token a `+` layer keeps with flash attention: the input norm's input, the
    down projections' input and the up projections' inputs (replicated), then q, k, v and the output projection's
    input (split over TP)."""
    replicated = 2.0 * hidden + 2.0 * hidden * lowp_bytes + (1.0 * hidden if hidden_dropout else 0.0) \
        + 2.0 * ((a.q_lora_rank or 0) + a.kv_lora_rank) * lowp_bytes
    split = 2.0 * heads * (a.q_head_dim + a.qk_head_dim + a.v_head_dim) + 2.0 * heads * a.v_head_dim * lowp_bytes
    return replicated, split


def ops(b: OpBuilder, lowp: bool) -> list[Pair]:
    """The `+` layer's operators: MLA's attention block (the configuration's `attn` must hold MLA settings)."""
    a = b.c.attn
    if a is None or not a.multi_latent_attention:
        raise ValueError("a `+` layer needs the configuration's multi-latent attention settings")
    return attention_block(b, None, lowp)


class MultiLatentAttention(Attention):
    """The `+` layer as a block (predictor.layers.block.Block): the attention block, whose configuration holds MLA
    settings (a pattern with `+` turns them on), under its own name."""

    name = "mla"


MLA = MultiLatentAttention()
