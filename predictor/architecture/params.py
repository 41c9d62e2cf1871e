"""Parameters one GPU holds, split into the dense part (reduced over the data- and context-parallel ranks) and the
expert part (reduced over the expert data-parallel ranks), per layer and per pipeline chunk.

    layer_params(config, layer) -> (dense, expert) of one decoder layer on one GPU
    chunk_params(config, stage, chunk) -> (dense, expert) of one model chunk on one GPU (its layers, the embedding,
        the final norm and output layer, MTP layers)

A layer's parameters are its blocks' (`predictor.layers.block.Block.params`: attention, MLP, MoE, each with its
norm); a chunk adds the embedding (and learned positions), the final norm and output layer, and MTP layers.
"""
from __future__ import annotations

from predictor.layers.block import norm_params
from predictor.layers.decoder import layer_blocks, mtp_layer
from tracekit.core.config import TrainingConfig
from tracekit.core.pipeline_layout import chunks


def layer_params(c: TrainingConfig, layer: int) -> tuple[int, int]:
    """(dense, expert) parameters of decoder layer `layer` on one GPU: the sum of its blocks'
    (`predictor.layers.decoder.layer_blocks`)."""
    dense = expert = 0
    for block in layer_blocks(c, layer):
        d, e = block.params(c)
        dense += d
        expert += e
    return dense, expert


def mtp_params(c: TrainingConfig) -> tuple[int, int]:
    """(dense, expert) parameters of one MTP layer (two norms, the [2h → h] projection, its decoder layer: a GPT
    model's shaped like its last, a hybrid model's the pattern's MTP layers; the final norm); the output layer is
    shared with the model's."""
    h = c.hidden_size
    dense, expert = layer_params(c, mtp_layer(c))
    return dense + 3 * norm_params(c, h) + 2 * h * h // c.tp, expert


def chunk_params(c: TrainingConfig, stage: int, chunk: int) -> tuple[int, int]:
    """(dense, expert) parameters one GPU holds for a model chunk: its layers, the embedding on the chunk that holds
    it, the final norm and (untied, or away from the embedding) the output layer on the chunk that holds the loss,
    and its MTP layers."""
    part = chunks(c)[stage][chunk]
    dense = expert = 0
    kinds: dict[tuple, list[int]] = {}  # a layer's parameters depend only on its blocks: once per kind
    for layer in part.layers:
        kinds.setdefault(layer_blocks(c, layer), []).append(layer)
    for layers in kinds.values():
        d, e = layer_params(c, layers[0])
        dense += len(layers) * d
        expert += len(layers) * e
    vocab_rows = c.padded_vocab_size // c.tp * c.hidden_size
    if part.embedding:
        dense += vocab_rows + (c.seq_length * c.hidden_size if c.learned_positions else 0)
    if part.loss:
        tied_here = part.embedding and not c.untie_embeddings_and_output_weights
        dense += norm_params(c, c.hidden_size) + (0 if tied_here else vocab_rows)
    if part.mtp:
        d, e = mtp_params(c)
        dense += part.mtp * d
        expert += part.mtp * e
    return dense, expert
