"""tracekit's own measure of where an iteration's time goes on one rank, from its device events.

The iteration window is split into disjoint parts that add up to it:

- `compute`: time some compute event runs (optimizer-pass events excepted);
- `optimizer`: time only optimizer-pass compute runs;
- `exposed_communication`: time communication runs while no compute runs (with pipeline parallelism, pipeline
  send/recv excepted);
- `pipeline_bubble`: with pipeline parallelism, time the device is idle or only waits on pipeline send/recv;
- `other`: exposed memory copies/sets, and idle time when there is no pipeline to blame it on.

This is the same interval arithmetic as HTA's temporal breakdown (idle / compute / non-compute time) and its
communication–computation overlap, applied per iteration and with the classification of `extractors.kineto`
instead of kernel-name patterns, so it also works on traces HTA cannot load (CPU runs, predicted traces).
On CPU runs an op that wholly contains a gloo collective (run on gloo's own thread) is its caller waiting for it:
its time inside the collective counts as communication, not as compute hiding it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

P2P = "send_recv"


def merge_intervals(starts, ends) -> np.ndarray:
    """Sorted, non-overlapping [start, end) intervals covering the given ones (shape (n, 2))."""
    starts = np.asarray(starts, dtype=float)
    ends = np.asarray(ends, dtype=float)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return np.empty((0, 2))
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    new_group = np.empty(starts.size, dtype=bool)
    new_group[0] = True
    new_group[1:] = starts[1:] > reach[:-1]
    group = np.cumsum(new_group) - 1
    out = np.empty((group[-1] + 1, 2))
    out[:, 0] = starts[new_group]
    out[:, 1] = np.maximum.reduceat(ends, np.flatnonzero(new_group))
    return out


def covered(intervals: np.ndarray) -> float:
    """Total length of merged intervals."""
    return float((intervals[:, 1] - intervals[:, 0]).sum()) if len(intervals) else 0.0


def intersection(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Intersection of two merged interval sets (merged)."""
    if not len(a) or not len(b):
        return np.empty((0, 2))
    i = j = 0
    out = []
    while i < len(a) and j < len(b):
        lo, hi = max(a[i, 0], b[j, 0]), min(a[i, 1], b[j, 1])
        if hi > lo:
            out.append((lo, hi))
        if a[i, 1] < b[j, 1]:
            i += 1
        else:
            j += 1
    return np.array(out) if out else np.empty((0, 2))


def difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Parts of merged set `a` not in merged set `b`."""
    if not len(a) or not len(b):
        return a
    lo, hi = min(a[0, 0], b[0, 0]), max(a[-1, 1], b[-1, 1])
    starts = np.concatenate([[lo], b[:, 1]])
    ends = np.concatenate([b[:, 0], [hi]])
    gaps = np.column_stack([starts, ends])
    return intersection(a, gaps[gaps[:, 1] > gaps[:, 0]])


def blocked_callers(ts: np.ndarray, te: np.ndarray, compute: np.ndarray, comm: np.ndarray) -> np.ndarray:
    """CPU runs: compute ops that wholly contain a collective run by a communication thread (gloo). Such an op is
    the caller blocked on the collective, not compute overlapping it."""
    out = np.zeros(len(ts), dtype=bool)
    if not comm.any() or not compute.any():
        return out
    cs, ce = ts[comm], te[comm]
    idx = np.flatnonzero(compute)
    contains = (ts[idx, None] <= cs[None, :]) & (te[idx, None] >= ce[None, :]) & (ce > cs)[None, :]
    out[idx[contains.any(axis=1)]] = True
    return out


def union(*sets: np.ndarray) -> np.ndarray:
    stacked = [s for s in sets if len(s)]
    if not stacked:
        return np.empty((0, 2))
    both = np.vstack(stacked)
    return merge_intervals(both[:, 0], both[:, 1])


@dataclass
class IterationBreakdown:
    """Where one iteration window's time went on one rank (µs); the five parts add up to `window_us`."""

    window_us: float
    compute_us: float
    optimizer_us: float
    exposed_communication_us: float
    pipeline_bubble_us: float
    other_us: float
    communication_us: float  # union of all communication events (p2p included), exposed or not
    overlapped_communication_us: float  # part of it that runs while compute runs
    idle_us: float  # no device event at all

    @property
    def overlap_ratio(self) -> float | None:
        """Share of communication time hidden under compute (HTA's comp_comm_overlap_ratio)."""
        return self.overlapped_communication_us / self.communication_us if self.communication_us else None

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def parts_s(self) -> dict[str, float]:
        """The prediction's breakdown keys, in seconds."""
        return {
            "compute": self.compute_us / 1e6,
            "exposed_communication": self.exposed_communication_us / 1e6,
            "pipeline_bubble": self.pipeline_bubble_us / 1e6,
            "optimizer": self.optimizer_us / 1e6,
            "other": self.other_us / 1e6,
        }


def iteration_breakdown(events, start_us: float, end_us: float, pipeline: bool) -> IterationBreakdown:
    """Split the window [start_us, end_us) of one rank's device events (columns ts_us, dur_us, category,
    primitive, pass). `pipeline`: the rank belongs to a pipeline of ≥ 2 stages (idle time is then bubble)."""
    window = max(float(end_us) - float(start_us), 0.0)
    if len(events):
        ts = np.clip(events["ts_us"].to_numpy(dtype=float), start_us, end_us)
        te = np.clip((events["ts_us"] + events["dur_us"]).to_numpy(dtype=float), start_us, end_us)
        category = events["category"].astype(str).to_numpy()
        primitive = events["primitive"].astype(str).to_numpy()
        passes = events["pass"].astype(str).to_numpy()
    else:
        ts = te = np.empty(0)
        category = primitive = passes = np.empty(0, dtype=object)

    def merged(mask) -> np.ndarray:
        return merge_intervals(ts[mask], te[mask])

    is_compute = category == "computation"
    is_comm = category == "communication"
    collectives = merged(is_comm & (primitive != P2P))
    p2p = merged(is_comm & (primitive == P2P))
    comm_all = union(collectives, p2p)
    callers = np.zeros(len(ts), dtype=bool)
    if len(events) and "kind" in events:
        on_cpu = events["kind"].astype(str).to_numpy() == "cpu_op"
        callers = blocked_callers(ts, te, is_compute & on_cpu, is_comm)

    def compute_of(mask) -> np.ndarray:  # a blocked caller computes only outside the collectives it waits on
        return union(merged(mask & ~callers), difference(merged(mask & callers), comm_all))

    compute_main = compute_of(is_compute & (passes != "optimizer"))
    compute_all = union(compute_main, compute_of(is_compute & (passes == "optimizer")))
    busy = union(compute_all, comm_all, merged(category == "memory"), merged(~(is_compute | is_comm)),
                 merged(callers))

    compute_us = covered(compute_main)
    optimizer_us = covered(compute_all) - compute_us
    idle = window - covered(busy)
    rest = covered(busy) - covered(union(compute_all, comm_all))  # memory (and unknown) events alone
    if pipeline:  # waiting on a pipeline send/recv is bubble, not communication
        exposed = covered(collectives) - covered(intersection(collectives, compute_all))
        hidden_or_coll = union(compute_all, collectives)
        bubble = idle + covered(p2p) - covered(intersection(p2p, hidden_or_coll))
        other = rest
    else:  # send/recv is then all-to-all traffic: communication like the rest
        exposed = covered(comm_all) - covered(intersection(comm_all, compute_all))
        bubble = 0.0
        other = rest + idle
    overlapped = covered(intersection(comm_all, compute_all))
    return IterationBreakdown(
        window_us=window,
        compute_us=compute_us,
        optimizer_us=optimizer_us,
        exposed_communication_us=exposed,
        pipeline_bubble_us=bubble,
        other_us=other,
        communication_us=covered(comm_all),
        overlapped_communication_us=overlapped,
        idle_us=idle,
    )


def mean_breakdown(items: list[IterationBreakdown]) -> IterationBreakdown | None:
    """Field-wise mean of several iterations' breakdowns (None for none)."""
    if not items:
        return None
    fields = IterationBreakdown.__dataclass_fields__
    return IterationBreakdown(**{f: float(np.mean([getattr(b, f) for b in items])) for f in fields})
