"""The collective algorithm model (predictor.costs.physics.collectives) on facts that cannot drift: bus-bandwidth
identities, locality, monotonicity, the hierarchical decomposition, and its agreement with the corpus's nccl-tests
tables."""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from predictor.costs.physics.collectives import collective_us
from tests.conftest import CORPUS
from tracekit.core.cluster import PRESETS, preset

PRIMITIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")


def times(cluster, primitive: str, nbytes, n: int, per_node: int, nodes: int) -> np.ndarray:
    sizes = np.atleast_1d(np.asarray(nbytes, dtype=float))
    frame = pd.DataFrame({"primitive": primitive, "bytes": sizes, "group_size": float(n),
                          "ranks_per_node": float(per_node), "nodes": float(nodes)})
    return collective_us(frame, cluster)[0]


def slope(cluster, primitive, n, per_node, nodes, size=1 << 30) -> float:
    """µs per extra `size` bytes: the bandwidth term alone (fixed costs cancel)."""
    t = times(cluster, primitive, [size, 2 * size], n, per_node, nodes)
    return float(t[1] - t[0])


@pytest.mark.parametrize("name", ["dgx-a100", "selene", "pcie"])
def test_ring_moves_2_n_minus_1_over_n_of_the_bytes(name):
    # ring all-reduce sends 2(n-1)/n of the buffer per rank; all-gather (n-1) shards: bandwidth-term ratios are
    # fixed by the algorithm whatever the link rate (a switch gives every group size the same per-rank rate; a
    # mesh would not, and NVLS is not a ring)
    cluster = PRESETS[name]
    ar8, ar2 = slope(cluster, "all_reduce", 8, 8, 1), slope(cluster, "all_reduce", 2, 2, 1)
    assert ar8 / ar2 == pytest.approx((2 * 7 / 8) / (2 * 1 / 2), rel=1e-9)
    ag8, ag4 = slope(cluster, "all_gather", 8, 8, 1), slope(cluster, "all_gather", 4, 4, 1)
    assert ag8 / ag4 == pytest.approx(7 / 3, rel=1e-9)
    # a reduce-scatter of shard s moves what an all-reduce of n·s moves in its first half
    rs = slope(cluster, "reduce_scatter", 8, 8, 1, size=1 << 27)
    ar = slope(cluster, "all_reduce", 8, 8, 1, size=8 << 27)
    assert rs == pytest.approx(ar / 2, rel=1e-9)


def test_mesh_pairs_get_their_share_of_the_links():
    # a point-to-point mesh (Perlmutter's NVLink 3: 4 of 12 links per pair): a 2-rank group runs at a third of the
    # rate of the whole node, per byte of ring traffic; MI300X's single xGMI link per pair (64 GB/s) is slower than
    # the GPU's own 400 Gb/s NIC share, which NCCL/RCCL would route through instead
    cluster, gpus = preset("perlmutter"), 4
    per_byte_2 = slope(cluster, "all_reduce", 2, 2, 1) / (2 * 1 / 2)
    per_byte_all = slope(cluster, "all_reduce", gpus, gpus, 1) / (2 * (gpus - 1) / gpus)
    assert per_byte_2 / per_byte_all == pytest.approx(gpus - 1, rel=1e-9)
    mi300x = preset("mi300x")
    assert slope(mi300x, "send_recv", 2, 2, 1) == pytest.approx(slope(mi300x, "send_recv", 2, 1, 2), rel=1e-9)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_inside_a_node_never_slower_than_across_nodes(name):
    cluster = PRESETS[name]
    gpn = cluster.gpus_per_node
    sizes = np.logspace(2, 10, 33)
    for primitive in PRIMITIVES:
        for n in (2, 4, 8):
            if n > gpn:
                continue
            n_eff = 2 if primitive == "send_recv" else n
            inside = times(cluster, primitive, sizes, n_eff, n_eff, 1)
            for per_node in (1, 2, 4):
                if n_eff % per_node or per_node >= n_eff:
                    continue
                across = times(cluster, primitive, sizes, n_eff, per_node, n_eff // per_node)
                assert np.all(inside <= across * (1 + 1e-12)), (primitive, n_eff, per_node)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_larger_messages_never_faster(name):
    cluster = PRESETS[name]
    sizes = np.logspace(0, 11, 200)
    for primitive, (n, per_node, nodes) in itertools.product(
            PRIMITIVES, [(2, 2, 1), (8, 8, 1), (16, 8, 2), (64, 8, 8), (32, 1, 32), (1024, 4, 256)]):
        if per_node > cluster.gpus_per_node:
            continue
        t = times(cluster, primitive, sizes, n, per_node, nodes)
        assert np.all(np.isfinite(t)) and np.all(np.diff(t) >= 0), (primitive, n, per_node, nodes)


def test_hierarchical_all_reduce_lands_between_its_parts():
    # 8 nodes × 8 GPUs: slower than either part alone (the node's all-reduce of S, the network all-reduce of the
    # S/8 each GPU carries across), faster than doing both one after the other
    cluster = preset("selene")
    for size in (1 << 20, 64 << 20, 1 << 30, 8 << 30):
        whole = times(cluster, "all_reduce", size, 64, 8, 8)[0]
        intra = times(cluster, "all_reduce", size, 8, 8, 1)[0]
        inter = times(cluster, "all_reduce", size / 8, 8, 1, 8)[0]
        assert max(intra, inter) <= whole <= intra + inter, size


def test_in_network_reduction_and_faster_links_help():
    size = [256 << 20]
    h100 = times(preset("dgx-h100"), "all_reduce", size, 8, 8, 1)[0]
    a100 = times(preset("dgx-a100"), "all_reduce", size, 8, 8, 1)[0]
    assert h100 < a100
    _, algo = collective_us(pd.DataFrame({"primitive": ["all_reduce"], "bytes": size, "group_size": [8.0],
                                          "ranks_per_node": [8.0], "nodes": [1.0]}), preset("dgx-h100"))
    assert algo[0] == "nvls"


def test_agrees_with_measured_nccl_tests_tables():
    # vTrain's nccl-tests all-reduce tables of one 8×A100 NVSwitch node (2-8 GPUs, 1 MiB-1 GiB): measured data the
    # physics was not fitted row by row on (only one efficiency per fabric)
    errors = []
    for n in range(2, 9):
        table = pd.read_csv(CORPUS / "operator-samples" / "vtrain-allreduce" / "a100" / f"AR_GPU{n}_1M_1024M_LUT.csv")
        measured_us = table.iloc[:, 3].to_numpy() / 1e3
        predicted = times(preset("dgx-a100"), "all_reduce", table["size(B)"].to_numpy(), n, n, 1)
        errors.append(np.abs(predicted / measured_us - 1))
    assert float(np.mean(np.concatenate(errors))) < 0.08
