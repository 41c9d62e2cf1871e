"""Model FLOPs of a GPT training iteration (Megatron's accounting) and the throughput figures derived from it.

Model FLOPs count the forward matrix work once and the backward twice (fwd + dgrad + wgrad = 3×), no recompute,
attention scores over the full (not causal-halved) sequence, as the Megatron-LM papers do: for a standard GPT (ffn 4h,
MHA) this is 72·B·s·L·h²·(1 + s/(6h) + V/(12·h·L)). Grouped-query attention projects fewer keys and values; MLA its
down and up projections; an MoE layer counts its router, the top-k experts each token visits and the shared experts
(the parameters a token touches); MTP layers count a decoder layer, their [2h → h] projection and the output layer.
`causal=True` halves the score work (what the kernels compute: the plausibility bound of predictor.report.plausibility).
"""
from __future__ import annotations

from typing import TypedDict

from predictor.layers.decoder import layer_blocks, mtp_layer
from tracekit.core.config import TrainingConfig
from tracekit.core.hardware import hardware_spec


def layer_flops_per_token(c: TrainingConfig, layer: int, causal: bool = False) -> float:
    """Forward FLOPs per token of decoder layer `layer`: the sum of its blocks' (whole layer, all TP ranks)."""
    return sum(block.flops_per_token(c, layer, causal) for block in layer_blocks(c, layer))


def layer_forward_flops(config: TrainingConfig, tokens: int, layer: int = 0, causal: bool = False) -> float:
    """Forward FLOPs of decoder layer `layer` over `tokens` tokens (whole layer, all TP ranks together)."""
    return tokens * layer_flops_per_token(config, layer, causal)


def model_flops_per_iteration(config: TrainingConfig, causal: bool = False) -> float:
    """Model FLOPs of one iteration (global batch): 3 × the forward work of the layers, the LM head and MTP."""
    c = config
    tokens = c.global_batch_size * c.seq_length
    head = 2.0 * tokens * c.hidden_size * c.padded_vocab_size
    per_token = sum(layer_flops_per_token(c, i, causal) for i in range(c.num_layers))
    mtp = c.layout.mtp_num_layers if c.layout and c.layout.mtp_num_layers else 0
    if mtp:
        per_token += mtp * (layer_flops_per_token(c, mtp_layer(c), causal) + 2.0 * 2 * c.hidden_size * c.hidden_size)
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
