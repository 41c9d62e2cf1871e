"""The blocks of each decoder layer (`layer_blocks`): what the graph builds a layer from and what the model's
parameters, FLOPs, memory, optimizer matrices, parameter tensors and offloaded activations sum over.

A GPT layer (Megatron-core's TransformerLayer) is an attention block and an MLP block, or an MoE block where
`moe_layer_freq` puts experts; under a linear/sparse attention variant (`--experimental-attention-variant`) its
attention block is Gated DeltaNet where `--linear-attention-freq` says, or DSA. A hybrid model's layer is one block,
its pattern's symbol (tracekit.core.hybrid): `M` Mamba2, `G` Gated DeltaNet, `*` attention, `D` DeepSeek sparse
attention (reusing an earlier layer's top-k where `dsa_indexer_topk_freq` says), `+` multi-latent attention, `-`
MLP, `E` MoE; an MTP depth of a hybrid model is the blocks of its pattern's MTP layers, in order.

`kind_name` is what the graph calls a layer of those blocks in its ops' `block` (and the model's tables in their
per-layer rows): `dense` and `moe` for the two GPT kinds; a hybrid layer its block's name with `_layer`
(`mamba_layer`, `moe_layer`, ...); other combinations their blocks' names joined by `+` (`gdn+mlp`, an MTP depth's
`attention+moe`). `blocks_named` reads any of them back.
"""
from __future__ import annotations

from functools import lru_cache

from predictor.layers.attention.block import ATTENTION
from predictor.layers.block import Block
from predictor.layers.dsa import DSA, DSA_SHARED_TOPK, computes_topk, settings_of
from predictor.layers.mla import MLA
from predictor.layers.mlp.block import MLP_BLOCK
from predictor.layers.moe.block import MOE_BLOCK
from predictor.layers.ssm.gated_delta_net import GDN
from predictor.layers.ssm.mamba import MAMBA
from tracekit.core import hybrid_pattern
from tracekit.core.config import TrainingConfig
from tracekit.core.hybrid import HybridSettings
from tracekit.core.moe import MoESettings

#: The GPT layer kinds by name (`kind_name`).
_KINDS: dict[str, tuple[Block, ...]] = {"dense": (ATTENTION, MLP_BLOCK), "moe": (ATTENTION, MOE_BLOCK)}
#: The block of each pattern symbol (a `D` layer's: with its indexer; `_dsa` picks the one reusing top-k).
SYMBOL_BLOCKS: dict[str, Block] = {
    hybrid_pattern.MAMBA: MAMBA, hybrid_pattern.GDN: GDN, hybrid_pattern.ATTENTION: ATTENTION,
    hybrid_pattern.DS_ATTENTION: DSA, hybrid_pattern.MLA: MLA, hybrid_pattern.MLP: MLP_BLOCK,
    hybrid_pattern.MOE: MOE_BLOCK}
#: Every block by its name (what `blocks_named` reads back).
BLOCKS: dict[str, Block] = {b.name: b for b in (*SYMBOL_BLOCKS.values(), DSA_SHARED_TOPK)}
_SINGLE = "_layer"


def layer_blocks(c: TrainingConfig, layer: int) -> tuple[Block, ...]:
    """The blocks of decoder layer `layer` (0-based); `mtp_layer(c)` for an MTP layer's."""
    symbols = _symbols(c)
    if symbols is None:  # a GPT model
        moe = c.moe
        return _KINDS["moe" if moe is not None and moe.pattern(c.num_layers)[layer] else "dense"]
    main, mtp, paired = symbols
    if paired:  # a GPT model with a linear/sparse attention variant: two symbols a layer
        if layer >= c.num_layers:
            layer = c.num_layers - 1
        return tuple(_block(c, main[2 * layer + i], layer + 1) for i in range(2))
    if layer >= len(main):  # an MTP depth: its pattern's layers (DSA ones with their own indexer)
        return tuple(SYMBOL_BLOCKS[s] for s in mtp)
    return (_block(c, main[layer], layer + 1),)


def mtp_layer(c: TrainingConfig) -> int:
    """The layer index whose blocks (and window, precision) an MTP layer takes: a GPT model's last decoder layer; a
    hybrid model's MTP depth (the index past its main layers, `layer_blocks`)."""
    symbols = _symbols(c)
    return c.num_layers if symbols is not None and not symbols[2] else c.num_layers - 1


def kind_name(blocks: tuple[Block, ...]) -> str:
    """The name of a layer kind made of `blocks` (module docstring)."""
    for name, kinds in _KINDS.items():
        if kinds == blocks:
            return name
    if len(blocks) == 1:
        return blocks[0].name + _SINGLE
    return "+".join(b.name for b in blocks)


def blocks_named(block: str) -> tuple[Block, ...]:
    """The blocks of the layer kind an op's `block` names (`moe-w4096-bf16`, `dense`, `mamba_layer`, `mtp0:moe-…`:
    the kind's name first, after an MTP layer's prefix)."""
    name = block.rsplit(":", 1)[-1].split("-", 1)[0]
    if name in _KINDS:
        return _KINDS[name]
    if name.endswith(_SINGLE):
        return (BLOCKS[name[: -len(_SINGLE)]],)
    return tuple(BLOCKS[part] for part in name.split("+"))


def _symbols(c: TrainingConfig) -> tuple[str, str, bool] | None:
    """(main layers' symbols, an MTP depth's, whether two symbols make a GPT layer), None for a plain GPT model."""
    settings = c.hybrid
    if settings is None:
        return None
    layout = c.layout
    return _parsed(settings, c.num_layers, layout.mtp_num_layers if layout is not None else None, c.moe)


@lru_cache(maxsize=256)
def _parsed(settings: HybridSettings, num_layers: int, mtp_num_layers: int | None, moe: MoESettings | None
            ) -> tuple[str, str, bool] | None:
    pattern = settings.pattern(num_layers, mtp_num_layers)
    if pattern is not None:
        parsed = hybrid_pattern.parse(pattern)
        return parsed.layers, parsed.mtp or "", False
    variant = settings.experimental_attention_variant
    if variant is None:
        return None
    linear = hybrid_pattern.linear_attention_pattern(settings.linear_attention_freq, num_layers) \
        if variant in ("gdn", "gdn2") and settings.linear_attention_freq is not None else None
    moe_layers = moe.pattern(num_layers) if moe is not None else None
    return hybrid_pattern.gpt_pattern(num_layers, moe_layers, linear, variant), "", True


def _block(c: TrainingConfig, symbol: str, number: int) -> Block:
    """The block of `symbol` in decoder layer `number` (Megatron numbers layers from 1)."""
    if symbol == hybrid_pattern.DS_ATTENTION and not computes_topk(settings_of(c)[1], number):
        return DSA_SHARED_TOPK
    return SYMBOL_BLOCKS[symbol]
