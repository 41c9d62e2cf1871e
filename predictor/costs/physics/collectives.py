"""Collectives from their algorithms over a cluster's links (α–β model): the time NCCL's tuner would pick among
ring, tree and hierarchical algorithms (and NVLS / SHARP where the cluster has in-network reduction).

Conventions (as the samples'): `bytes` is the whole buffer for all_reduce, all_to_all, broadcast and send_recv,
and each rank's shard for all_gather / reduce_scatter. A group of n ranks spans `nodes` nodes with `ranks_per_node`
members on each; every GPU of a node communicates at once in training (all TP groups, all DP groups), so a rank
uses its own share of the node's NICs (`Cluster.inter_node_gbs`).

- ring over n ranks: all_reduce sends 2(n−1)/n·S per rank, all_gather / reduce_scatter (n−1)·shard, in 2(n−1) or
  n−1 steps. Across nodes NCCL runs one ring per rail, so the inter-node hops of a ring carry S/r on each of the r
  NICs of the node's members: bandwidth min(intra, r·NIC).
- tree (all_reduce across nodes): reduce up and broadcast down a binary tree of nodes (2·log2(nodes) network
  steps, r−1 chain steps inside each node), ~2·S per rank at the ring's bandwidth.
- hierarchical all_reduce: reduce-scatter inside the node, all-reduce of S/r across nodes, all-gather inside.
- NVLS (NVSwitch reduction): an all_reduce inside a node moves S once in and once out of each GPU.
- all_to_all: (r−1)/n of the buffer over intra-node links and (n−r)/n over the network, concurrently.
- send_recv: S over the link between the two ranks.

Achievable fractions of the link rates were fitted on the corpus's nccl-tests and NCCL samples (see
`benchmarks/collective_physics.py`, which scores the model on them); the α terms are the per-step latencies of
the cluster. The model is monotone in message size and never faster across nodes than inside one (tested).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from predictor.costs.features import numeric_column
from tracekit.core.cluster import Cluster

#: Achievable share of a link's unidirectional rate for large messages, by fabric (bus bandwidth / link rate).
#: nvswitch 0.73: vTrain's 8×A100 nccl-tests tables (217 of 300 GB/s fitted over 2–8 GPUs, 1 MiB–1 GiB; NVLink 3:
#: see NVSWITCH_EFFICIENCY for later generations); nvlink 0.75: Perlmutter 1×2 / 1×4 all-reduce samples (75 of 100,
#: 225 of 300 GB/s); network 0.92: Vista's 2–8 node all-reduce samples (48 of 50 GB/s = 0.96) derated for multi-hop
#: fat trees.
EFFICIENCY = {"nvswitch": 0.73, "nvlink": 0.75, "xgmi": 0.7, "pcie": 0.8, "none": 0.75, "network": 0.92}
#: NVSwitch ring efficiency by NVLink generation, keyed by the per-GPU unidirectional link rate (GB/s) it starts at:
#: NVLink 3 (300) vTrain's 0.73; NVLink 4 (450) 0.76 fitted on XLA's 8×H100 table, its groups of 8 at ≥ 16 MiB
#: (all-gather, reduce-scatter, all-to-all, all-reduce; scored on its groups of 4 and 2: benchmarks/
#: collective_physics.py). NVLink 5 (900) was not measured: NVLink 4's value.
NVSWITCH_EFFICIENCY = {300.0: 0.73, 450.0: 0.76}
#: Fixed cost of one collective call (launch, protocol set-up), µs; from the same tables' small messages.
BASE_US = 35.0
#: NVLS all-reduce: S in and S out per GPU at this share of the link rate (NCCL 2.17+ on NVLink 4 NVSwitches);
#: fitted with NVSWITCH_EFFICIENCY on the same rows of XLA's 8×H100 table (the 8-GPU all-reduce: 230 GB/s of 450).
NVLS_EFFICIENCY = 0.49


def fabric_efficiency(cluster: Cluster) -> float:
    """The achievable share of the cluster's intra-node link rate (EFFICIENCY; NVSwitch by its NVLink generation)."""
    if cluster.fabric != "nvswitch":
        return EFFICIENCY[cluster.fabric]
    link = cluster.link_gbs(False) or 0.0
    generations = [g for g in sorted(NVSWITCH_EFFICIENCY) if g <= link]
    return NVSWITCH_EFFICIENCY[generations[-1]] if generations else EFFICIENCY["nvswitch"]


def _col(frame: pd.DataFrame, name: str, default: float) -> np.ndarray:
    """A column as float64, `default` where it is missing or unparseable."""
    return np.nan_to_num(numeric_column(frame, name, default), nan=default)


def link_rates(cluster: Cluster, ranks_per_node: np.ndarray) -> tuple[np.ndarray, float]:
    """(intra-node bandwidth per rank for groups of `ranks_per_node` members, network bandwidth per rank), bytes/µs.

    On a point-to-point mesh (`nvlink`, `xgmi`) a rank reaches the r−1 other members over (r−1)/(g−1) of its
    links; a switch gives every pair the full rate. No intra-node path is slower than the rank's own network share
    (NCCL would route through the NIC)."""
    intra = (cluster.link_gbs(False) or 0.0) * fabric_efficiency(cluster) * 1e3
    inter = (cluster.link_gbs(True) or 0.0) * EFFICIENCY["network"] * 1e3
    r = np.maximum(ranks_per_node, 1.0)
    if cluster.fabric in ("nvlink", "xgmi") and cluster.gpus_per_node > 1:
        per_rank = intra * np.clip((r - 1.0) / (cluster.gpus_per_node - 1.0), 1.0 / (cluster.gpus_per_node - 1), 1.0)
    else:
        per_rank = np.full(len(r), intra)
    # NCCL's topology search takes the faster path: a pair on a thin mesh link may go through its NICs instead
    return np.maximum(per_rank, inter), inter


def collective_us(frame: pd.DataFrame, cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """(µs, algorithm) per collective row of `frame` (primitive, bytes, group_size, ranks_per_node, nodes)."""
    prim = frame["primitive"].astype(str).to_numpy()
    size = _col(frame, "bytes", np.nan)
    n = np.maximum(_col(frame, "group_size", 2.0), 1.0)
    nodes = np.maximum(_col(frame, "nodes", 1.0), 1.0)
    r = np.clip(_col(frame, "ranks_per_node", np.nan), 1.0, None)
    r = np.where(np.isnan(r), np.ceil(n / nodes), r)
    intra, inter = link_rates(cluster, r)
    across = nodes > 1
    a_in, a_net = cluster.intra_latency_us, cluster.inter_latency_us
    with np.errstate(divide="ignore", invalid="ignore"):
        # ring bandwidth: intra-node links, or the r rails' NICs when the ring leaves the node
        ring_bw = np.where(across, np.minimum(np.where(r > 1, intra, np.inf), r * inter), intra)
        step = np.where(across, a_net, a_in)
        out = np.full(len(frame), np.nan)
        algo = np.full(len(frame), "", dtype=object)

        # all_reduce: ring, tree, hierarchical, NVLS — the fastest
        ar = prim == "all_reduce"
        ring = BASE_US + 2 * (n - 1) * step + 2 * (n - 1) / n * size / ring_bw
        tree = np.where(across, BASE_US + 2 * np.log2(nodes) * a_net + 2 * (r - 1) * a_in + 2 * size / ring_bw,
                        np.inf)
        in_part = np.where(r > 1, 2 * (r - 1) / r * size / intra + 2 * (r - 1) * a_in, 0.0)
        hier = np.where(across, BASE_US + in_part + 2 * (nodes - 1) / nodes * (size / r) / inter
                        + 2 * (nodes - 1) * a_net, np.inf)
        if cluster.in_network_reduction in ("sharp", "nvls+sharp"):
            hier = np.where(across, BASE_US + in_part + (size / r) / inter + 2 * a_net, hier)
        nvls = np.full(len(frame), np.inf)
        if cluster.in_network_reduction in ("nvls", "nvls+sharp") and cluster.fabric == "nvswitch":
            link = (cluster.link_gbs(False) or 0.0) * NVLS_EFFICIENCY * 1e3
            nvls = np.where(~across & (n > 2), BASE_US + 2 * a_in + size / link, np.inf)
        options = np.vstack([ring, tree, hier, nvls])
        best = np.argmin(np.where(np.isnan(options), np.inf, options), axis=0)
        names = np.array(["ring", "tree", "hierarchical", "nvls"], dtype=object)
        out = np.where(ar, options[best, np.arange(len(frame))], out)
        algo = np.where(ar, names[best], algo)

        # all_gather / reduce_scatter: ring over (n−1) shards
        agrs = np.isin(prim, ("all_gather", "reduce_scatter"))
        out = np.where(agrs, BASE_US + (n - 1) * step + (n - 1) * size / ring_bw, out)
        algo = np.where(agrs, "ring", algo)

        # all_to_all: intra-node and network parts run concurrently
        a2a = prim == "all_to_all"
        t_in = np.where(r > 1, (r - 1) / n * size / intra, 0.0)
        t_net = np.where(across, (n - r) / n * size / inter, 0.0)
        out = np.where(a2a, BASE_US + (n - 1) * step + np.maximum(t_in, t_net), out)
        algo = np.where(a2a, "pairwise", algo)

        # broadcast: pipelined ring
        bc = prim == "broadcast"
        out = np.where(bc, BASE_US + (n - 1) * step + size / ring_bw, out)
        algo = np.where(bc, "ring", algo)

        # send_recv: one link
        p2p = prim == "send_recv"
        p2p_bw = np.where(across, inter, intra)
        out = np.where(p2p, BASE_US + step + size / p2p_bw, out)
        algo = np.where(p2p, "p2p", algo)
    bad = ~np.isfinite(out) | np.isnan(size) | (size < 0)
    out = np.where(bad, np.nan, out)
    return out, algo
