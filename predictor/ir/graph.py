"""The operator graph of one configuration: each pipeline stage's segments (the ops of one model chunk's forward and
backward per micro-batch) and the per-iteration ops (P2P, gradient sync, parameter gathers, optimizer, casts,
reports). Built by `predictor.assembly.graph.build_graph`; read by the schedule, memory and report rooms."""
from __future__ import annotations

from dataclasses import dataclass, field

from tracekit.core.config import TrainingConfig

from .ops import OpUse
from .placement import GroupPlacement


@dataclass
class Segment:
    """The ops one pipeline stage runs for one model chunk per micro-batch: forward and backward."""

    stage: int
    chunk: int
    layers: int  # decoder layers
    first: bool  # holds the embedding
    last: bool  # holds the LM head and loss
    fwd: list[OpUse] = field(default_factory=list)
    bwd: list[OpUse] = field(default_factory=list)
    params: int = 0  # parameters held by this chunk on one GPU (dense and expert)


@dataclass
class Graph:
    """Every stage's segments plus the per-iteration ops (P2P, gradient sync, optimizer) of one configuration."""

    config: TrainingConfig
    hardware: str
    gpus_per_node: int
    groups: dict[str, GroupPlacement]
    specs: list[dict]
    segments: list[Segment]  # ordered by (stage, chunk)
    p2p: int | None  # spec of one activation transfer between adjacent stages (None without PP)
    grad_sync: dict[int, list[OpUse]]  # per stage: DP gradient sync (and tied-embedding all-reduce)
    param_gather: dict[int, list[OpUse]]  # per stage: distributed optimizer's parameter all-gather
    optimizer: dict[int, OpUse]  # per stage: the optimizer step
    casts: dict[int, list[OpUse]] = field(default_factory=dict)  # per stage: once-per-iteration weight casts, Muon
    reports: dict[int, list[tuple[OpUse, float]]] = field(default_factory=dict)  # per stage: (op, per iteration)
    # per stage and model chunk: the elements of each bucket of its dense and expert gradient buffers, as Megatron's
    # DDP cuts them (predictor.parallel.grad_buckets), collective or not (one rank reduces nothing, yet scales)
    buckets: dict[int, list[tuple[list[int], list[int]]]] = field(default_factory=dict)
    # spec of the all-gather over the tensor-parallel group that follows each transfer under Megatron-LM 2021's
    # scatter/gather of pipeline tensors (predictor.parallel.pipeline_p2p); None without it
    p2p_gather: int | None = None
    _index: dict[tuple, int] = field(default_factory=dict, repr=False)

    def segment(self, stage: int, chunk: int) -> Segment:
        return self.segments[stage * self.config.vp + chunk]
