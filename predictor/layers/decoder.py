"""The blocks of each decoder layer (`layer_blocks`): what the graph builds a layer from and what the model's
parameters, FLOPs, memory, optimizer matrices, parameter tensors and offloaded activations sum over.

A GPT layer (Megatron-core's TransformerLayer) is an attention block and an MLP block, or an MoE block where
`moe_layer_freq` puts experts. `kind_name` is what the graph calls a layer of those blocks in its ops' `block` (and
the model's tables in their per-layer rows): `dense` or `moe`; `blocks_named` reads it back.
"""
from __future__ import annotations

from predictor.layers.attention.block import ATTENTION
from predictor.layers.block import Block
from predictor.layers.mlp.block import MLP_BLOCK
from predictor.layers.moe.block import MOE_BLOCK
from tracekit.core.config import TrainingConfig

#: A layer's blocks by the name its kind is called (`kind_name`).
_KINDS: dict[str, tuple[Block, ...]] = {"dense": (ATTENTION, MLP_BLOCK), "moe": (ATTENTION, MOE_BLOCK)}


def layer_blocks(c: TrainingConfig, layer: int) -> tuple[Block, ...]:
    """The blocks of decoder layer `layer` (0-based), in order."""
    moe = c.moe
    return _KINDS["moe" if moe is not None and moe.pattern(c.num_layers)[layer] else "dense"]


def kind_name(blocks: tuple[Block, ...]) -> str:
    """The name of a layer kind made of `blocks` (`dense`, `moe`)."""
    return next(name for name, kinds in _KINDS.items() if kinds == blocks)


def blocks_named(block: str) -> tuple[Block, ...]:
    """The blocks of the layer kind an op's `block` names (`moe-w4096-bf16`, `dense`, `mtp0:moe-…`: the kind's name
    first, after an MTP layer's prefix)."""
    return _KINDS[block.rsplit(":", 1)[-1].split("-", 1)[0]]
