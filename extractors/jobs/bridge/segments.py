"""The NVLink domain a Megatron-Bridge job sees on a rack-scale NVLink system (GB200/GB300 NVL72: 18 compute trays of
4 GPUs a rack): Bridge's performance launcher asks Slurm for its nodes in segments
(`scripts/performance/utils/executors.py`, `slurm_executor`: with 4 GPUs a node, `--segment` = the job's node count
up to 18, else the largest divisor of it that is at most 18). Slurm places each segment's nodes inside one NVLink
domain (a rack), and the ranks run in node order, so the job's domains are its segments: a 256-GPU job (64 trays) runs
in four segments of 16 trays, four NVLink domains of 64 GPUs, not over 72-GPU racks cut at every 72nd rank. A
parallel group inside one segment (an expert-parallel group of 32 or 64 consecutive ranks) never crosses the
network; with 72-GPU domains every other such group would straddle two racks (`predictor.ir.placement` takes the worst
group), and its all-to-all would run at a NIC's rate.

    segment_trays(nodes, trays_per_domain) -> the trays (nodes) of one segment
    segmented(cluster, num_gpus) -> (the cluster with the segment as its NVLink domain, a note)
    launched_cluster(stack, cluster, num_gpus) -> `segmented` for a stack whose runs Bridge's launcher starts, else
        the cluster as given (`predict` and `predict --batch` call it)
"""
from __future__ import annotations

import dataclasses

from tracekit.core.cluster import Cluster

#: Stacks whose published runs come from Megatron-Bridge's performance launcher.
LAUNCHED_IN_SEGMENTS = ("megatron-bridge",)


def segment_trays(nodes: int, trays_per_domain: int) -> int:
    """Nodes of one Slurm segment as Bridge's launcher asks for them: all of them when they fit one domain, else
    the largest divisor of `nodes` that is at most `trays_per_domain`."""
    if nodes < 1 or trays_per_domain < 1:
        raise ValueError(f"nodes ({nodes}) and trays per domain ({trays_per_domain}) must be ≥ 1")
    if nodes <= trays_per_domain:
        return nodes
    return next(s for s in range(trays_per_domain, 0, -1) if nodes % s == 0)


def segmented(cluster: Cluster, num_gpus: int) -> tuple[Cluster, str | None]:
    """`cluster` with its NVLink domain cut to the job's segment (module docstring), and a note saying so; the
    cluster unchanged (and None) where the node is the domain, the job fits one domain, or its GPUs are not whole
    nodes."""
    domain, gpn = cluster.nvlink_domain, cluster.gpus_per_node
    if domain is None or domain <= gpn or num_gpus <= domain or num_gpus % gpn:
        return cluster, None
    size = segment_trays(num_gpus // gpn, domain // gpn) * gpn
    if size == domain:
        return cluster, None
    note = (f"NVLink domains of {size} GPUs: Megatron-Bridge's launcher asks Slurm for {num_gpus // gpn} nodes in "
            f"segments of {size // gpn} (one rack each) of the {domain}-GPU racks")
    return dataclasses.replace(cluster, nvlink_domain=size, name=f"{cluster.name}+segment{size // gpn}"), note


def launched_cluster(stack: str, cluster: Cluster, num_gpus: int) -> tuple[Cluster, str | None]:
    """The cluster a job of software stack `stack` runs on as its launcher places it: Megatron-Bridge's in Slurm
    segments (`segmented`), any other stack's as given."""
    return segmented(cluster, num_gpus) if stack in LAUNCHED_IN_SEGMENTS else (cluster, None)
