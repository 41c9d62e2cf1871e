"""Discrete-event simulation of one training iteration: every pipeline stage's forward/backward micro-batches in
Megatron's order (1F1B, or interleaved with virtual stages), blocking P2P transfers between stages, data-parallel
gradient sync (bucketed all-reduce, or reduce-scatter + parameter all-gather with the distributed optimizer,
overlapped with the last backward or not), the optimizer step (after the global grad-norm/inf-check reduction,
which synchronizes all stages) → iteration time and where it goes.

Orders follow Megatron's `schedules.py`: 1F1B warm-up = min(pp − rank − 1, m) forwards, then one-forward-one-
backward, then the cool-down backwards; interleaved warm-up = (pp − rank − 1)·2 + (vp − 1)·pp virtual
micro-batches (all of them when m = pp), with model chunk (k mod pp·vp) // pp for the k-th forward.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache


@dataclass(frozen=True)
class Work:
    """Duration of one task split into where the time goes (µs)."""

    compute: float = 0.0
    comm: float = 0.0  # blocking TP/CP collectives inside the task
    other: float = 0.0  # framework overhead (calibration)

    @property
    def total(self) -> float:
        return self.compute + self.comm + self.other


@dataclass
class Task:
    kind: str  # "F" | "B"
    stage: int
    chunk: int
    microbatch: int
    start: float = 0.0
    end: float = 0.0  # includes the blocking send to the next stage
    work: Work = field(default_factory=Work)
    send: float = 0.0  # P2P send time at the end of the task


@dataclass
class StageEnd:
    """After the stage's last backward: gradient sync, optimizer and parameter gather (µs, absolute times)."""

    busy_end: float
    sync_end: float
    opt_start: float
    opt_end: float
    end: float
    grad_sync_us: float  # total DP comm time (overlapped or not)
    exposed_sync_us: float
    exposed_gather_us: float
    sync_intervals: list[tuple[float, float]] = field(default_factory=list)  # DP buckets, then embedding sync


@dataclass
class Timeline:
    """The simulated iteration: every stage's tasks in execution order and its tail."""

    pp: int
    vp: int
    microbatches: int
    tasks: list[list[Task]]
    tails: list[StageEnd]
    iteration_us: float
    breakdown_us: dict[str, float]
    critical_stage: int


def stage_order(stage: int, pp: int, vp: int, m: int) -> list[tuple[str, int, int]]:
    """Megatron's task order on one stage: [(kind, microbatch, chunk)]."""
    if vp == 1:
        warm = min(pp - stage - 1, m)
        fwd = [("F", i, 0) for i in range(m)]
        bwd = [("B", i, 0) for i in range(m)]
    else:
        total = m * vp
        warm = total if m == pp else min((pp - stage - 1) * 2 + (vp - 1) * pp, total)

        def mb(k: int) -> int:
            return (k // (pp * vp)) * pp + k % pp

        fwd = [("F", mb(k), (k % (pp * vp)) // pp) for k in range(total)]
        bwd = [("B", mb(k), vp - 1 - (k % (pp * vp)) // pp) for k in range(total)]
    order = fwd[:warm]
    steady = len(fwd) - warm
    for i in range(steady):
        order.append(fwd[warm + i])
        order.append(bwd[i])
    order.extend(bwd[steady:])
    return order


@lru_cache(maxsize=256)
def _plan(pp: int, vp: int, m: int) -> tuple[tuple[tuple, ...], ...]:
    """Per stage, in Megatron's order: (kind, microbatch, chunk, dependency as (stage, position) or None, whether the
    task ends with a P2P send). Shared by every configuration with the same pp, vp and micro-batches."""
    orders = [stage_order(s, pp, vp, m) for s in range(pp)]
    position = {(kind, s, c, i): k for s, order in enumerate(orders) for k, (kind, i, c) in enumerate(order)}
    plan = []
    for s, order in enumerate(orders):
        rows = []
        for kind, i, c in order:
            dep = _dependency(kind, s, c, i, pp, vp)
            rows.append((kind, i, c, None if dep is None else (dep[1], position[dep]), _sends(kind, s, c, pp, vp)))
        plan.append(tuple(rows))
    return tuple(plan)


def simulate_pipeline(fwd: list[list[Work]], bwd: list[list[Work]], m: int, p2p_us: float = 0.0,
                      overlap_p2p: bool = False) -> list[list[Task]]:
    """Start/end of every task. fwd[s][c] / bwd[s][c]: one micro-batch of chunk c on stage s. A task's P2P send
    blocks its stage (1F1B's batched send/recv), or with `overlap_p2p` (Megatron-core's interleaved schedule)
    runs beside the stage's next task: the receiver still waits for it, the sender does not."""
    pp, vp = len(fwd), len(fwd[0])
    plan = _plan(pp, vp, m)
    arrival = [[0.0] * len(rows) for rows in plan]  # when each task's output reaches the task that waits on it
    tasks: list[list[Task]] = [[] for _ in range(pp)]
    clock = [0.0] * pp
    count = [0] * pp
    remaining = sum(len(rows) for rows in plan)
    while remaining:
        before = remaining
        for s in range(pp):
            rows, k, now, out, arrive = plan[s], count[s], clock[s], tasks[s], arrival[s]
            while k < len(rows):
                kind, i, c, dep, sends = rows[k]
                if dep is None:
                    ready = 0.0
                elif count[dep[0]] > dep[1]:
                    ready = arrival[dep[0]][dep[1]]
                else:
                    break
                work = (fwd if kind == "F" else bwd)[s][c]
                send = p2p_us if sends else 0.0
                start = now if now > ready else ready
                if overlap_p2p:
                    now = start + work.total
                    out.append(Task(kind, s, c, i, start, now, work, 0.0))
                    arrive[k] = now + send
                else:
                    now = start + work.total + send
                    out.append(Task(kind, s, c, i, start, now, work, send))
                    arrive[k] = now
                k += 1
                count[s] = k  # the last stage's backward waits on its own forward, earlier in its order
                remaining -= 1
            clock[s] = now
        if remaining == before:  # cannot happen for Megatron's orders; guards an inconsistent schedule
            raise RuntimeError("pipeline schedule deadlocked")
    return tasks


def _dependency(kind: str, s: int, c: int, i: int, pp: int, vp: int) -> tuple[str, int, int, int] | None:
    if kind == "F":
        if s > 0:
            return ("F", s - 1, c, i)
        return ("F", pp - 1, c - 1, i) if c > 0 else None
    if s < pp - 1:
        return ("B", s + 1, c, i)
    if c < vp - 1:
        return ("B", 0, c + 1, i)
    return ("F", s, c, i)


def _sends(kind: str, s: int, c: int, pp: int, vp: int) -> bool:
    """Whether the task ends with a P2P send (activations forward, gradients backward)."""
    if pp == 1:
        return False
    if kind == "F":
        return not (s == pp - 1 and c == vp - 1)
    return not (s == 0 and c == 0)


def simulate(fwd: list[list[Work]], bwd: list[list[Work]], m: int, *, p2p_us: float = 0.0,
             grad_buckets_us: list[list[float]] | None = None, overlap_grad: bool = False,
             embedding_sync_us: list[float] | None = None, optimizer_us: list[float] | None = None,
             param_gather_us: list[float] | None = None, overlap_param_gather: bool = False,
             iteration_overhead_us: float = 0.0, overlap_p2p: bool = False) -> Timeline:
    """The whole iteration. Per stage: grad_buckets_us (DP bucket collectives in order), embedding_sync_us (tied
    embedding all-reduce), optimizer_us, param_gather_us (distributed optimizer's all-gather, exposed unless
    overlapped with the next forward); overlap_p2p: P2P sends beside the next task (see simulate_pipeline)."""
    pp, vp = len(fwd), len(fwd[0])
    tasks = simulate_pipeline(fwd, bwd, m, p2p_us, overlap_p2p)
    grad_buckets_us = grad_buckets_us or [[] for _ in range(pp)]
    embedding_sync_us = embedding_sync_us or [0.0] * pp
    optimizer_us = optimizer_us or [0.0] * pp
    param_gather_us = param_gather_us or [0.0] * pp
    sync_ends, busy_ends, intervals = [], [], []
    for s in range(pp):
        last = tasks[s][-1]
        busy_ends.append(last.end)
        buckets = grad_buckets_us[s]
        spans = []
        t = last.start if overlap_grad else last.end
        for i, dur in enumerate(buckets):  # overlapped: bucket i is ready after (i+1)/n of the last backward
            ready = last.start + (last.end - last.start) * (i + 1) / len(buckets) if overlap_grad else t
            spans.append((max(t, ready), max(t, ready) + dur))
            t = spans[-1][1]
        t = max(t, last.end)
        if embedding_sync_us[s]:
            spans.append((t, t + embedding_sync_us[s]))
        intervals.append(spans)
        sync_ends.append(t + embedding_sync_us[s])
    opt_start = max(sync_ends)  # grad-norm / found-inf all-reduce over all ranks: a global barrier
    tails = []
    for s in range(pp):
        opt_end = opt_start + optimizer_us[s]
        gather = 0.0 if overlap_param_gather else param_gather_us[s]
        tails.append(StageEnd(busy_ends[s], sync_ends[s], opt_start, opt_end, opt_end + gather,
                              sum(grad_buckets_us[s]) + embedding_sync_us[s], sync_ends[s] - busy_ends[s], gather,
                              intervals[s]))
    iteration = max(t.end for t in tails) + iteration_overhead_us
    busy = [sum(t.work.total + t.send for t in row) for row in tasks]
    crit = max(range(pp), key=lambda s: (busy[s], -s))
    row, tail = tasks[crit], tails[crit]
    breakdown = {
        "compute": sum(t.work.compute for t in row),
        "exposed_communication": sum(t.work.comm + t.send for t in row) + tail.exposed_sync_us
        + tail.exposed_gather_us,
        "optimizer": optimizer_us[crit],
        "other": sum(t.work.other for t in row) + iteration_overhead_us,
    }
    breakdown["pipeline_bubble"] = max(0.0, iteration - sum(breakdown.values()))
    return Timeline(pp, vp, m, tasks, tails, iteration, breakdown, crit)
