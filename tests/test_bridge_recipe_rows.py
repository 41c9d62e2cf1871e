"""What Megatron-Bridge's performance scripts set for a published row in words its notes use
(extractors.jobs.notes): a token-drop run is `apply_moe_token_drop`'s (capacity factor 1.0, each expert's input
padded to its capacity, the all-to-all dispatcher), and the r0.1.0 perf matrix's `cuda_graphs` key is
`model.enable_cuda_graph` (Megatron-core's per-layer graphs of the whole layer). On the corpus's real rows."""
from __future__ import annotations

import re

import pytest

from extractors.jobs.rows import parse_row
from predictor.batch import predict_rows
from predictor.costs.learned.models import ModelSet
from tests.conftest import bridge_rows


def token_drop(cells: dict) -> bool:
    return "tokendrop" in cells["model_name"] or "TOKEN-DROP" in cells["notes"]


def line(n: int) -> dict:
    return next(cells for i, cells in bridge_rows() if i == n)


def test_token_drop_rows_pad_each_expert_to_its_capacity_on_the_all_to_all_dispatcher():
    drop = dropless = 0
    for n, cells in bridge_rows():
        row = parse_row(cells, n, None, None)
        if row.config is None or row.config.moe is None:
            continue
        moe = row.config.moe
        if token_drop(cells):
            assert (moe.moe_expert_capacity_factor, moe.moe_pad_expert_input_to_capacity) == (1.0, True), n
            assert moe.dispatcher == "alltoall", n
            assert moe.load_factor() == 1.0  # a padded capacity of 1.0: every expert computes exactly its share
            drop += 1
        else:
            assert moe.moe_expert_capacity_factor is None and not moe.moe_pad_expert_input_to_capacity, n
            dropless += 1
    assert drop == 7 and dropless > 30  # the eighth token-drop row (line 81) is refused: its EP 64 does not fit


def test_a_flex_backend_the_notes_name_keeps_the_flex_dispatcher_of_a_token_drop_row():
    cells = dict(line(88))
    cells["notes"] += " | moe_flex_dispatcher_backend=deepep"
    moe = parse_row(cells, 88, None, None).config.moe
    assert moe.dispatcher == "deepep" and moe.moe_pad_expert_input_to_capacity


def test_the_perf_matrix_cuda_graphs_key_graphs_whole_layers():
    seen = {"True": 0, "False": 0}
    for n, cells in bridge_rows():
        stated = re.search(r"\bcuda_graphs=(True|False)\b", cells["notes"])
        if not stated:
            continue
        config = parse_row(cells, n, None, None).config
        if config is None:  # line 81 (module's first test)
            continue
        run = config.run
        if stated.group(1) == "True":
            assert run is not None and run.graph_impl == "local" and not run.graph_modules, n
        else:
            assert run is None or run.graph_impl == "none", n
        seen[stated.group(1)] += 1
    assert seen == {"True": 6, "False": 10}


@pytest.fixture(scope="module")
def line_88_with_and_without_graphs():
    """Qwen3-30B-A3B token-drop on 8 B200 (mbs 1: 64 micro-batches of 48 MoE layers), as published
    (`cuda_graphs=True`) and with the key turned off."""
    cells = line(88)
    off = dict(cells, notes=cells["notes"].replace("cuda_graphs=True", "cuda_graphs=False"))
    rows = [parse_row(cells, 88, None, None), parse_row(off, 88, None, None)]
    return predict_rows(rows, ModelSet.load())


def test_whole_layer_graphs_take_host_time_away_and_nothing_else(line_88_with_and_without_graphs):
    graphed, eager = line_88_with_and_without_graphs
    g, e = graphed.breakdown, eager.breakdown
    assert g["compute"] == pytest.approx(e["compute"], rel=1e-9)
    assert g["exposed_communication"] == pytest.approx(e["exposed_communication"], rel=1e-9)
    assert g["other"] < e["other"]
    assert graphed.iteration_time_s < eager.iteration_time_s
    # what is left is at least the device's work: graphs remove host time, not kernels
    assert graphed.iteration_time_s >= g["compute"] + g["exposed_communication"]
