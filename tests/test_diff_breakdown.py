"""tracekit's own iteration breakdown against HTA's temporal breakdown and comm/compute overlap on real GPU traces,
and the diff's alignment mechanics on a real multi-rank GPU trace set (no capture needed)."""
from __future__ import annotations

import contextlib
import io
import json

import pytest

from tests.conftest import KINETO

DLRM = sorted((KINETO / "param" / "dlrm_8rank").glob("*.json.gz"))
SAMPLED = KINETO / "hta" / "timeline_analysis_sampled_rank-0.json.gz"


def _hta(path, rank):
    from hta.trace_analysis import TraceAnalysis

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        analysis = TraceAnalysis(trace_files={rank: str(path)})
        temporal = analysis.get_temporal_breakdown(visualize=False).iloc[0]
        overlap = analysis.get_comm_comp_overlap(visualize=False).iloc[0]
    return temporal, float(overlap["comp_comm_overlap_pctg"]) / 100


@pytest.mark.parametrize("path", [DLRM[0], SAMPLED], ids=["dlrm_rank0", "sampled_rank0"])
def test_own_breakdown_matches_hta(path):
    """Same window as HTA (first to last device event, last profiler step excluded when there are several)."""
    from extractors.kineto import read_trace
    from tracekit.compare.breakdown import iteration_breakdown

    trace = read_trace(path)
    temporal, overlap = _hta(path, trace.rank or 0)
    events = trace.device_events
    if len(trace.iterations) > 1:
        events = events[events["iteration"].isin([s for s, _, _ in trace.iterations[:-1]])]
    start = float(events["ts_us"].min())
    end = float((events["ts_us"] + events["dur_us"]).max())
    ours = iteration_breakdown(events, start, end, pipeline=False)
    assert ours.window_us == pytest.approx(float(temporal["kernel_time(us)"]), abs=1.0)
    assert ours.idle_us == pytest.approx(float(temporal["idle_time(us)"]), abs=1.0)
    assert ours.compute_us + ours.optimizer_us == pytest.approx(float(temporal["compute_time(us)"]), rel=0.01)
    # HTA's non-compute time = communication and memory kernels while no compute runs
    exposed = ours.exposed_communication_us + ours.other_us - ours.idle_us
    assert exposed == pytest.approx(float(temporal["non_compute_time(us)"]), rel=0.01)
    assert ours.overlap_ratio == pytest.approx(overlap, abs=0.002)
    # the five parts add up to the window
    parts = (ours.compute_us + ours.optimizer_us + ours.exposed_communication_us + ours.pipeline_bubble_us
             + ours.other_us)
    assert parts == pytest.approx(ours.window_us, rel=1e-9)


def test_pipeline_idle_is_bubble():
    from extractors.kineto import read_trace
    from tracekit.compare.breakdown import iteration_breakdown

    trace = read_trace(DLRM[1])
    _, start, end = trace.iterations[0]
    flat = iteration_breakdown(trace.device_events, start, end, pipeline=False)
    piped = iteration_breakdown(trace.device_events, start, end, pipeline=True)
    assert not (trace.device_events["primitive"] == "send_recv").any()  # all-to-all here, no pipeline sends
    # with a pipeline the idle time is bubble; without one it is `other`
    assert flat.pipeline_bubble_us == 0 and flat.other_us >= flat.idle_us > 0
    assert piped.pipeline_bubble_us == pytest.approx(flat.idle_us)
    assert piped.other_us == pytest.approx(flat.other_us - flat.idle_us)
    assert piped.exposed_communication_us == pytest.approx(flat.exposed_communication_us)
    assert piped.compute_us == flat.compute_us


def test_dlrm_set_against_itself_aligns_everything_and_uses_hta():
    """All 8 real ranks diffed against themselves: zero error, nothing unmatched, every step matched, and the
    real side's exposed communication measured by HTA (GPU traces with ranks)."""
    from tracekit.validate import diff_paths

    report = diff_paths(DLRM[0].parent, [DLRM[0].parent]).to_dict()
    raw = [json.loads(__import__("gzip").decompress(p.read_bytes())) for p in DLRM]
    ranks = sorted(d["distributedInfo"]["rank"] for d in raw)
    assert [a["rank"] for a in report["alignment"]] == ranks == list(range(8))
    steps = {int(e["name"].split("#")[1]) for d in raw for e in d["traceEvents"] if
             str(e.get("name", "")).startswith("ProfilerStep#")}
    for row in report["alignment"]:
        assert row["real_steps"] == sorted(steps) and [m[0] for m in row["matched"]] == row["real_steps"]
    assert report["iteration_time_s"]["error"] == 0
    assert all(r["error_s"] == 0 for r in report["by_primitive"])
    assert report["unmatched"] == {"real_only": [], "predicted_only": []}
    assert report["largest_contributors"] == []
    assert report["breakdown"]["real_source"].startswith("hta")
    assert len(report["breakdown"]["hta"]["ranks"]) == 8
