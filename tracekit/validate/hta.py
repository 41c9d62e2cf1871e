"""The real side's breakdown as Holistic Trace Analysis measures it: HTA's temporal breakdown (idle, compute,
non-compute time) and communication/computation overlap per rank, per iteration, put in place of tracekit's own
exposed communication, pipeline bubble and overlap ratio (`tracekit.compare.breakdown` keeps the other parts).

HTA is optional (`tracekit[hta]`, imported only here, when called): where it is missing or cannot load the traces
(CPU runs, ranks unknown), the side keeps tracekit's own measure and nothing is raised.
"""
from __future__ import annotations

import contextlib
import io
import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from tracekit.compare import side_breakdown

if TYPE_CHECKING:
    from extractors.kineto import KinetoTrace
    from tracekit.compare import Side


def apply_hta(side: Side, traces: list[KinetoTrace], pp: int) -> None:
    """Measure the real side's exposed communication and idle time with HTA (temporal breakdown and
    communication/computation overlap) where HTA can load the traces: GPU traces that name their rank."""
    hta = hta_breakdown(traces)
    if not hta:
        return
    side.hta = hta
    per_iteration = [r for r in hta["ranks"] if r["rank"] in side.ranks]
    if not per_iteration:
        return
    parts = side_breakdown(side, sorted(side.ranks))
    if parts is None:
        return
    merged = dict(parts)
    merged["exposed_communication"] = float(np.mean([r["exposed_communication_s"] for r in per_iteration]))
    merged["pipeline_bubble"] = float(np.mean([r["idle_s"] for r in per_iteration])) if pp > 1 else 0.0
    merged["overlap_ratio"] = float(np.mean([r["comm_comp_overlap"] for r in per_iteration]))
    side.breakdown_override = merged
    side.breakdown_source = "hta (exposed_communication, pipeline_bubble, overlap_ratio) + tracekit (the rest)"


def hta_breakdown(traces: list[KinetoTrace]) -> dict[str, Any] | None:
    """HTA's temporal breakdown and comm/compute overlap per rank, per iteration; None where HTA cannot load the
    traces (CPU runs, ranks unknown, HTA not installed)."""
    if not traces or any(t.rank is None or not t.hardware or t.hardware.startswith("cpu") for t in traces):
        return None
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return None
    files = {int(t.rank): str(t.path) for t in traces if t.rank is not None}  # none is None (checked above)
    if len(files) != len(traces):
        return None
    logging.getLogger("hta").setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            analysis = TraceAnalysis(trace_files=files)
            temporal = analysis.get_temporal_breakdown(visualize=False)
            overlap = analysis.get_comm_comp_overlap(visualize=False)
    except Exception:  # noqa: BLE001 - HTA cannot load this trace set: fall back to tracekit's own measure
        return None
    iterations = {int(t.rank): max(len(t.iterations or []) - 1, 1) for t in traces if t.rank is not None}
    ratio = dict(zip(overlap["rank"].astype(int), overlap["comp_comm_overlap_pctg"].astype(float) / 100))
    ranks = []
    for row in temporal.itertuples(index=False):
        rank = int(row.rank)
        n = iterations.get(rank, 1)
        ranks.append({
            "rank": rank, "iterations": n,
            "idle_us": float(row[1]), "compute_us": float(row[2]), "non_compute_us": float(row[3]),
            "kernel_time_us": float(row[4]), "comm_comp_overlap": ratio.get(rank),
            "idle_s": float(row[1]) / n / 1e6, "exposed_communication_s": float(row[3]) / n / 1e6,
        })
    return {"ranks": ranks, "note": "HTA: kernel_time = first to last kernel (last profiler step excluded); "
                                    "non_compute = communication/memory kernels not overlapped by compute"}
