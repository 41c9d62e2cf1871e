"""Where each parallel group's ranks sit: Megatron's rank order (tp fastest, then cp, dp, pp) on nodes of
`gpus_per_node` GPUs (an NVLink domain: `Cluster.domain_size`) decides whether a group's collectives stay inside a node
or cross the network.

Expert layers have their own order (Megatron-core's expert rank generator, "tp-ep-dp-pp"): expert tensor parallelism
fastest, then expert parallelism, then the expert data-parallel ranks, then the pipeline stages. The groups are `ep`
(token dispatch and combine), `etp` (the experts' tensor parallelism), `edp` (expert gradient reduction), `tpep` (the
all-gather dispatcher's group, etp·ep ranks) and `dpcp` (the dense gradients' reduction over data and context
parallel ranks)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

#: Megatron's rank order, fastest-varying first.
ORDER = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True)
class GroupPlacement:
    """One process group as seen from global rank 0's groups (all groups of a kind have the same shape when
    gpus_per_node divides the stride pattern; otherwise the worst group is reported)."""

    kind: str
    size: int
    stride: int  # global-rank distance between consecutive members
    nodes: int  # distinct nodes the group spans
    ranks_per_node: int  # members per node (max over nodes)

    @property
    def crosses_nodes(self) -> bool:
        return self.nodes > 1


def strides(tp: int, cp: int, dp: int, pp: int) -> dict[str, int]:
    """Global-rank stride of each group kind in Megatron's order."""
    return {"tp": 1, "cp": tp, "dp": tp * cp, "pp": tp * cp * dp}


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


def placements(tp: int, cp: int, dp: int, pp: int, gpus_per_node: int, ep: int = 1, etp: int | None = None
               ) -> dict[str, GroupPlacement]:
    """GroupPlacement of the tp, cp, dp and pp groups, `p2p` (one pipeline hop between adjacent stages), `dpcp`,
    `world` (every rank), and the expert groups `ep`, `etp`, `edp`, `tpep` (module docstring; etp defaults to tp)."""
    world = tp * cp * dp * pp
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    out = {k: group_placement(k, sizes[k], s, gpus_per_node, world) for k, s in strides(tp, cp, dp, pp).items()}
    hop = group_placement("p2p", 2 if pp > 1 else 1, strides(tp, cp, dp, pp)["pp"], gpus_per_node, world)
    out["p2p"] = hop
    out["dpcp"] = _contiguous("dpcp", dp * cp, tp, gpus_per_node, world)
    out["world"] = group_placement("world", world, 1, gpus_per_node, world)  # every rank (a barrier's group)
    etp = etp or tp
    edp = max(1, world // (pp * etp * ep))
    out["etp"] = group_placement("etp", etp, 1, gpus_per_node, world)
    out["ep"] = group_placement("ep", ep, etp, gpus_per_node, world)
    out["tpep"] = group_placement("tpep", etp * ep, 1, gpus_per_node, world)
    out["edp"] = group_placement("edp", edp, etp * ep, gpus_per_node, world)
    return out


def _contiguous(kind: str, size: int, stride: int, gpus_per_node: int, world: int) -> GroupPlacement:
    """The data-parallel ranks of all context-parallel ranks together: in Megatron's order cp and dp are adjacent,
    so the group is every `stride`-th rank of a contiguous block (the same walk as one group of that stride)."""
    return group_placement(kind, size, stride, gpus_per_node, world)


def rank_coordinates(rank: int, tp: int, cp: int, dp: int, pp: int) -> dict[str, int]:
    """(tp, cp, dp, pp) coordinates of a global rank."""
    return {
        "tp": rank % tp,
        "cp": (rank // tp) % cp,
        "dp": (rank // (tp * cp)) % dp,
        "pp": rank // (tp * cp * dp),
    }
