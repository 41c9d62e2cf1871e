"""Model FLOPs of a GPT training iteration (Megatron's accounting) and the throughput figures derived from it.

Model FLOPs count the forward matrix work once and the backward twice (fwd + dgrad + wgrad = 3×), no recompute,
full (not causal-halved) attention scores, as Megatron's `num_floating_point_operations` and the Megatron-LM papers
do: for a standard GPT (ffn 4h, MHA) this is 72·B·s·L·h²·(1 + s/(6h) + V/(12·h·L)).
"""
from __future__ import annotations

from typing import TypedDict

from tracekit.core.config import TrainingConfig
from tracekit.core.hardware import hardware_spec


def layer_forward_flops(config: TrainingConfig, tokens: int) -> float:
    """Forward FLOPs of one transformer layer over `tokens` tokens (whole layer, all TP ranks together)."""
    c = config
    h, s, d = c.hidden_size, c.seq_length, c.head_dim
    a, g, f = c.num_attention_heads, c.num_query_groups, c.ffn_hidden_size
    qkv = h * (a + 2 * g) * d
    proj = a * d * h
    mlp = h * f * (3 if c.swiglu else 2)
    attention = 2 * s * a * d  # scores + context, per token
    return 2.0 * tokens * (qkv + proj + mlp + attention)


def model_flops_per_iteration(config: TrainingConfig) -> float:
    """Model FLOPs of one iteration (global batch): 3 × (layers + LM head) forward work."""
    tokens = config.global_batch_size * config.seq_length
    head = 2.0 * tokens * config.hidden_size * config.padded_vocab_size
    return 3.0 * (config.num_layers * layer_forward_flops(config, tokens) + head)


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
