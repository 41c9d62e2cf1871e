"""The parameter tensors one GPU holds for a model chunk, as Megatron-core's Transformer Engine layers register them:
how many (what per-parameter host passes loop over, and what bounds the gradient buckets: a bucket holds at least one
whole tensor), how many are linear weights, and their elements (predictor.schedule.framework_costs,
predictor.parallel.grad_buckets)."""
from __future__ import annotations

from dataclasses import dataclass

from predictor.architecture.params import chunk_params
from predictor.layers.decoder import layer_blocks, mtp_layer
from tracekit.core.config import TrainingConfig
from tracekit.core.pipeline_layout import chunks


@dataclass
class ChunkTensors:
    """Parameter tensors one GPU holds for a model chunk: all of them, the linear layers' weights, and the elements
    of those weights (what gradient-accumulation fusion writes into the main gradient)."""

    tensors: int = 0
    linear_weights: int = 0
    linear_elements: float = 0.0
    elements: float = 0.0  # every parameter element (dense and expert)


def _layer_tensors(c: TrainingConfig, layer: int) -> tuple[int, int]:
    """(tensors, linear weights) of one decoder layer on one GPU: weights, biases and norm parameters as
    Megatron-core's Transformer Engine layers register them (its blocks', `predictor.layers.block.Block.tensors`)."""
    norm = 1 if c.normalization == "RMSNorm" else 2
    bias = 1 if c.add_bias_linear else 0
    linears = biased = norms = other = 0
    for block in layer_blocks(c, layer):
        held = block.tensors(c)
        linears += held.linears
        biased += held.biased
        norms += held.norms
        other += held.other
    return linears + bias * biased + norm * norms + other, linears


def chunk_tensors(c: TrainingConfig, stage: int, chunk: int) -> ChunkTensors:
    """The parameter tensors of one model chunk on one GPU (`ChunkTensors`)."""
    part = chunks(c)[stage][chunk]
    out = ChunkTensors()
    for layer in part.layers:
        tensors, linears = _layer_tensors(c, layer)
        out.tensors += tensors
        out.linear_weights += linears
    for _ in range(part.mtp):  # an MTP layer: a decoder layer, its projection and three norms
        tensors, linears = _layer_tensors(c, mtp_layer(c))
        out.tensors += tensors + 1 + 3 * (1 if c.normalization == "RMSNorm" else 2)
        out.linear_weights += linears + 1
    dense, expert = chunk_params(c, stage, chunk)
    out.elements = float(dense + expert)
    embedding = 0.0
    if part.embedding:
        learned = c.learned_positions
        out.tensors += 1 + (1 if learned else 0)
        embedding = c.padded_vocab_size // c.tp * c.hidden_size + (c.seq_length * c.hidden_size if learned else 0)
    if part.loss:
        out.tensors += 1 if c.normalization == "RMSNorm" else 2
        if not (part.embedding and not c.untie_embeddings_and_output_weights):
            out.tensors += 1
            out.linear_weights += 1
    out.linear_elements = max(0.0, out.elements - embedding)
    return out
