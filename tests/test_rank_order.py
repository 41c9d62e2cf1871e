"""Megatron's rank order (predictor.ir.placement): which global ranks form each parallel group, in the default order
(tp-cp-ep-dp-pp) and with `--use-tp-pp-dp-mapping` (tp-cp-ep-pp-dp), checked against the vendored Megatron-LM's own
`RankGenerator` (`megatron/core/parallel_state.py`, run here on the snapshot's source), and what the order changes in
a prediction: which collectives cross the network."""
from __future__ import annotations

import ast
import math
import tarfile
from pathlib import Path
from typing import List

import pytest

from extractors.jobs.megatron import config_from_argv
from predictor.assembly.graph import build_graph
from predictor.ir.placement import placements
from tracekit.core.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
VENDORED = sorted((ROOT.parent / "shared" / "vendor").glob("megatron-lm-*.tar.gz"))
ORDERS = {"tp-cp-dp-pp": "tp-cp-ep-dp-pp", "tp-cp-pp-dp": "tp-cp-ep-pp-dp"}  # ours → Megatron's order string


def megatron_rank_generator():
    """Megatron's RankGenerator class, compiled from the snapshot's parallel_state.py (it and the group function
    it calls; the rest of the module needs a process group)."""
    with tarfile.open(VENDORED[-1]) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("megatron/core/parallel_state.py"))
        handle = tar.extractfile(member)
        assert handle is not None
        tree = ast.parse(handle.read().decode())
    keep = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
            and node.name in ("generate_masked_orthogonal_rank_groups", "RankGenerator")]
    namespace: dict = {"List": List}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "parallel_state.py", "exec"), namespace)  # noqa: S102
    return namespace["RankGenerator"]


def worst_span(groups: list[list[int]], gpus_per_node: int) -> tuple[int, int]:
    """(nodes, members on one node) of the group spanning most nodes."""
    spans = []
    for group in groups:
        nodes = [rank // gpus_per_node for rank in group]
        spans.append((len(set(nodes)), max(nodes.count(n) for n in set(nodes))))
    return max(spans)


SHAPES = [  # tp, cp, dp, pp, ep, etp, gpus per node
    (2, 2, 2, 2, 1, 2, 4), (1, 2, 2, 2, 1, 1, 4), (2, 1, 4, 2, 2, 1, 8), (4, 2, 3, 2, 1, 4, 8),
    (1, 1, 8, 4, 4, 2, 8), (2, 2, 4, 3, 4, 1, 4),
]


@pytest.mark.skipif(not VENDORED, reason="the vendored Megatron-LM snapshot is not beside the checkout")
@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize("shape", SHAPES)
def test_every_group_is_the_one_megatron_builds(order, shape):
    tp, cp, dp, pp, ep, etp, gpn = shape
    world = tp * cp * dp * pp
    edp = world // (pp * etp * ep)
    generator = megatron_rank_generator()
    dense = generator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=ORDERS[order])
    expert = generator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order=ORDERS[order])
    ours = placements(tp, cp, dp, pp, gpn, ep, etp, order)
    for kind, generated in (("tp", dense.get_ranks("tp")), ("cp", dense.get_ranks("cp")),
                            ("dp", dense.get_ranks("dp")), ("pp", dense.get_ranks("pp")),
                            ("dpcp", dense.get_ranks("dp-cp")), ("etp", expert.get_ranks("tp")),
                            ("ep", expert.get_ranks("ep")), ("edp", expert.get_ranks("dp")),
                            ("tpep", expert.get_ranks("tp-ep"))):
        place = ours[kind]
        assert place.size == len(generated[0]), kind
        for group in generated:
            assert sorted(place.members(group[0])) == sorted(group), (kind, group)
        if place.size > 1:
            assert (place.nodes, place.ranks_per_node) == worst_span(generated, gpn), kind
    assert math.prod((tp, cp, dp, pp)) == world


def test_the_mapping_moves_the_gradient_reduction_across_the_network():
    """cp 2 · dp 2 · pp 2 on 4-GPU nodes (Megatron-LM's CI runs it): by default each pipeline hop changes node and the
    data-parallel ranks share one; with --use-tp-pp-dp-mapping the pipeline stays inside a node and the gradients'
    reduction crosses the network."""
    job = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 4096 --micro-batch-size 1 "
           "--global-batch-size 16 --pipeline-model-parallel-size 2 --context-parallel-size 2 --bf16")
    default = build_graph(config_from_argv(job, {"world_size": 8}), "H100-80GB-HBM3", 4).groups
    mapped = build_graph(config_from_argv(f"{job} --use-tp-pp-dp-mapping", {"world_size": 8}), "H100-80GB-HBM3",
                         4).groups
    assert default["p2p"].nodes == 2 and default["dpcp"].nodes == 1
    assert mapped["p2p"].nodes == 1 and mapped["dpcp"].nodes == 2 and mapped["dpcp"].ranks_per_node == 2
    assert mapped["cp"].nodes == 1 and mapped["tp"].nodes == 1


def test_megatrons_refusal_of_unequal_expert_data_parallelism_with_a_pipeline():
    job = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --micro-batch-size 1 "
           "--global-batch-size 16 --pipeline-model-parallel-size 2 --num-experts 8 --moe-router-topk 2 "
           "--expert-model-parallel-size 4 --bf16")
    config_from_argv(job, {"world_size": 16}).validate()  # the default order takes it
    with pytest.raises(ConfigError, match="refuses --use-tp-pp-dp-mapping with a pipeline"):
        config_from_argv(f"{job} --use-tp-pp-dp-mapping", {"world_size": 16}).validate()
