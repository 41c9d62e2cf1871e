"""Kernels whose launch is not in the trace take the op and shapes of their twins (extractors/kineto/twins.py).

The Qwen H100 trace of the corpus holds 437 kernels that ran before the profiler's CPU window opened: their launch
calls are not in the file, and 436 of them carry no External id of an op in it either. What each of the two rules
gives them is worked out here from the raw JSON (orjson), independently of tracekit's linker; a trace whose window
is made to open one step late checks that twins read as their own launch would have read.
"""
from __future__ import annotations

import gzip
import json
from collections import defaultdict

import orjson
from typer.testing import CliRunner

from extractors.kineto import read_trace
from extractors.kineto.twins import MIN_TWINS
from tests.conftest import KINETO
from tracekit.cli import app

QWEN = KINETO / "tracelens" / "h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
DDP = KINETO / "hta" / "nccl_parser_config_nccl_data.json.gz"


def kernels_and_ops(path) -> tuple[list, dict, set]:
    """The trace's kernels sorted by start, its cpu_ops by External id, and the correlation ids of launch calls."""
    events = orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    launched = {e["args"]["correlation"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    ops = {e["args"]["External id"]: e for e in events
           if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    return kernels, ops, launched


def signature(e) -> tuple:
    return e["name"], str(e["args"].get("grid")), str(e["args"].get("block"))


def launcher(e, ops: dict, launched: set):
    """(op name, Input Dims) of a kernel's recorded launch, None without one."""
    op = ops.get(e["args"].get("External id"))
    if e["args"].get("correlation") not in launched or op is None:
        return None
    return op["name"], orjson.dumps(op["args"].get("Input Dims"))


def expected_ops(path) -> tuple[int, dict, dict]:
    """Kernels without a recorded launch or op, and the ops the two rules give them ({kernel ts: (op name, Input
    Dims)}): rule 1, at least MIN_TWINS recorded twins (name, grid, block) all launched by one op with the same
    inputs; rule 2, the run of such kernels recurring kernel for kernel among launched ones, every recurrence
    agreeing. Worked out on the raw JSON, without tracekit's linker."""
    kernels, ops, launched = kernels_and_ops(path)
    by_signature: dict = defaultdict(list)
    for e in kernels:
        found = launcher(e, ops, launched)
        if found is not None:
            by_signature[signature(e)].append(found)
    orphans = [i for i, e in enumerate(kernels)
               if e["args"].get("correlation") not in launched and ops.get(e["args"].get("External id")) is None]
    rule1 = {}
    for i in orphans:
        found = by_signature.get(signature(kernels[i]), [])
        if len(set(found)) == 1 and len(found) >= MIN_TWINS:
            rule1[kernels[i]["ts"]] = found[0]
    # in this trace the kernels without a launch are the first ones, on one stream: one run
    assert orphans == list(range(len(orphans))) and len({e["args"]["stream"] for e in kernels}) == 1
    run = [signature(e) for e in kernels[:len(orphans)]]
    starts = [s for s in range(len(orphans), len(kernels) - len(run) + 1)
              if [signature(e) for e in kernels[s:s + len(run)]] == run
              and all(launcher(e, ops, launched) for e in kernels[s:s + len(run)])]
    rule2 = {}
    for offset in range(len(run)):
        found = {launcher(kernels[s + offset], ops, launched) for s in starts}
        if len(found) == 1 and kernels[offset]["ts"] not in rule1:
            rule2[kernels[offset]["ts"]] = found.pop()
    return len(orphans), rule1, rule2


def test_qwen_kernels_before_the_window_take_their_twins_op_and_shapes():
    orphans, rule1, rule2 = expected_ops(QWEN)
    assert orphans == 436 and len(rule1) > 200 and len(rule2) > 100
    events = read_trace(QWEN).device_events
    kernels = events[events["kind"] == "kernel"]
    borrowed = kernels[kernels["op_from_twin"]]
    expected = {round(ts, 3): value for ts, value in {**rule1, **rule2}.items()}
    assert sorted(round(ts, 3) for ts in borrowed["ts_us"]) == sorted(expected)
    for row in borrowed.itertuples(index=False):
        name, dims = expected[round(row.ts_us, 3)]
        assert row.op == name
        if name == "aten::mm":  # [[m, k], [k, n]]
            dims = orjson.loads(dims)
            assert (row.m, row.k, row.n) == (dims[0][0], dims[0][1], dims[1][1])
    assert kernels["op"].isna().sum() == orphans - len(expected)
    assert borrowed.loc[borrowed["primitive"] == "gemm", ["m", "n", "k"]].notna().all().all()


def test_a_window_opening_one_step_late_gives_the_same_ops_and_no_backward_links(tmp_path):
    """The 2-rank A100 DDP trace with everything on the CPU side before its second ProfilerStep removed: step 4's
    kernels lose their launches, as when a profiler's CPU window opens late. Those that take a twin's op must read
    as they did with their own launch; none joins an autograd node or is a collective."""
    data = orjson.loads(gzip.decompress(DDP.read_bytes()))
    cut = min(e["ts"] for e in data["traceEvents"] if e.get("name") == "ProfilerStep#5")
    host = {"cpu_op", "cuda_runtime", "cuda_driver", "user_annotation", "python_function", "ac2g", "fwdbwd"}
    data["traceEvents"] = [e for e in data["traceEvents"] if not (e.get("cat") in host and e["ts"] < cut)]
    late = tmp_path / "late.json"
    late.write_bytes(orjson.dumps(data))
    columns = ["op", "primitive", "pass", "dtype", "m", "n", "k", "rows", "width"]
    whole = read_trace(DDP).device_events.set_index("ts_us")
    events = read_trace(late).device_events
    step4 = events[(events["ts_us"] < cut) & (events["kind"] == "kernel")]
    borrowed = step4[step4["op_from_twin"]].set_index("ts_us")
    assert len(borrowed) > 0.3 * len(step4)
    def filled(frame):  # missing values compare equal: the same text on both sides
        return frame[columns].astype(object).where(frame[columns].notna(), "missing").astype(str)

    same = (filled(borrowed) == filled(whole.loc[borrowed.index])).all(axis=1)
    assert same.mean() >= 0.995
    assert (borrowed["bwd_node"] == -1).all()
    assert (borrowed["category"] == "computation").all()


def test_ingest_says_how_many_kernels_took_their_twins_op(tmp_path):
    orphans, rule1, rule2 = expected_ops(QWEN)
    twins = {**rule1, **rule2}
    runner = CliRunner()
    shown = runner.invoke(app, ["ingest", str(QWEN), "--store", str(tmp_path / "a")])
    assert shown.exit_code == 0, shown.output
    assert (f"{orphans} compute kernels without a launch call in the trace: {len(twins)} took the op and shapes of "
            f"their twins") in " ".join(shown.stdout.split())
    doc = runner.invoke(app, ["ingest", str(QWEN), "--store", str(tmp_path / "b"), "--json"])
    (report,) = json.loads(doc.stdout)["traces"]
    assert report["launch_not_recorded"] == {"from_twins": len(twins), "without_op": orphans - len(twins)}
