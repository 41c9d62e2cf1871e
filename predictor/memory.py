"""Memory per GPU: weights, gradients, optimizer state and activations of the most loaded pipeline stage.

Activations follow Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022):
per layer and micro-batch s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes with TP, s·b·h/t·(34 + 5·a·s/h) with sequence
parallelism; selective recompute and flash attention drop the 5·a·s/h score term; full recompute keeps only each
layer's input (2·s·b·h bytes, /t with SP) plus one layer's working set. 1F1B keeps min(pp − stage, m) micro-batches
in flight on a stage (interleaved: × (1 + (pp − 1)/(pp·vp))). GQA/SwiGLU corrections are not modelled.
"""
from __future__ import annotations

from tracekit.core.config import TrainingConfig
from tracekit.core.hardware import hardware_spec

from .graph import Graph, chunk_params

GB = 1e9


def _layer_activation_bytes(c: TrainingConfig, working: bool = False) -> float:
    s, b, h, a, t = c.seq_length // c.cp, c.micro_batch_size, c.hidden_size, c.num_attention_heads, c.tp
    score = 0.0 if (c.attention == "flash" or c.recompute_granularity == "selective") else 5.0 * a * s / h
    if c.recompute_granularity == "full" and not working:
        return 2.0 * s * b * h / (t if c.sequence_parallel else 1)
    if c.sequence_parallel:
        return s * b * h / t * (34.0 + score)
    return s * b * h * (10.0 + 24.0 / t + score / t)


def memory_per_gpu(graph: Graph) -> tuple[dict[str, float], list[str]]:
    """({weights, gradients, optimizer_state, activations, total} in GB for the fullest stage, warnings)."""
    return config_memory(graph.config, graph.hardware)


def config_memory(c: TrainingConfig, hardware: str) -> tuple[dict[str, float], list[str]]:
    """`memory_per_gpu` from the configuration alone, without its operator graph (a search prunes with it before
    building graphs)."""
    weight_bytes = 4 if c.precision == "fp32" else 2
    grad_bytes = c.grad_bytes
    state_bytes = 8 if c.precision == "fp32" else 12  # Adam m, v (+ fp32 master weights in mixed precision)
    shard = c.dp if c.use_distributed_optimizer else 1
    per_layer = _layer_activation_bytes(c)
    working = _layer_activation_bytes(c, working=True) if c.recompute_granularity == "full" else 0.0
    logits = c.seq_length // c.cp * c.micro_batch_size * c.padded_vocab_size / c.tp * 4  # fp32 logits for the loss
    best: dict[str, float] | None = None
    for stage in range(c.pp):
        params = sum(chunk_params(c, stage, chunk) for chunk in range(c.vp))
        layers = c.num_layers // (c.pp * c.vp) * c.vp
        in_flight: float = min(c.pp - stage, c.num_microbatches)
        if c.vp > 1:
            in_flight *= 1 + (c.pp - 1) / (c.pp * c.vp)
        acts = layers * per_layer * in_flight + working + (logits if stage == c.pp - 1 else 0.0)
        row = {
            "weights": params * weight_bytes / GB,
            "gradients": params * grad_bytes / GB,
            "optimizer_state": params * state_bytes / shard / GB,
            "activations": acts / GB,
        }
        row["total"] = sum(row.values())
        if best is None or row["total"] > best["total"]:
            best = row
    assert best is not None
    warnings = []
    spec = hardware_spec(hardware)
    if spec is not None and best["total"] > spec.memory_gb:
        warnings.append(
            f"needs about {best['total']:.1f} GB per GPU on its fullest pipeline stage, more than the "
            f"{spec.memory_gb:g} GB of {spec.name}: it will not fit (add recompute, tp/pp or the distributed optimizer)"
        )
    return best, warnings
