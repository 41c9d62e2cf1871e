"""Megatron-Bridge jobs on NVL72 racks run in Slurm segments (extractors.jobs.bridge.segments): the segment is the job's
NVLink domain, so an expert-parallel group of consecutive ranks stays inside one rack and its all-to-all on NVLink."""
from __future__ import annotations

import csv

import pandas as pd
import pytest

from extractors.jobs.bridge.segments import launched_cluster, segment_trays, segmented
from extractors.jobs.rows import parse_row
from predictor.costs.physics.collectives import collective_us
from predictor.ir.placement import placements
from tests.conftest import E2E
from tracekit.core.cluster import preset


@pytest.mark.parametrize("nodes", [1, 2, 8, 16, 18, 19, 32, 36, 38, 64, 72, 128, 250, 256])
def test_a_segment_divides_the_job_and_fits_one_rack(nodes):
    seg = segment_trays(nodes, 18)
    assert nodes % seg == 0 and 1 <= seg <= 18
    assert seg == nodes or nodes > 18
    # no larger divisor fits a rack: the launcher takes the largest
    assert not any(nodes % s == 0 for s in range(seg + 1, 19))


def test_256_gpus_on_nvl72_run_in_four_domains_of_64():
    rack = preset("gb200-nvl72")
    cut, note = segmented(rack, 256)
    assert cut.domain_size == 64 and note and "segments of 16" in note
    # a job inside one rack, or on 8-GPU nodes, is left as it was
    assert segmented(rack, 64) == (rack, None)
    h100 = preset("dgx-h100")
    assert segmented(h100, 1024) == (h100, None)


@pytest.mark.parametrize("ep", [8, 16, 32, 64])
def test_expert_groups_stay_in_one_segment_and_their_all_to_all_is_never_slower(ep):
    rack = preset("gb200-nvl72")
    cut, _ = segmented(rack, 256)
    whole = placements(1, 1, 256 // 4, 4, rack.domain_size, ep=ep)["ep"]
    seg = placements(1, 1, 256 // 4, 4, cut.domain_size, ep=ep)["ep"]
    assert seg.nodes == 1  # 64 divides by every power-of-two EP size up to 64
    if ep > 8:
        assert whole.nodes > 1  # some group straddles two 72-GPU racks
    frame = pd.DataFrame({"primitive": ["all_to_all"] * 2, "bytes": [4.0e8] * 2, "group_size": [float(ep)] * 2,
                          "ranks_per_node": [float(seg.ranks_per_node), float(whole.ranks_per_node)],
                          "nodes": [float(seg.nodes), float(whole.nodes)]})
    inside, straddling = collective_us(frame, cut)[0]
    assert inside <= straddling


def _bridge_rows(model_prefix: str):
    with open(E2E / "megatron_bridge_perf.csv", newline="") as fh:
        for i, cells in enumerate(csv.DictReader(fh)):
            if cells["model_name"].startswith(model_prefix):
                yield i + 2, cells


def test_bridge_rows_on_gb200_get_the_segment_and_others_keep_their_domain():
    seen = 0
    for line, cells in _bridge_rows("DeepSeekV3"):
        row = parse_row(cells, line, None, None)
        if row.cluster is None:
            continue
        gpus = int(cells["num_gpus"])
        if cells["hardware_gpu"] == "GB200" and gpus > 72:
            assert row.cluster.domain_size == 64 and any("segments of 16" in n for n in row.notes)
            seen += 1
        else:
            assert row.cluster.domain_size in (8, gpus, 72)
    assert seen >= 5
    # the same row under the megatron-core stack (not Bridge's launcher) keeps the 72-GPU rack
    line, cells = next((ln, c) for ln, c in _bridge_rows("DeepSeekV3") if c["hardware_gpu"] == "GB200")
    core = parse_row(cells, line, None, None, stack="megatron-core")
    assert core.cluster is not None and core.cluster.domain_size == 72


def test_only_bridges_launcher_cuts_the_rack_and_a_stated_cluster_gets_it_too():
    rack = preset("gb200-nvl72")
    assert launched_cluster("megatron-bridge", rack, 256)[0].domain_size == 64
    assert launched_cluster("megatron-core", rack, 256) == (rack, None)
    line, cells = next((ln, c) for ln, c in _bridge_rows("DeepSeekV3")
                       if c["hardware_gpu"] == "GB200" and int(c["num_gpus"]) == 256)
    stated = parse_row(cells, line, None, None, cluster=rack)
    assert stated.cluster is not None and stated.cluster.domain_size == 64


def test_a_deepseek_step_inside_segments_is_never_slower_and_exposes_less_all_to_all():
    """Line 64 of the Bridge table (DeepSeek-V3, 256 GB200, pp 8 · EP 32, HybridEP): the same row predicted on the
    72-GPU racks and on the launcher's 64-GPU segments — the step on NVLink-only EP groups is not longer, its
    exposed communication smaller, its compute the same."""
    from predictor.costs.learned.models import ModelSet
    from predictor.predict import predict

    line, cells = next((ln, c) for ln, c in _bridge_rows("DeepSeekV3") if ln == 64)
    row = parse_row(cells, line, None, None)
    config, cut, _ = row.complete()
    assert cut.domain_size == 64
    rack = preset("gb200-nvl72", cut.hardware)
    models = ModelSet.load()
    inside = predict(config, cut, models, row.calibration)
    straddling = predict(config, rack, models, row.calibration)
    assert inside.iteration_time_s <= straddling.iteration_time_s
    assert inside.breakdown["exposed_communication"] < straddling.breakdown["exposed_communication"]
    assert inside.work[0][0][0].compute == pytest.approx(straddling.work[0][0][0].compute)
