"""Facts of real corpus traces that `read_trace` / `ingest` must reproduce exactly.

Expected values are facts of the input files, counted here independently from the raw JSON (orjson), not from
tracekit's own output.
"""
from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pandas as pd
import pytest

from extractors.kineto import ingest_paths, match_collectives, read_trace
from tests.conftest import KINETO
from tracekit.core.errors import InputError
from tracekit.core.store import SampleStore

OWLV2 = KINETO / "tracelens" / "h100__google_owlv2-large-patch14-ensemble__1016001.json.gz"
NCCL = KINETO / "hta" / "nccl_parser_config_nccl_data.json.gz"
DLRM = KINETO / "param" / "dlrm_8rank"


def raw_events(path: Path) -> list:
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    return orjson.loads(data)["traceEvents"]


def test_owlv2_kernel_count_and_shaped_gemms():
    trace = read_trace(OWLV2)
    events = trace.device_events
    assert trace.kernels == 4330
    assert (events["kind"] == "kernel").sum() == 4330
    gemm_ops = events["op"].isin(["aten::addmm", "aten::mm", "aten::bmm"]) & (events["kind"] == "kernel")
    assert gemm_ops.sum() == 1585
    assert set(events.loc[gemm_ops, "primitive"]) == {"gemm", "bmm"}
    assert events.loc[gemm_ops, ["m", "n", "k", "batch"]].notna().all().all()
    # independent: the (m, k) of every aten::bmm with Input Dims [[b, m, k], [b, k, n]] recorded in the file
    bmm_shapes = {tuple(map(tuple, e["args"]["Input Dims"])) for e in raw_events(OWLV2)
                  if e.get("name") == "aten::bmm" and e.get("cat") == "cpu_op"}
    ours = events[events["op"].eq("aten::bmm") & events["kind"].eq("kernel")]
    expected = {((int(b), int(m), int(k)), (int(b), int(k), int(n)))
                for b, m, k, n in ours[["batch", "m", "k", "n"]].itertuples(index=False)}
    assert expected <= bmm_shapes


def test_an_index_select_lookup_moves_the_rows_it_gathers_not_the_table():
    """`index_select(table, 0, index)` (the HF embeddings' lookup): rows = the index's length, counted from the raw
    trace; the table's rows are its parameters."""
    raw = [e for e in raw_events(OWLV2) if e.get("name") == "aten::index_select" and e.get("cat") == "cpu_op"]
    expected = {(a["Input Dims"][2][0], a["Input Dims"][0][1], a["Input Dims"][0][0])
                for a in (e["args"] for e in raw) if a.get("Concrete Inputs", ["", ""])[1] == "0"}
    assert (5185, 1024, 5185) in expected and (5, 768, 49408) in expected
    events = read_trace(OWLV2).device_events
    lookups = events[(events["op"] == "aten::index_select") & (events["kind"] == "kernel")]
    got = {(int(r), int(w), int(p)) for r, w, p in lookups[["rows", "width", "params"]].to_numpy()}
    assert got == expected
    assert (lookups["numel"] == lookups["rows"] * lookups["width"]).all()


def test_nccl_parser_kernels_and_allreduce_bytes():
    trace = read_trace(NCCL)
    events = trace.device_events
    raw = raw_events(NCCL)
    raw_kernels = [e for e in raw if e.get("cat") == "kernel"]
    assert trace.kernels == len(raw_kernels) == 2700
    nccl = events[events["name"].str.startswith("nccl")]
    assert len(nccl) == 21
    assert (nccl["category"] == "communication").all()
    sizes = {"Float": 4, "Long": 8, "Int": 4, "BFloat16": 2, "Half": 2}
    expected = sorted(e["args"]["In msg nelems"] * sizes[e["args"]["dtype"]] for e in raw_kernels
                      if e["name"].startswith("ncclKernel_AllReduce"))
    ours = sorted(events.loc[events["primitive"] == "all_reduce", "bytes"].astype(int))
    assert ours == expected and len(expected) == 15
    assert set(events.loc[events["primitive"] == "all_reduce", "group_size"]) == {2.0}
    assert [s[0] for s in trace.iterations] == [4, 5, 6]


def test_dlrm_ranks_collectives_match(tmp_path):
    files = sorted(DLRM.glob("*.json.gz"))
    assert len(files) == 8
    traces = [read_trace(f) for f in files]
    assert sorted(t.rank for t in traces) == list(range(8))
    for trace in traces:
        assert trace.world_size == 8
        nccl = trace.device_events["name"].str.startswith("nccl")
        assert nccl.sum() == 8
        assert (trace.device_events.loc[nccl, "category"] == "communication").all()
    report = match_collectives([t.events for t in traces])
    assert (report.matched, report.unmatched, report.mismatched_kind) == (8, 0, 0)
    comm = pd.concat([t.device_events[t.device_events["category"] == "communication"].assign(rank=t.rank)
                      for t in traces])
    for _, members in comm.groupby("comm_seq"):
        assert sorted(members["rank"]) == list(range(8))
        assert members["primitive"].nunique() == 1 and members["bytes"].nunique() == 1
        assert members["wait_us"].min() == 0.0
        assert (members["wait_us"] <= members["dur_us"]).all()
    # the old (generation a) schema: message sizes come from the nccl:<kind> annotations' Input Dims
    size = {"float": 4, "int": 4, "long int": 8}
    annotations = sorted(int(e["args"]["Input Dims"][0][0]) * size[e["args"]["Input type"][0]]
                         for e in raw_events(files[0]) if str(e.get("name")).startswith("nccl:"))
    assert sorted(comm.loc[comm["rank"] == 0, "bytes"].astype(int)) == annotations
    store = SampleStore(tmp_path / "store")
    result = ingest_paths([DLRM], store)
    assert not result.errors and len(result.traces) == 8 and result.matched_collectives == 8
    samples = store.read(primitive=["all_reduce", "all_to_all"])
    assert len(samples) == 64 and samples["wait_us"].notna().all()
    assert (samples["duration_us"] + samples["wait_us"]).round(6).tolist() == pytest.approx(
        sorted_durations(comm, samples))


def sorted_durations(comm, samples) -> list:
    """Raw kernel durations in the order of `samples` (matched by rank and kernel start)."""
    lookup = {(int(r), k, round(d, 3)) for r, k, d in zip(comm["rank"], comm["name"], comm["dur_us"])}
    out = []
    for rank, kernel, total in zip(samples["rank"], samples["kernel"], samples["duration_us"] + samples["wait_us"]):
        assert (int(rank), kernel, round(total, 3)) in lookup
        out.append(round(total, 6))
    return out


REFUSED = {
    "execution_trace_benchmark_simple_add_et.json.gz": "Chakra execution trace",
    "distributed_info_unavailable_distributed_info_not_found.json.gz": "no device kernels",
    "rank_unavailable_rank_not_found.json.gz": "no device kernels",
}


@pytest.mark.parametrize("path", sorted(KINETO.rglob("*.json*")), ids=lambda p: p.name[:40])
def test_every_corpus_trace_ingests_or_is_refused_for_its_reason(path):
    if path.name in REFUSED:
        with pytest.raises(InputError) as info:
            read_trace(path)
        assert REFUSED[path.name] in info.value.reason and info.value.path == str(path)
        return
    trace = read_trace(path)
    raw = raw_events(path)
    device = [e for e in raw if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset",
                                                                       "mtia_ccp_events")]
    assert trace.kernels == sum(1 for e in raw if e.get("cat") == "kernel")
    if device:
        assert len(trace.device_events) == len(device)
        assert trace.device_events["dur_us"].sum() == pytest.approx(sum(e.get("dur", 0) for e in device))
    else:
        assert trace.is_cpu_run and trace.hardware.startswith("cpu-")
    assert trace.device_events["primitive"].notna().all()
