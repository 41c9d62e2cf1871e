"""Attention as a layer kind (`predictor.layers.block.Block`): multi-head / grouped-query attention, or multi-latent
attention (tracekit.core.attention), with its input norm — its ops (`predictor.layers.attention.ops`), parameters,
FLOPs, saved activations, matrices, parameter tensors and offloadable groups.

Parameters: QKV (or MLA's down/up projections: the down projections replicated over TP), the output projection, the
norms (the input norm; q/kv layernorms with MLA or qk_layernorm). FLOPs: the projections and the scores over the full
sequence (a window's keys with sliding-window attention), halved by `causal`. Saved activations (Korthikanti et al.
2022): the input norm's input and the QKV input replicated over TP without SP, the dropout mask; split over TP, q, k,
v (MLA's up-projection outputs), the output projection's input and, unfused, the softmax output (with attention
dropout its mask and the dropped-out copy).
"""
from __future__ import annotations

from predictor.ir.ops import OpBuilder, Pair
from predictor.layers.attention.ops import attention_block
from predictor.layers.block import Matrix, Saved, Saving, Tensors, local_tokens, norm_params
from tracekit.core.config import TrainingConfig


def attention_params(c: TrainingConfig) -> int:
    """One layer's attention on one TP rank."""
    t, h, bias = c.tp, c.hidden_size, c.add_bias_linear
    a = c.attn
    heads = c.num_attention_heads // t
    if a is not None and a.multi_latent_attention:
        q = (h * a.q_lora_rank + norm_params(c, a.q_lora_rank) + a.q_lora_rank * heads * a.q_head_dim) \
            if a.q_lora_rank else h * heads * a.q_head_dim
        kv = h * (a.kv_lora_rank + a.qk_pos_emb_head_dim) + norm_params(c, a.kv_lora_rank) \
            + a.kv_lora_rank * heads * (a.qk_head_dim + a.v_head_dim)
        return q + kv + heads * a.v_head_dim * h + h * bias + norm_params(c, h)
    d, groups = c.head_dim, c.num_query_groups // t
    qkv = h * (heads + 2 * groups) * d + (heads + 2 * groups) * d * c.qkv_bias
    qk_norm = 2 * norm_params(c, d) if a is not None and a.qk_layernorm else 0
    return qkv + heads * d * h + h * bias + norm_params(c, h) + qk_norm


class Attention:
    name = "attention"

    def ops(self, b: OpBuilder, window: int | None, lowp: bool) -> list[Pair]:
        return attention_block(b, window, lowp)

    def params(self, c: TrainingConfig) -> tuple[int, int]:
        return attention_params(c), 0

    def flops_per_token(self, c: TrainingConfig, layer: int, causal: bool) -> float:
        h, s, heads = c.hidden_size, c.seq_length, c.num_attention_heads
        a = c.attn
        if a is not None and a.multi_latent_attention:
            q = (h * a.q_lora_rank + a.q_lora_rank * heads * a.q_head_dim) if a.q_lora_rank \
                else h * heads * a.q_head_dim
            kv = h * (a.kv_lora_rank + a.qk_pos_emb_head_dim) + a.kv_lora_rank * heads * (a.qk_head_dim + a.v_head_dim)
            proj = heads * a.v_head_dim * h
            score_dim = a.q_head_dim + a.v_head_dim
        else:
            d, g = c.head_dim, c.num_query_groups
            q, kv, proj = h * heads * d, h * 2 * g * d, heads * d * h
            score_dim = 2 * d
        window = a.window(layer) if a is not None else None
        keys = min(s, window) if window else s
        scores = heads * keys * score_dim * (0.5 if causal and not window else 1.0)
        return 2.0 * (q + kv + proj + scores)

    def saved(self, c: TrainingConfig, saving: Saving) -> Saved:
        h, q, host, modules = c.hidden_size, saving.q, saving.host, saving.modules
        heads = c.num_attention_heads
        s = c.seq_length // c.cp
        # unfused attention keeps its softmax output (2 bytes a score) and, with attention dropout, the mask (1) and
        # the dropped-out copy (2); dropout with p = 0 returns its input and keeps no mask (torch's `dropout`)
        per_score = 2.0 + (3.0 if c.attention_dropout > 0 else 0.0)
        scores = 0.0 if (c.attention == "flash" or "core_attn" in modules | host) else per_score * heads * s
        norm_in = 0.0 if "attn_norm" in host else 2.0 * h
        mask = 1.0 * h if c.hidden_dropout > 0 else 0.0  # the hidden-dropout mask, 1 byte
        # `layernorm` replays the norm from its input (kept) and frees its output, the QKV input (under fp8 that GEMM
        # saves that bf16 output instead of an fp8 copy: Megatron's set_save_original_input)
        qkv_in = 0.0 if "qkv_linear" in host else 2.0 * h * q * saving.normed
        replicated = norm_in + qkv_in + mask
        proj = 0.0 if "attn_proj" in host else 1.0  # the output projection's input
        core = 0.0 if "core_attn" in host else 1.0  # what core attention saves: q, k, v (and unfused, its scores)
        a = c.attn
        if a is not None and a.multi_latent_attention:
            up = 0.0 if "mla_up_proj" in modules else 2.0 * heads * (a.q_head_dim + a.qk_head_dim + a.v_head_dim)
            replicated += 2.0 * ((a.q_lora_rank or 0) + a.kv_lora_rank) * q  # the up projections' inputs
            split = up * core + 2.0 * heads * a.v_head_dim * q * proj + scores
        else:
            d, groups = c.head_dim, c.num_query_groups
            split = 2.0 * (heads + 2 * groups) * d * core + 2.0 * heads * d * q * proj + scores
        return Saved(replicated, split)

    def matrices(self, c: TrainingConfig, split_qkv: bool) -> tuple[list[Matrix], list[Matrix]]:
        h, heads = c.hidden_size, c.num_attention_heads
        a = c.attn
        if a is not None and a.multi_latent_attention:
            q = [(a.q_lora_rank, h), (heads * a.q_head_dim, a.q_lora_rank)] if a.q_lora_rank \
                else [(heads * a.q_head_dim, h)]
            return q + [(a.kv_lora_rank + a.qk_pos_emb_head_dim, h),
                        (heads * (a.qk_head_dim + a.v_head_dim), a.kv_lora_rank), (h, heads * a.v_head_dim)], []
        d, groups = c.head_dim, c.num_query_groups
        qkv = [(heads * d, h), (groups * d, h), (groups * d, h)] if split_qkv else [((heads + 2 * groups) * d, h)]
        return qkv + [(h, heads * d)], []

    def tensors(self, c: TrainingConfig) -> Tensors:
        a = c.attn
        if a is not None and a.multi_latent_attention:
            return Tensors(linears=(2 if a.q_lora_rank else 1) + 3, biased=1, norms=2 + (1 if a.q_lora_rank else 0))
        # the QKV bias alone (add_qkv_bias without add_bias_linear) is a tensor of its own
        return Tensors(linears=2, biased=2, norms=1 + (2 if a is not None and a.qk_layernorm else 0),
                       other=int(c.qkv_bias and not c.add_bias_linear))

    def offload_tensors(self, c: TrainingConfig) -> dict[str, list[float]]:
        """Tokens are the sequence (over CP) × micro-batch; with sequence parallelism the norm and the linears'
        inputs are the local 1/tp of them (Transformer Engine saves the local shard and gathers it again in the
        backward); q, k, v and the output hold the local heads of every token."""
        tokens = local_tokens(c)
        t, h = c.tp, c.hidden_size
        local = tokens // t if c.sequence_parallel else tokens
        heads = c.num_attention_heads // t
        s = c.seq_length // c.cp
        a = c.attn
        out: dict[str, list[float]] = {"attn_norm": [float(local * h)]}
        if a is not None and a.multi_latent_attention:
            q_dim = a.qk_head_dim + a.qk_pos_emb_head_dim
            # the down projections' input, then each compressed tensor twice: its norm's input and its up
            # projection's
            ranks = [a.q_lora_rank, a.q_lora_rank] if a.q_lora_rank else []
            out["qkv_linear"] = [float(local * r) for r in [h] + ranks + [a.kv_lora_rank, a.kv_lora_rank]]
            qkv = [float(tokens * heads * q_dim), float(tokens * heads * q_dim), float(tokens * heads * a.v_head_dim)]
            v_dim = a.v_head_dim
        else:
            d, groups = c.head_dim, max(1, c.num_query_groups // t)
            out["qkv_linear"] = [float(local * h)]
            qkv = [float(tokens * heads * d), float(tokens * groups * d), float(tokens * groups * d)]
            v_dim = d
        if c.attention == "flash":  # q, k, v, the output and the fp32 softmax statistics (2 elements of bf16 each)
            core = qkv + [tokens * heads * v_dim, 2.0 * c.micro_batch_size * heads * s]
        else:  # baddbmm's q and k, bmm's probabilities and v; with dropout its mask (half) and the dropped copy
            probs = float(c.micro_batch_size * heads * s * s)
            core = qkv + [probs] + ([0.5 * probs, probs] if c.attention_dropout > 0 else [])
        out["core_attn"] = core
        out["attn_proj"] = [float(tokens * heads * v_dim)]
        return out


ATTENTION = Attention()
