"""Model FLOPs of a GPT training iteration (Megatron's accounting) and the throughput figures derived from it.

Model FLOPs count the forward matrix work once and the backward twice (fwd + dgrad + wgrad = 3×), no recompute,
attention scores over the full (not causal-halved) sequence, as the Megatron-LM papers do: for a standard GPT (ffn 4h,
MHA) this is 72·B·s·L·h²·(1 + s/(6h) + V/(12·h·L)). Grouped-query attention projects fewer keys and values; MLA its
down and up projections; an MoE layer counts its router, the top-k experts each token visits and the shared experts
(the parameters a token touches; a latent MoE's experts at the latent width, plus its two latent projections); MTP
layers count a decoder layer, their [2h → h] projection and the output layer.
`causal=True` halves the score work (what the kernels compute: the plausibility bound of predictor.plausibility).
"""
from __future__ import annotations

from typing import TypedDict

from tracekit.core.config import TrainingConfig
from tracekit.core.hardware import hardware_spec


def _attention_flops_per_token(c: TrainingConfig, layer: int, causal: bool) -> float:
    """Forward FLOPs per token of one layer's attention: projections and scores (whole layer, all TP ranks)."""
    h, s, heads = c.hidden_size, c.seq_length, c.num_attention_heads
    a = c.attn
    if a is not None and a.multi_latent_attention:
        q = (h * a.q_lora_rank + a.q_lora_rank * heads * a.q_head_dim) if a.q_lora_rank else h * heads * a.q_head_dim
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


def _mlp_flops_per_token(c: TrainingConfig, layer: int) -> float:
    h = c.hidden_size
    width = 3 if c.swiglu else 2
    moe = c.moe
    if moe is None or not moe.pattern(c.num_layers)[layer]:
        return 2.0 * h * c.ffn_hidden_size * width
    routed = moe.moe_router_topk * 2.0 * moe.expert_width(h) * moe.ffn(c.ffn_hidden_size) * width
    shared = 2.0 * h * (moe.moe_shared_expert_intermediate_size or 0) * width
    latent = 2.0 * 2 * h * moe.moe_latent_size if moe.moe_latent_size else 0.0  # the two latent projections
    return 2.0 * h * moe.num_experts + routed + shared + latent


def layer_forward_flops(config: TrainingConfig, tokens: int, layer: int = 0, causal: bool = False) -> float:
    """Forward FLOPs of decoder layer `layer` over `tokens` tokens (whole layer, all TP ranks together)."""
    return tokens * (_attention_flops_per_token(config, layer, causal) + _mlp_flops_per_token(config, layer))


def model_flops_per_iteration(config: TrainingConfig, causal: bool = False) -> float:
    """Model FLOPs of one iteration (global batch): 3 × the forward work of the layers, the LM head and MTP."""
    c = config
    tokens = c.global_batch_size * c.seq_length
    head = 2.0 * tokens * c.hidden_size * c.padded_vocab_size
    per_token = sum(_attention_flops_per_token(c, i, causal) + _mlp_flops_per_token(c, i)
                    for i in range(c.num_layers))
    mtp = c.layout.mtp_num_layers if c.layout and c.layout.mtp_num_layers else 0
    if mtp:
        last = c.num_layers - 1
        per_token += mtp * (_attention_flops_per_token(c, last, causal) + _mlp_flops_per_token(c, last)
                            + 2.0 * 2 * c.hidden_size * c.hidden_size)
        head *= 1 + mtp
    return 3.0 * (tokens * per_token + head)


class Throughput(TypedDict):
    model_flops: float
    tflops_per_gpu: float
    mfu: float | None  # None for hardware without a datasheet peak
    tokens_per_s: float


def throughput(config: TrainingConfig, hardware: str, iteration_s: float) -> Throughput:
    """TFLOP/s per GPU, MFU (vs the datasheet's dense peak for the GEMM dtype: fp16/bf16, fp8's for fp8 GEMMs, the
    fp32 peak for fp32) and tokens/s."""
    flops = model_flops_per_iteration(config)
    per_gpu = flops / iteration_s / config.world_size / 1e12 if iteration_s > 0 else 0.0
    spec = hardware_spec(hardware)
    peak = (spec.peak_tflops(config.gemm_dtype) or None) if spec is not None else None
    return {
        "model_flops": flops,
        "tflops_per_gpu": per_gpu,
        "mfu": per_gpu / peak if peak else None,
        "tokens_per_s": config.tokens_per_iteration / iteration_s if iteration_s > 0 else 0.0,
    }
