"""Backward kernels linked to their forward op, with roles, checked against the raw events of real training traces.

The raw side is read here straight from the JSON, without tracekit's linkage: a kernel belongs where its runtime
launch call (same `correlation`) lies in time on the launching thread. For every linear layer's backward
(`autograd::engine::evaluate_function: AddmmBackward0`) of HTA's A100 training trace, its whole backward is every
kernel launched inside that span but the engine's gradient accumulation (an `aten::add` outside the node's own
`AddmmBackward0` call), dgrad is the `aten::mm` whose output has the shape of the forward input [M, K], wgrad the
one shaped like the weight, bgrad the `aten::sum` of the bias.
"""
from __future__ import annotations

import bisect
import gzip
from collections import defaultdict

import numpy as np
import orjson
import pandas as pd
import pytest

from extractors.kineto import read_trace, trace_samples
from tests.conftest import KINETO

TRAINING = KINETO / "hta" / "trace_diff_control_control.json.gz"  # A100, 6 profiled steps, fp32 linears
SAMPLED = KINETO / "hta" / "timeline_analysis_sampled_rank-0.json.gz"  # has MmBackward0 nodes
WRAPPER = "autograd::engine::evaluate_function: "


class RawTrace:
    """cpu_ops per thread and kernels by their launch call, from the JSON alone."""

    def __init__(self, path):
        events = orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        self.ops = defaultdict(list)  # tid → [(ts, end, name, args)] sorted by ts
        launch = {}
        for e in events:
            if e.get("ph") != "X":
                continue
            if e.get("cat") == "cpu_op":
                self.ops[e["tid"]].append((e["ts"], e["ts"] + e["dur"], e["name"], e.get("args", {})))
            elif e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {}):
                launch[e["args"]["correlation"]] = (e["tid"], e["ts"])
        self.launches = defaultdict(list)  # tid → [(launch ts, kernel dur)] sorted
        for e in events:
            if e.get("cat") == "kernel" and e.get("args", {}).get("correlation") in launch:
                tid, ts = launch[e["args"]["correlation"]]
                self.launches[tid].append((ts, e["dur"]))
        for table in (*self.ops.values(), *self.launches.values()):
            table.sort(key=lambda item: item[0])
        self.steps = sorted((e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1])) for e in events
                            if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))
        self.forward = {}  # Sequence number → forward ops (backward ops name their forward thread: Fwd thread id > 0)
        for ops in self.ops.values():
            for op in ops:
                if "Sequence number" in op[3] and not op[3].get("Fwd thread id"):
                    self.forward.setdefault(op[3]["Sequence number"], []).append(op)

    def within(self, tid, start, end, name=None) -> list:
        ops = self.ops[tid]
        lo = bisect.bisect_left(ops, start, key=lambda item: item[0])
        return [op for op in ops[lo:bisect.bisect_right(ops, end, key=lambda item: item[0])]
                if op[1] <= end and (name is None or op[2] == name)]

    def kernel_time(self, tid, start, end) -> float:
        table = self.launches[tid]
        lo = bisect.bisect_left(table, start, key=lambda item: item[0])
        hi = bisect.bisect_right(table, end, key=lambda item: item[0])
        return float(sum(dur for _, dur in table[lo:hi]))

    def step(self, ts) -> int:
        for start, end, number in self.steps:
            if start <= ts <= end:
                return number
        return -1


def linear_backwards(raw: RawTrace, node: str = "AddmmBackward0", forward_name: str = "aten::addmm") -> list[dict]:
    """Every `node` backward whose forward op is in the trace: its span, forward shape and per-role kernel time."""
    out = []
    for tid, ops in raw.ops.items():
        for start, end, name, args in ops:
            if name != WRAPPER + node:
                continue
            fwd = [op for op in raw.forward.get(args.get("Sequence number"), []) if op[2] == forward_name]
            (call,) = raw.within(tid, start, end, node)
            if len(fwd) != 1 or not fwd[0][3].get("Input Dims"):
                continue
            dims = [d for d in fwd[0][3]["Input Dims"] if len(d) == 2]  # [M, K] input, [K, N] weight
            (big_m, big_k), (_, big_n) = dims[-2], dims[-1]
            roles = {"dgrad": 0.0, "wgrad": 0.0, "bgrad": 0.0}
            order = []
            for mm in raw.within(tid, call[0], call[1], "aten::mm"):
                (a0, _), (_, b1) = mm[3]["Input Dims"]
                role = "dgrad" if (a0, b1) == (big_m, big_k) else "wgrad"  # (with M = N, both: see the test)
                assert {a0, b1} == {big_k, big_n} or role == "dgrad", (mm, fwd)
                roles[role] += raw.kernel_time(tid, mm[0], mm[1])
                order.append(role)
            reach = -1.0
            for op in raw.within(tid, start, end, "aten::sum"):  # aten::sum calls aten::sum: the outer one
                if op[0] > reach:
                    roles["bgrad"] += raw.kernel_time(tid, op[0], op[1])
                    reach = op[1]
            accumulate = sum(raw.kernel_time(tid, op[0], op[1]) for op in raw.within(tid, start, end)
                             if op[2] in ("aten::add", "aten::add_") and not call[0] <= op[0] <= call[1])
            out.append({"start": start, "end": end, "step": raw.step(start), "mnk": (big_m, big_n, big_k),
                        "roles": roles, "order": order, "whole": raw.kernel_time(tid, start, end) - accumulate})
    return sorted(out, key=lambda node: node["start"])


@pytest.fixture(scope="module")
def training():
    trace = read_trace(TRAINING)
    return trace, linear_backwards(RawTrace(TRAINING))


def test_every_linear_backward_is_linked_with_its_forward_shape_and_roles(training):
    """Per layer backward (one AddmmBackward0 node): tracekit's dgrad / wgrad / bgrad kernel times equal the raw
    trace's, the rows carry the forward GEMM's m, n, k, and nothing of the node is left out of the roles."""
    trace, nodes = training
    ev = trace.device_events
    linked = ev[(ev["bwd_node"] >= 0) & (ev["fwd_op"] == "aten::addmm")]
    starts = [node["start"] for node in nodes]
    seen, ambiguous = set(), 0
    for _, rows in linked.groupby("bwd_node"):
        at = bisect.bisect_right(starts, rows["launch_ts_us"].min()) - 1
        node = nodes[at]
        assert node["start"] <= rows["launch_ts_us"].max() <= node["end"] and at not in seen
        seen.add(at)
        assert set(zip(rows["m"], rows["n"], rows["k"])) == {node["mnk"]}
        assert set(rows["primitive"]) == {"gemm"} and set(rows["pass"]) == {"bwd"}
        got = rows.groupby("role")["dur_us"].sum()
        expected = dict(node["roles"])
        if node["mnk"][0] == node["mnk"][1]:  # M = N: dgrad and wgrad are GEMMs of one shape, not told apart
            expected = {"gemm": expected["dgrad"] + expected["wgrad"], "bgrad": expected["bgrad"]}
            got["gemm"] = got.get("dgrad", 0.0) + got.get("wgrad", 0.0)
            ambiguous += 1
        for role, value in expected.items():
            assert got.get(role, 0.0) == pytest.approx(value, abs=1e-6), (role, node)
        assert got.sum() - got.get("gemm", 0.0) == pytest.approx(node["whole"], abs=1e-6)
    assert len(seen) == len(nodes) == 594  # 99 linear layers × 6 steps, each with its forward in the trace
    assert ambiguous < len(nodes) / 10
    assert sum(1 for node in nodes if node["roles"]["dgrad"] == 0) == 22 * 6  # first layers: no input grad


def test_per_layer_backward_time_is_the_same_in_both_forms(training):
    """Per step and layer shape: the per-role samples (dgrad + wgrad + bgrad) sum to the whole backward measured in
    the raw trace (the seed paper's form: one backward per forward op)."""
    trace, nodes = training
    samples = trace_samples(trace, "test")
    roles = samples[(samples["variant"] == "aten::addmm") & samples["role"].notna()]
    assert set(roles["role"]) == {"dgrad", "wgrad", "bgrad"}
    per_role = roles.groupby(["iteration", "m", "n", "k"])["duration_us"].sum()
    whole = defaultdict(float)
    for node in nodes:
        whole[(node["step"], *node["mnk"])] += node["whole"]
    assert len(per_role) == len(whole) > 6 * 40
    for key, value in whole.items():
        assert per_role[key] == pytest.approx(value, abs=1e-6), key
    # one row per node and role; a wgrad row holds all its kernels (GEMM + split-K reduction)
    assert len(roles[roles["role"] == "bgrad"]) == len(nodes)
    assert roles["kernel"].str.contains("splitKreduce").any()


def test_shapes_not_launch_order_tell_dgrad_from_wgrad():
    """MmBackward0 launches the weight's gradient first, AddmmBackward0 the input's: only the shapes tell them
    apart. tracekit's roles agree with the output shapes read from the raw trace."""
    raw = RawTrace(SAMPLED)
    nodes = linear_backwards(raw, "MmBackward0", "aten::mm")
    assert nodes and all(node["order"] == ["wgrad", "dgrad"] for node in nodes if len(node["order"]) == 2)
    ev = read_trace(SAMPLED).device_events
    mm = ev[(ev["fwd_op"] == "aten::mm") & ev["role"].isin(["dgrad", "wgrad"])]
    got = mm.groupby("role")["dur_us"].sum()
    assert got["dgrad"] == pytest.approx(sum(node["roles"]["dgrad"] for node in nodes), abs=1e-6)
    assert got["wgrad"] == pytest.approx(sum(node["roles"]["wgrad"] for node in nodes), abs=1e-6)
    first = mm.sort_values("ts_us").groupby("bwd_node")["role"].first()
    assert (first == "wgrad").sum() == sum(1 for node in nodes if node["order"][:1] == ["wgrad"]) > 0


def test_unlinked_backward_kernels_keep_their_own_shapes_and_are_counted():
    """The sampled trace starts mid-step: backward nodes whose forward op ran before the window cannot be linked;
    their kernels stay per-kernel rows with the launching op's shapes, and the report counts them."""
    from extractors.kineto.ingest import backward_report

    ev = read_trace(SAMPLED).device_events
    report = backward_report(ev)
    bwd = ev[(ev["pass"] == "bwd") & (ev["category"] == "computation")]
    assert report["kernels"] == len(bwd) and report["linked"] + report["unlinked"] == len(bwd)
    assert report["linked"] == int(bwd["role"].notna().sum()) > 0 and report["unlinked"] > 0
    loose = bwd[bwd["role"].isna() & (bwd["op"] == "aten::mm")]
    assert len(loose) and loose["fwd_op"].isna().all() and (loose["bwd_node"] == -1).all()
    assert loose[["m", "n", "k"]].notna().all().all()  # the backward mm's own [a, b] × [b, c]


def test_role_models_answer_a_held_out_steps_whole_linear_backwards(training, tmp_path):
    """Models trained on five steps' per-role samples answer the sixth step's linear backwards asked in the seed
    form (one whole row per forward GEMM, path `derived`: dgrad + wgrad + bgrad) close to the whole backward the raw
    trace measured; and the graph asks such a set for its GEMM backwards per role."""
    from predictor.costs.learned.models import ModelSet
    from predictor.costs.learned.training import train_models

    trace, nodes = training
    samples = trace_samples(trace, "test")
    train_models(samples[samples["iteration"] < 1014], tmp_path / "models", folds=3)
    models = ModelSet.load(tmp_path / "models")
    assert {m.group for m in models.models if (m.primitive, m.pass_) == ("gemm", "bwd")} == \
        {"dgrad", "wgrad", "bgrad"}
    assert "gemm" in models.role_primitives(trace.hardware)
    held_out = [node for node in nodes if node["step"] == 1014]
    rows = pd.DataFrame([{"hardware": trace.hardware, "primitive": "gemm", "pass": "bwd", "dtype": "fp32",
                          "variant": "aten::addmm", "m": m, "n": n, "k": k, "batch": 1.0}
                         for m, n, k in (node["mnk"] for node in held_out)])
    answer = models.predict(rows)
    assert set(answer["path"]) == {"derived"}
    measured = np.array([node["whole"] for node in held_out])
    ratio = answer["duration_us"].to_numpy() / measured
    assert 0.9 < np.median(ratio) < 1.1
    assert np.sum(answer["duration_us"]) == pytest.approx(measured.sum(), rel=0.1)


def test_graph_asks_gemm_backward_per_role_with_the_forward_shapes():
    """Per role, a linear's backward is dgrad + wgrad (one forward's FLOPs each) + bgrad where it has a bias (not
    the LM head), all keyed by the forward GEMM's shape: the same work as the whole form."""
    from predictor.assembly.graph import build_graph
    from tracekit.core.config import TrainingConfig

    config = TrainingConfig(num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                            micro_batch_size=2, precision="fp16", attention="unfused")
    whole = build_graph(config, "A100-SXM4-80GB", 8)
    split = build_graph(config, "A100-SXM4-80GB", 8, backward_roles={"gemm"})
    for graph in (whole, split):
        assert {s.get("role") for s in graph.specs if s["primitive"] == "bmm"} == {None}
    seg_w, seg_s = whole.segments[0], split.segments[0]
    assert sum(o.flops for o in seg_s.bwd) == pytest.approx(sum(o.flops for o in seg_w.bwd))
    fwd_shapes = {tuple(s[k] for k in "mnk") for s in whole.specs if (s["primitive"], s["pass"]) == ("gemm", "fwd")}
    parts = [split.specs[o.spec] for o in seg_s.bwd if split.specs[o.spec]["primitive"] == "gemm"]
    by_shape = defaultdict(list)
    for spec in parts:
        by_shape[tuple(spec[k] for k in "mnk")].append(spec["role"])
    assert set(by_shape) == fwd_shapes
    lm_head = (2 * 1024, config.padded_vocab_size, 1024)
    for shape, roles in by_shape.items():
        assert sorted(roles) == (["dgrad", "wgrad"] if shape == lm_head else ["bgrad", "dgrad", "wgrad"])


def test_stores_written_before_the_role_column_still_load(tmp_path):
    """A Parquet part without `role` (written before the column existed) reads with role null."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from tracekit.core.samples import SCHEMA
    from tracekit.core.store import SampleStore

    old = pa.schema([f for f in SCHEMA if f.name != "role"])
    rows = {"hardware": ["A100-SXM4-80GB"] * 2, "primitive": ["gemm"] * 2, "pass": ["bwd"] * 2,
            "variant": ["linear1"] * 2, "m": [1024.0, 2048.0], "n": [3072.0] * 2, "k": [1024.0] * 2,
            "batch": [1.0] * 2, "duration_us": [410.0, 800.0], "source": ["old"] * 2}
    table = pa.table({f.name: pa.array(rows.get(f.name, [None] * 2), type=f.type) for f in old}, schema=old)
    folder = tmp_path / "samples" / "hardware=A100-SXM4-80GB" / "primitive=gemm"
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "old.parquet")
    (tmp_path / "sources.json").write_text(json.dumps({"old": {"path": "old.csv", "rows": 2}}))
    frame = SampleStore(tmp_path).read()
    assert len(frame) == 2 and "role" in frame.columns and frame["role"].isna().all()
    assert frame["duration_us"].tolist() == [410.0, 800.0]
