"""Operator graph of one micro-batch's forward and backward on every pipeline stage, as Megatron-core builds a GPT.

Each distinct operator shape becomes one *spec* (predictor.ir.ops); the graph refers to specs by index, so an
iteration's thousands of operator instances need only a few dozen estimates. Conventions follow the seed paper's
samples (corpus README): tensors are `[l, b, ...]`; `variant` is the seed paper's op name where one applies; every
`bwd` row carries its forward operator's features. The backward of an op is asked in one of two forms, whichever the
model set holds for the hardware and primitive (`ModelSet.role_primitives`, passed in as `backward_roles`): the whole
backward (one row, no role: the seed paper's form, the default), or for GEMMs (gemm, bmm) in `backward_roles` its
parts per role: `dgrad` and `wgrad` (one forward's FLOPs each) and, for a linear with a bias (`add_bias_linear`;
never the LM head), `bgrad` — together the same work as the whole row.

Which layers each pipeline rank's model chunks hold is Megatron's rule (tracekit.core.pipeline_layout: even splits,
uneven first/last stages, layouts, the embedding/loss counted as layers, MTP beside the loss). A decoder layer is its
blocks (predictor.layers.decoder: an attention block, predictor.layers.attention.ops: MHA/GQA, MLA, sliding windows,
CP; and an MLP block, predictor.layers.mlp.ops, or an MoE block, predictor.layers.moe.ops: router, dispatch,
experts, combine, shared experts, per `moe_layer_freq`), each block's ops in order; layers of the same kind (blocks,
window, bf16 under a low-precision recipe, replayed in full or not) share one op list, repeated per layer
(`OpUse.count`, `OpUse.block`). Forward and backward are mirrored: each op's backward in reverse order. Recompute `full`
replays the layer's forward (with its collectives) before its backward (with `recompute_method block`, only the first
`recompute_num_layers` layers of each chunk); `selective` replays the modules Megatron's `recompute_modules` names
(default core attention). A job that compiles its blocks (`torch_compile`) runs each layer's memory-bound ops as
Inductor's fused kernels (predictor.layers.compile_fusion). Per iteration and stage: the gradient sync and optimizer
(predictor.parallel.data_parallel); between stages, the activation's hand-over (predictor.parallel.pipeline_p2p).
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from predictor.architecture.params import chunk_params
from predictor.ir.graph import Graph, Segment
from predictor.ir.ops import COMM, COMPUTE, Backward, OpBuilder, OpUse, Pair, parts
from predictor.layers.block import Block
from predictor.layers.compile_fusion import compiled, fuse_layer
from predictor.layers.decoder import kind_name, layer_blocks, mtp_layer
from predictor.layers.embedding.ops import embedding, head, mtp_ends
from predictor.layers.pytorch_native import per_op_replay
from predictor.parallel import fsdp
from predictor.parallel.data_parallel import stage_sync
from predictor.parallel.pipeline_p2p import p2p_ops
from tracekit.core.config import TrainingConfig
from tracekit.core.pipeline_layout import Chunk, chunks

__all__ = ["COMM", "COMPUTE", "Backward", "Graph", "OpUse", "Segment", "build_graph", "chunk_params"]


@dataclass(frozen=True)
class _Kind:
    """What distinguishes one decoder layer's ops from another's."""

    blocks: tuple[Block, ...]  # the layer's blocks (predictor.layers.decoder)
    window: int | None
    bf16: bool  # a layer the low-precision recipe keeps in bf16
    full_replay: bool

    @property
    def name(self) -> str:
        return "-".join(filter(None, (kind_name(self.blocks), f"w{self.window}" if self.window else "",
                                      "bf16" if self.bf16 else "", "replay" if self.full_replay else "")))


class _Layers:
    """The op lists of each kind of decoder layer, built once."""

    def __init__(self, b: OpBuilder):
        self.b = b
        self.built: dict[_Kind, tuple[list[OpUse], list[OpUse], float]] = {}
        self.repeated: dict[tuple[_Kind, int], tuple[list[OpUse], list[OpUse]]] = {}

    def run(self, kind: _Kind, count: int) -> tuple[list[OpUse], list[OpUse], float]:
        """`ops` of a run of `count` layers of this kind (their counts set; built once per kind and count)."""
        forward, backward, cast = self.ops(kind)
        key = (kind, count)
        if key not in self.repeated:
            self.repeated[key] = (_times(forward, count), _times(backward, count))
        return (*self.repeated[key], cast * count)

    def kind(self, layer: int, position: int) -> _Kind:
        """The kind of decoder layer `layer`, the `position`-th of its chunk."""
        c = self.b.c
        return _Kind(blocks=layer_blocks(c, layer),
                     window=c.attn.window(min(layer, c.num_layers - 1)) if c.attn else None,
                     bf16=bool(c.lowp and c.lowp.bf16_layer(layer, c.num_layers) and c.recipe.low_precision),
                     full_replay=c.replays_in_full(position))

    def ops(self, kind: _Kind) -> tuple[list[OpUse], list[OpUse], float]:
        """(forward, replay + backward, elements of the weights the recipe casts) of one layer of this kind."""
        if kind not in self.built:
            b = self.b
            b.weight_casts = []
            lowp = not kind.bf16
            pairs = [pair for block in kind.blocks for pair in block.ops(b, kind.window, lowp)]
            if compiled(b.c):  # torch.compile: the layer's memory-bound ops as Inductor's fused kernels
                pairs = fuse_layer(b, pairs)
            forward = [op.placed(1, False, kind.name) for op, _, _ in pairs if op is not None]
            backward = [part.placed(1, False, kind.name) for _, op, _ in reversed(pairs) for part in parts(op)]
            replay = [o.placed(1, True, kind.name) for o in _replayed(b.c, kind, pairs, b.specs)]
            self.built[kind] = (forward, replay + backward, float(sum(b.weight_casts)))
        return self.built[kind]


def _replayed(c: TrainingConfig, kind: _Kind, pairs: list[Pair], specs: list[dict]) -> list[OpUse]:
    """The forward ops recompute replays before the layer's backward."""
    if kind.full_replay:
        return [op for op, _, _ in pairs if op is not None]
    if c.recompute_granularity != "selective":
        return []
    modules = set(c.recompute_modules or ("core_attn",))
    if "per_op" in modules:  # torchtitan's per-op policy (predictor.layers.pytorch_native)
        return per_op_replay(pairs, specs)
    if "moe" in modules:
        modules.add("moe_act")
    return [op for op, _, module in pairs if op is not None and module in modules
            and (op.group is None or module in ("moe", "mlp", "shared_experts"))]


def _runs(layers: tuple[int, ...], layer_kinds: _Layers) -> list[tuple[_Kind, int]]:
    """Consecutive layers of one kind, in order: [(kind, count)]."""
    out: list[tuple[_Kind, int]] = []
    for position, layer in enumerate(layers):
        kind = layer_kinds.kind(layer, position)
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + 1)
        else:
            out.append((kind, 1))
    return out


def _times(ops: list[OpUse], count: int) -> list[OpUse]:
    """Per-layer ops with their count set to the layers of their run."""
    return [o.placed(count, o.recompute, o.block) for o in ops]


def _segment(b: OpBuilder, layer_kinds: _Layers, stage: int, index: int, part: Chunk,
             ends: dict[str, tuple[list[OpUse], list[OpUse]]]) -> tuple[Segment, float]:
    """One model chunk's segment and the weight elements the recipe casts on it (once per iteration)."""
    c = b.c
    seg = Segment(stage, index, part.num_layers, part.embedding, part.loss)
    fwd: list[OpUse] = list(ends["embedding"][0]) if part.embedding else []
    bwd_blocks: list[list[OpUse]] = []
    casts = 0.0
    for kind, count in _runs(part.layers, layer_kinds):
        forward, backward, cast = layer_kinds.run(kind, count)
        fwd.extend(forward)
        bwd_blocks.append(backward)
        casts += cast
    for i in range(part.mtp):  # MTP layers: a GPT's shaped like its last decoder layer, a hybrid's its pattern's
        kind = layer_kinds.kind(mtp_layer(c), 0)
        forward, backward, cast = layer_kinds.ops(kind)
        pre_fwd, post_fwd, pre_bwd, post_bwd = mtp_ends(b, i)
        mtp_block = f"mtp{i}:{kind.name}"
        fwd.extend(pre_fwd + [o.placed(1, o.recompute, mtp_block) for o in forward] + post_fwd)
        bwd_blocks.append(post_bwd + [o.placed(1, o.recompute, mtp_block) for o in backward] + pre_bwd)
        casts += cast
    if part.loss:
        fwd.extend(ends["head"][0])
    bwd: list[OpUse] = list(ends["head"][1]) if part.loss else []
    for block in reversed(bwd_blocks):
        bwd.extend(block)
    if part.embedding:
        bwd.extend(ends["embedding"][1])
    seg.fwd, seg.bwd = fwd, bwd
    dense, expert = chunk_params(c, stage, index)
    seg.params = dense + expert
    return seg, casts


def build_graph(config: TrainingConfig, hardware: str, gpus_per_node: int = 8,
                backward_roles: Collection[str] = ()) -> Graph:
    """The operator graph of `config` on `hardware` (validated first; raises ConfigError). `gpus_per_node`: GPUs of
    one NVLink domain (a node, or an NVL72 rack); `backward_roles`: the primitives (gemm, bmm) whose backward is
    asked per role rather than whole (module docstring)."""
    config.validate()
    c = config
    b = OpBuilder(config, hardware, gpus_per_node, backward_roles)
    layer_kinds = _Layers(b)
    ends = {"embedding": embedding(b), "head": head(b)}
    segments: list[Segment] = []
    stage_casts = [0.0] * c.pp
    for stage, row in enumerate(chunks(c)):
        for index, part in enumerate(row):
            seg, casts = _segment(b, layer_kinds, stage, index, part, ends)
            segments.append(seg)
            stage_casts[stage] += casts
    if fsdp.sharding_of(c).per_unit:  # FSDP/ZeRO-2/3: each unit's collectives inside forward and backward
        fsdp.insert_unit_ops(b, segments)
    p2p_op, p2p_gather = p2p_ops(b)
    grad_sync: dict[int, list[OpUse]] = {}
    param_gather: dict[int, list[OpUse]] = {}
    optimizer: dict[int, OpUse] = {}
    weight_casts: dict[int, list[OpUse]] = {}
    reports: dict[int, list[tuple[OpUse, float]]] = {}
    buckets: dict[int, list[tuple[list[int], list[int]]]] = {}
    for stage in range(c.pp):
        sync = stage_sync(b, stage, stage_casts[stage])
        grad_sync[stage], param_gather[stage], weight_casts[stage] = sync.grad_sync, sync.param_gather, sync.casts
        reports[stage], buckets[stage] = sync.reports, sync.buckets
        assert sync.optimizer is not None
        optimizer[stage] = sync.optimizer
    return Graph(config, hardware, gpus_per_node, b.groups, b.specs, segments,
                 None if p2p_op is None else p2p_op.spec, grad_sync, param_gather, optimizer, weight_casts, reports,
                 buckets, None if p2p_gather is None else p2p_gather.spec, b.index)
