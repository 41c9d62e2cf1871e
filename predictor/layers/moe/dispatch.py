"""How many tokens a rank's expert-parallel dispatch (and its combine) puts on the wire, by dispatcher, for the
pairwise all-to-all of predictor.costs.physics.collectives (a buffer spread evenly over the group's n ranks: (r − 1)/n
of it over the node's links, (n − r)/n over the network, r ranks a node).

- `alltoall` (Megatron's default dispatcher): one copy per routed expert, T · k.
- flex dispatcher (its fused kernels: `deepep`, `hybridep`, `ncclep`) inside one node or NVLink domain, and
  `ncclep` everywhere: one copy per distinct destination rank, T · r_ranks, r_ranks = EP · (1 − C(E − E/EP, k) /
  C(E, k)) for uniform routing.
- flex dispatcher across nodes: DeepEP's internode kernels (and HybridEP's hierarchical ones) send a token over the
  network once per distinct remote destination node, to the rank of the same local index there, which forwards it
  over NVLink to the node's destination ranks (DeepEP's README: its normal kernels forward between the NVLink and
  RDMA domains; the DeepSeek-V3 report, §3.2.2). The network carries T · u tokens, u = (nodes − 1) · (1 − C(E − E_node,
  k) / C(E, k)) the expected distinct remote nodes (E_node = E · r / n experts a node). The equivalent buffer of the
  pairwise all-to-all, whose network share is (n − r)/n, is T · u · n / (n − r). The NVLink forwarding runs
  concurrently with the network sends and carries at most T · r_ranks tokens at a link rate 7–18× a NIC's share, so
  the network part is the time.
"""
from __future__ import annotations

from math import comb

#: Flex backends whose internode kernels cross the network once per destination node and forward over NVLink.
HIERARCHICAL = ("deepep", "hybridep")


def _hit(experts: int, held: int, topk: int) -> float:
    """Probability that a given holder of `held` of `experts` experts holds at least one of a token's top-k."""
    if held >= experts or topk > experts - held:
        return 1.0
    return 1.0 - comb(experts - held, topk) / comb(experts, topk)


def distinct_ranks(experts: int, ep: int, topk: int) -> float:
    """Expected number of distinct EP ranks among a token's top-k experts (uniform routing, E/EP experts a rank)."""
    local = experts // ep
    if local * ep != experts or topk > experts:
        return float(min(topk, ep))
    return ep * _hit(experts, local, topk)


def remote_nodes(experts: int, ep: int, topk: int, nodes: int) -> float:
    """Expected number of distinct nodes other than the sender's among a token's top-k experts, the EP group's `ep`
    ranks spread evenly over `nodes` nodes (uniform routing)."""
    if nodes <= 1:
        return 0.0
    per_node = experts * (ep // nodes) // ep
    if per_node * nodes != experts:
        return float(min(topk, nodes - 1))
    return (nodes - 1) * _hit(experts, per_node, topk)


def dispatch_tokens(dispatcher: str, tokens: float, experts: int, ep: int, topk: int, nodes: int,
                    ranks_per_node: int) -> float:
    """Token copies of a rank's dispatch as the pairwise all-to-all's buffer (module docstring)."""
    if dispatcher == "alltoall":
        return tokens * topk
    if dispatcher not in HIERARCHICAL or nodes <= 1 or ranks_per_node * nodes != ep:
        return tokens * distinct_ranks(experts, ep, topk)
    return tokens * remote_nodes(experts, ep, topk, nodes) * ep / (ep - ranks_per_node)
