"""Activations a rank holds under PyTorch's split-backward pipeline schedules, from the orders they run
(predictor.schedule.zero_bubble.orders), not 1F1B's count.

A forward (F) of one of the rank's stages adds that stage's activations for its micro-batch; a full backward (B)
frees them; a split backward frees them in two parts: the input backward (I) everything but what the weight gradient
still needs — the inputs of the stage's GEMMs (Qi et al., "Zero Bubble Pipeline Parallelism", 2023: W needs each
linear layer's input and output gradient) — and the weight backward (W) the rest. The peak is the most the rank
holds after any of its tasks, in units of one stage's activations for one micro-batch. With W right after its I the
peak equals the full-backward one; every W a schedule defers past its I (to fill a bubble) can only raise it.
"""
from __future__ import annotations

from predictor.schedule.zero_bubble import Action, orders
from tracekit.core.config import TrainingConfig


def peak_stages(order: list[Action], weight_share: float) -> float:
    """The most stage-micro-batches of activations a rank holds running `order`, where `weight_share` (0–1) of a
    stage's activations waits for its W after its I."""
    held = peak = 0.0
    for kind, _, _ in order:
        held += {"F": 1.0, "B": -1.0, "I": -(1.0 - weight_share), "W": -weight_share}[kind]
        peak = max(peak, held)
    return peak


def in_flight(schedule: str, c: TrainingConfig, rank: int, weight_share: float) -> float:
    """Micro-batches of the whole rank's activations (its n stages together) held at its peak under `schedule`."""
    n = c.vp
    order = orders(schedule, c.pp, n, c.num_microbatches)[rank]
    return peak_stages(order, weight_share) / n


def gemm_input_share(c: TrainingConfig, layer_bytes_per_token: float, q: float) -> float:
    """Share of a layer's kept bytes per token (`layer_bytes_per_token`) that are its GEMMs' inputs: QKV's and FC1's
    (the hidden state, replicated over TP without SP), the output projection's and FC2's (split over TP); `q`: a
    GEMM input's bytes over bf16's under the precision recipe. A dense layer's GEMMs (an MoE layer's are counted as
    its dense equivalent's)."""
    t, h = c.tp, c.hidden_size
    replicated = 2 * 2.0 * h * q
    split = (2.0 * c.num_attention_heads * c.head_dim + 2.0 * c.ffn_hidden_size) * q
    gemm = (replicated + split) / t if c.sequence_parallel else replicated + split / t
    return min(1.0, gemm / layer_bytes_per_token) if layer_bytes_per_token > 0 else 0.0
