"""Parameters one GPU holds, split into the dense part (reduced over the data- and context-parallel ranks) and the
expert part (reduced over the expert data-parallel ranks), per layer and per pipeline chunk.

    layer_params(config, layer) -> (dense, expert) of one decoder layer on one GPU
    chunk_params(config, stage, chunk) -> (dense, expert) of one model chunk on one GPU (its layers, the embedding,
        the final norm and output layer, MTP layers)

Attention: QKV (or MLA's down/up projections: the down projections replicated over TP), output projection, the
norms (q/kv layernorms with MLA or qk_layernorm). MLP: FC1 (×2 with SwiGLU) and FC2 split over TP. MoE: the router
(replicated), the shared experts (split over TP like an MLP), the local experts (num_experts / EP of them, each
split over expert TP; a latent MoE's at the latent width, with its two latent projections replicated over TP).
"""
from __future__ import annotations

from tracekit.core.config import TrainingConfig
from tracekit.core.pipeline_layout import chunks


def _norm(c: TrainingConfig, width: int) -> int:
    return width * (1 if c.normalization == "RMSNorm" else 2)


def attention_params(c: TrainingConfig) -> int:
    """One layer's attention on one TP rank."""
    t, h, bias = c.tp, c.hidden_size, c.add_bias_linear
    a = c.attn
    heads = c.num_attention_heads // t
    if a is not None and a.multi_latent_attention:
        q = (h * a.q_lora_rank + _norm(c, a.q_lora_rank) + a.q_lora_rank * heads * a.q_head_dim) \
            if a.q_lora_rank else h * heads * a.q_head_dim
        kv = h * (a.kv_lora_rank + a.qk_pos_emb_head_dim) + _norm(c, a.kv_lora_rank) \
            + a.kv_lora_rank * heads * (a.qk_head_dim + a.v_head_dim)
        return q + kv + heads * a.v_head_dim * h + h * bias + _norm(c, h)
    d, groups = c.head_dim, c.num_query_groups // t
    qkv = h * (heads + 2 * groups) * d + (heads + 2 * groups) * d * bias
    qk_norm = 2 * _norm(c, d) if a is not None and a.qk_layernorm else 0
    return qkv + heads * d * h + h * bias + _norm(c, h) + qk_norm


def mlp_params(c: TrainingConfig, ffn: int, split: int, width: int | None = None) -> int:
    """An MLP of width `ffn` split over `split` ranks (FC1 ×2 with SwiGLU) on inputs of `width` (hidden)."""
    f, h, bias = ffn // split, width or c.hidden_size, c.add_bias_linear
    fc1 = 2 * f if c.swiglu else f
    return h * fc1 + fc1 * bias + f * h + h * bias


def layer_params(c: TrainingConfig, layer: int) -> tuple[int, int]:
    """(dense, expert) parameters of decoder layer `layer` on one GPU."""
    h = c.hidden_size
    dense = attention_params(c) + _norm(c, h)  # + the pre-MLP norm
    moe = c.moe
    if moe is None or not moe.pattern(c.num_layers)[layer]:
        return dense + mlp_params(c, c.ffn_hidden_size, c.tp), 0
    dense += h * moe.num_experts  # the router
    if moe.moe_shared_expert_intermediate_size:
        dense += mlp_params(c, moe.moe_shared_expert_intermediate_size, c.tp)
    latent = moe.moe_latent_size
    if latent:  # fc1_latent_proj [h → latent] and fc2_latent_proj [latent → h], replicated over TP
        dense += 2 * h * latent + (latent + h) * c.add_bias_linear
    expert = moe.local_experts * mlp_params(c, moe.ffn(c.ffn_hidden_size), moe.etp(c.tp), latent)
    return dense, expert


def mtp_params(c: TrainingConfig) -> tuple[int, int]:
    """(dense, expert) parameters of one MTP layer (two norms, the [2h → h] projection, one decoder layer shaped like
    the model's last, the final norm); the output layer is shared with the model's."""
    h = c.hidden_size
    dense, expert = layer_params(c, c.num_layers - 1)
    return dense + 3 * _norm(c, h) + 2 * h * h // c.tp, expert


def chunk_params(c: TrainingConfig, stage: int, chunk: int) -> tuple[int, int]:
    """(dense, expert) parameters one GPU holds for a model chunk: its layers, the embedding on the chunk that holds
    it, the final norm and (untied, or away from the embedding) the output layer on the chunk that holds the loss,
    and its MTP layers."""
    part = chunks(c)[stage][chunk]
    dense = expert = 0
    pattern = c.moe.pattern(c.num_layers) if c.moe else None
    moe_layers = sum(pattern[layer] for layer in part.layers) if pattern else 0
    for count, layer in ((len(part.layers) - moe_layers, pattern.index(0) if pattern and 0 in pattern else 0),
                         (moe_layers, pattern.index(1) if pattern and 1 in pattern else 0)):
        if count:  # a layer's parameters depend only on whether it is an MoE layer
            d, e = layer_params(c, layer)
            dense += count * d
            expert += count * e
    vocab_rows = c.padded_vocab_size // c.tp * c.hidden_size
    if part.embedding:
        dense += vocab_rows + (c.seq_length * c.hidden_size if c.position_embedding_type != "rope" else 0)
    if part.loss:
        tied_here = part.embedding and not c.untie_embeddings_and_output_weights
        dense += _norm(c, c.hidden_size) + (0 if tied_here else vocab_rows)
    if part.mtp:
        d, e = mtp_params(c)
        dense += part.mtp * d
        expert += part.mtp * e
    return dense, expert
