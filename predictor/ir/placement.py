"""Where each parallel group's ranks sit: Megatron's rank order (tp fastest, then cp, dp, pp; with
`--use-tp-pp-dp-mapping` tp, cp, pp, dp: `ORDERS`) on nodes of `gpus_per_node` GPUs (an NVLink domain:
`Cluster.domain_size`) decides whether a group's collectives stay inside a node or cross the network.

Expert layers have their own order (Megatron-core's expert rank generator, "tp-ep-dp-pp", or "tp-ep-pp-dp"): expert
tensor parallelism fastest, then expert parallelism, then the expert data-parallel ranks and the pipeline stages in
the order's turn. In the tp-pp-dp order the data-parallel ranks of all context-parallel ranks (`dpcp`) are no longer
one stride apart: the group spans two axes (`GroupPlacement.axes`). The groups are `ep`
(token dispatch and combine), `etp` (the experts' tensor parallelism), `edp` (expert gradient reduction), `tpep` (the
all-gather dispatcher's group, etp·ep ranks) and `dpcp` (the dense gradients' reduction over data and context
parallel ranks)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

#: Megatron's rank orders, fastest-varying first: its default, and `--use-tp-pp-dp-mapping`'s.
DEFAULT_ORDER = "tp-cp-dp-pp"
ORDERS = {DEFAULT_ORDER: ("tp", "cp", "dp", "pp"), "tp-cp-pp-dp": ("tp", "cp", "pp", "dp")}


def order_of(config) -> str:
    """The rank order a configuration (a TrainingConfig) runs with (Megatron's `initialize.py`)."""
    return "tp-cp-pp-dp" if config.extra.get("use_tp_pp_dp_mapping") else DEFAULT_ORDER


@dataclass(frozen=True)
class GroupPlacement:
    """One process group as seen from global rank 0's groups (all groups of a kind have the same shape when
    gpus_per_node divides the stride pattern; otherwise the worst group is reported)."""

    kind: str
    size: int
    stride: int  # global-rank distance between consecutive members (of the fastest axis)
    nodes: int  # distinct nodes the group spans
    ranks_per_node: int  # members per node (max over nodes)
    axes: tuple[tuple[int, int], ...] = ()  # (size, stride) of each axis, fastest first, where more than one

    def members(self, rank: int) -> list[int]:
        """The global ranks of the group `rank` belongs to, in group order."""
        axes = self.axes or ((self.size, self.stride),)
        base = rank - sum((rank // stride % size) * stride for size, stride in axes)
        out = [base]
        for size, stride in axes:
            out = [r + i * stride for i in range(size) for r in out]
        return out

    @property
    def crosses_nodes(self) -> bool:
        return self.nodes > 1


def strides(tp: int, cp: int, dp: int, pp: int, order: str = DEFAULT_ORDER) -> dict[str, int]:
    """Global-rank stride of each group kind in Megatron's `order`."""
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    out, stride = {}, 1
    for kind in ORDERS[order]:
        out[kind] = stride
        stride *= sizes[kind]
    return out


@lru_cache(maxsize=4096)  # a search asks for the same few groups again and again
def group_placement(kind: str, size: int, stride: int, gpus_per_node: int, world: int) -> GroupPlacement:
    """Span of the worst group of this kind (most nodes, then most members on one node)."""
    if size <= 1:
        return GroupPlacement(kind, 1, stride, 1, 1)
    worst = (0, 0)
    period = math.lcm(stride * size, gpus_per_node)  # the pattern of group shapes repeats after this many ranks
    for start in range(min(world, period)):
        if (start // stride) % size:
            continue
        per_node: dict[int, int] = {}
        for i in range(size):
            node = (start + i * stride) // gpus_per_node
            per_node[node] = per_node.get(node, 0) + 1
        worst = max(worst, (len(per_node), max(per_node.values())))
    return GroupPlacement(kind, size, stride, worst[0], worst[1])


@lru_cache(maxsize=1024)
def _two_axes(kind: str, axes: tuple[tuple[int, int], ...], gpus_per_node: int, world: int) -> GroupPlacement:
    """Span of the worst group over several axes ((size, stride), fastest first): every group is walked once."""
    size = math.prod(n for n, _ in axes)
    worst, seen = (0, 0), set()
    for rank in range(world):
        if rank in seen:
            continue
        group = GroupPlacement(kind, size, axes[0][1], 0, 0, axes).members(rank)
        seen.update(group)
        per_node: dict[int, int] = {}
        for member in group:
            per_node[member // gpus_per_node] = per_node.get(member // gpus_per_node, 0) + 1
        worst = max(worst, (len(per_node), max(per_node.values())))
    return GroupPlacement(kind, size, axes[0][1], worst[0], worst[1], axes)


def placements(tp: int, cp: int, dp: int, pp: int, gpus_per_node: int, ep: int = 1, etp: int | None = None,
               order: str = DEFAULT_ORDER) -> dict[str, GroupPlacement]:
    """GroupPlacement of the tp, cp, dp and pp groups, `p2p` (one pipeline hop between adjacent stages), `dpcp`,
    `world` (every rank), and the expert groups `ep`, `etp`, `edp`, `tpep` (module docstring; etp defaults to tp)."""
    world = tp * cp * dp * pp
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    stride = strides(tp, cp, dp, pp, order)
    out = {k: group_placement(k, sizes[k], s, gpus_per_node, world) for k, s in stride.items()}
    out["p2p"] = group_placement("p2p", 2 if pp > 1 else 1, stride["pp"], gpus_per_node, world)
    if cp > 1 and dp > 1 and stride["dp"] != tp * cp:  # cp and dp not adjacent (tp-pp-dp with a pipeline)
        out["dpcp"] = _two_axes("dpcp", ((cp, stride["cp"]), (dp, stride["dp"])), gpus_per_node, world)
    else:  # every tp-th rank of a block (cp and dp adjacent), or the one axis that is more than one rank
        out["dpcp"] = group_placement("dpcp", dp * cp, stride["dp"] if cp == 1 else tp, gpus_per_node, world)
    out["world"] = group_placement("world", world, 1, gpus_per_node, world)  # every rank (a barrier's group)
    etp = etp or tp
    edp = max(1, world // (pp * etp * ep))
    out["etp"] = group_placement("etp", etp, 1, gpus_per_node, world)
    out["ep"] = group_placement("ep", ep, etp, gpus_per_node, world)
    out["tpep"] = group_placement("tpep", etp * ep, 1, gpus_per_node, world)
    edp_stride = etp * ep * (pp if ORDERS[order].index("pp") < ORDERS[order].index("dp") else 1)
    out["edp"] = group_placement("edp", edp, edp_stride, gpus_per_node, world)
    return out


def rank_coordinates(rank: int, tp: int, cp: int, dp: int, pp: int, order: str = DEFAULT_ORDER) -> dict[str, int]:
    """(tp, cp, dp, pp) coordinates of a global rank in Megatron's `order`."""
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    return {k: rank // s % sizes[k] for k, s in strides(tp, cp, dp, pp, order).items()}
