"""One side of a comparison — a prediction or a real run — reduced to the same per-rank, per-iteration summary.

`summarize_traces` takes parsed traces (`extractors.kineto.KinetoTrace`: path, rank, world_size, hardware,
iterations, device_events), one per rank, and keeps for each rank the iterations to compare (a warm-up outlier
first step is dropped on every rank alike), the time per (pass, primitive, layer) per iteration, the trace's totals
per primitive exactly as ingest classified its device events, the iteration breakdown of `breakdown.py` and the
first kept iteration's events for the timeline. A prediction dict is summarized by `prediction.py` into the same
`Side`. Raises InputError for no traces, a rank that appears twice, or a trace with no device events.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np
import pandas as pd

from tracekit.core.errors import InputError

from .breakdown import IterationBreakdown, iteration_breakdown, mean_breakdown

if TYPE_CHECKING:
    from extractors.kineto import KinetoTrace

WARMUP_FACTOR = 1.5  # a first step this much slower than the median of the others is a warm-up outlier


@dataclass
class RankSummary:
    """One rank of one side: iteration durations, time per operator key per iteration, breakdown."""

    rank: int
    stage: int
    steps: list[int | None]  # the iterations kept (profiler step numbers; None for a trace without steps)
    iteration_us: list[float]
    dropped_steps: list[int | None]
    ops: pd.DataFrame  # columns: pass, primitive, layer, time_us, count (per iteration, mean over kept steps)
    totals: pd.DataFrame  # columns: primitive, time_us, count (sums over kept steps)
    trace_totals: pd.DataFrame  # columns: primitive, time_us, count (the whole trace, as ingest reports it)
    breakdown: IterationBreakdown | None
    timeline: list[dict] = field(default_factory=list)  # first kept iteration's events (for the report)
    source_rank: int | None = None  # the rank whose trace this is, when it stands in for a rank of its stage
    #: a prediction dict's side: its stage's ops per layer, read from the prediction's own traces (the dict has none)
    layer_ops: pd.DataFrame | None = None


@dataclass
class Side:
    """A prediction or a real run, summarized per rank (traces) or per stage (a prediction dict)."""

    label: str
    source: str
    world_size: int | None
    hardware: str | None
    ranks: dict[int, RankSummary]
    groups: dict[str, int]  # process-group description → size, as the side's collectives show them
    group_sizes: set[int]  # sizes of every process group the side's collectives use
    iteration_us: list[float]  # per step, mean over ranks
    dropped_steps: list[int | None]
    breakdown_source: str = "tracekit"
    #: seconds per part, when measured by another tool (HTA)
    breakdown_override: Mapping[str, float | None] | None = None
    hta: dict[str, Any] | None = None


def summarize_traces(traces: Iterable[KinetoTrace], label: str, pp: int = 1, ranks_per_stage: int | None = None,
                     drop_warmup: bool = True, process_groups: dict[str, int] | None = None) -> Side:
    """Reduce parsed traces (one per rank) to a Side. `pp`/`ranks_per_stage` map ranks to pipeline stages;
    `process_groups` (description → size, e.g. from the traces' distributedInfo) adds to the groups the
    collectives name."""
    traces = sorted(traces, key=lambda t: (t.rank is None, t.rank if t.rank is not None else 0, str(t.path)))
    if not traces:
        raise InputError(label, "no traces")
    seen: dict[int, KinetoTrace] = {}
    for i, trace in enumerate(traces):
        rank = trace.rank if trace.rank is not None else i
        if rank in seen:
            raise InputError(trace.path, f"rank {rank} appears twice ({seen[rank].path} too)")
        seen[rank] = trace
    world = max((t.world_size for t in traces if t.world_size), default=None) or len(traces)
    per_stage = ranks_per_stage or max(world // max(pp, 1), 1)
    drop_first = drop_warmup and any(_slow_first_step(trace) for trace in seen.values())  # one step set for all
    ranks = {rank: _summarize_rank(trace, rank, rank // per_stage, pp > 1, drop_first)
             for rank, trace in seen.items()}
    groups, sizes = trace_groups(traces)
    for desc, size in (process_groups or {}).items():
        groups.setdefault(desc, int(size))
        sizes.add(int(size))
    hardware = next((t.hardware for t in traces if getattr(t, "hardware", None)), None)
    steps = _common_steps(ranks)
    iteration_us = [float(np.mean([r.iteration_us[r.steps.index(s)] for r in ranks.values()])) for s in steps]
    dropped = sorted({s for r in ranks.values() for s in r.dropped_steps}, key=lambda s: (s is None, s or 0))
    return Side(label, ", ".join(str(t.path) for t in traces[:3]) + (" …" if len(traces) > 3 else ""),
                world, hardware, ranks, groups, sizes, iteration_us, dropped)


def _slow_first_step(trace: KinetoTrace) -> bool:
    """Whether the trace's first profiler step is a warm-up outlier (≥ 3 steps, WARMUP_FACTOR × the others' median)."""
    durations = [end - start for _, start, end in trace.iterations or []]
    return len(durations) >= 3 and durations[0] > WARMUP_FACTOR * float(np.median(durations[1:]))


def _summarize_rank(trace: KinetoTrace, rank: int, stage: int, pipeline: bool, drop_first: bool) -> RankSummary:
    events = trace.device_events
    trace_totals = events.groupby("primitive", as_index=False).agg(time_us=("dur_us", "sum"), count=("dur_us", "size"))
    iterations = list(trace.iterations or [])
    if not iterations:  # a trace without ProfilerStep markers: its device span is one iteration
        if len(events) == 0:
            raise InputError(trace.path, "no device events to compare")
        start = float(events["ts_us"].min())
        end = float((events["ts_us"] + events["dur_us"]).max())
        iterations = [(None, start, end)]
    durations = [float(end - start) for _, start, end in iterations]
    keep = list(range(len(iterations)))
    if drop_first and len(keep) > 1:
        keep = keep[1:]
    kept = [iterations[i] for i in keep]
    dropped = [iterations[i][0] for i in range(len(iterations)) if i not in keep]
    step_col = events["iteration"]
    frames, totals, breakdowns = [], [], []
    timeline: list[dict] = []
    for step, start, end in kept:
        mine = events if step is None else events[step_col == step]
        frames.append(_op_times(mine))
        totals.append(mine[["primitive", "dur_us"]])
        breakdowns.append(iteration_breakdown(mine, start, end, pipeline))
        if not timeline:
            timeline = _timeline(mine, start)
    ops = (pd.concat(frames).groupby(["pass", "primitive", "layer"], dropna=False, as_index=False)
           .agg(time_us=("time_us", "sum"), count=("count", "sum")))
    ops[["time_us", "count"]] = ops[["time_us", "count"]] / len(kept)
    total = pd.concat(totals).groupby("primitive", as_index=False).agg(time_us=("dur_us", "sum"),
                                                                         count=("dur_us", "size"))
    return RankSummary(rank, stage, [s for s, _, _ in kept], [durations[i] for i in keep], dropped, ops, total,
                       trace_totals, mean_breakdown(breakdowns), timeline)


def _op_times(events: pd.DataFrame) -> pd.DataFrame:
    frame = pd.DataFrame({
        "pass": events["pass"].astype(str).to_numpy(),
        "primitive": events["primitive"].astype(str).to_numpy(),
        "layer": _layer_column(events),
        "time_us": events["dur_us"].to_numpy(dtype=float),
    })
    return frame.groupby(["pass", "primitive", "layer"], dropna=False, as_index=False).agg(
        time_us=("time_us", "sum"), count=("time_us", "size"))


def _layer_column(events: pd.DataFrame) -> np.ndarray:
    """The innermost annotation around each event ('' where none)."""
    if "layer" not in events:
        return np.full(len(events), "", dtype=object)
    return events["layer"].fillna("").astype(str).to_numpy(dtype=object)


def _timeline(events: pd.DataFrame, start: float) -> list[dict]:
    return [
        {"ts": float(ts - start), "dur": float(dur), "lane": str(stream), "name": str(name), "category": str(cat)}
        for ts, dur, stream, name, cat in zip(events["ts_us"], events["dur_us"], events["stream"], events["name"],
                                              events["category"])
    ]


def trace_groups(traces: list[KinetoTrace]) -> tuple[dict[str, int], set[int]]:
    """(process-group description → size, every group size) of the traces' collectives."""
    groups: dict[str, int] = {}
    sizes: set[int] = set()
    for trace in traces:
        events = trace.device_events
        if "group_size" not in events:
            continue
        comm = events[events["category"] == "communication"]
        descs = comm["process_group_desc"] if "process_group_desc" in comm else [None] * len(comm)
        for desc, size in zip(descs, comm["group_size"]):
            if size is None or pd.isna(size):
                continue
            sizes.add(int(size))
            if isinstance(desc, str) and desc:
                groups[desc] = int(size)
    return groups, sizes


def _common_steps(ranks: dict[int, RankSummary]) -> list:
    """Steps every rank kept (positions when steps are unnamed)."""
    lists = [r.steps for r in ranks.values()]
    common = [s for s in lists[0] if all(s in other for other in lists[1:])]
    return common


def empty_ops() -> pd.DataFrame:
    """An operator-time frame with no rows (columns of `RankSummary.ops`)."""
    return pd.DataFrame({"pass": [], "primitive": [], "layer": [], "time_us": [], "count": []})


def side_breakdown(side: Side, ranks: list[int]) -> Mapping[str, float | None] | None:
    """The side's iteration breakdown (s per part, and overlap_ratio) over `ranks`: what another tool measured
    (`breakdown_override`), else the mean of its ranks' own; None when no rank has one."""
    if side.breakdown_override is not None:
        return side.breakdown_override
    items = [b for r in ranks if (b := side.ranks[r].breakdown) is not None]
    mean = mean_breakdown(items)
    if mean is None:
        return None
    parts: dict[str, float | None] = {**mean.parts_s(), "overlap_ratio": mean.overlap_ratio}
    return parts

