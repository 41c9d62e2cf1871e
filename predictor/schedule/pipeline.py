"""Discrete-event simulation of one training iteration: every pipeline stage's forward/backward micro-batches in
Megatron's order (1F1B, or interleaved with virtual stages), blocking P2P transfers between stages, data-parallel
gradient sync (bucketed all-reduce, or reduce-scatter + parameter all-gather with the distributed optimizer,
overlapped with the last backward or not), the optimizer step (after the global grad-norm/inf-check reduction,
which synchronizes all stages) → iteration time and where it goes.

Orders follow Megatron's `schedules.py`: 1F1B warm-up = min(pp − rank − 1, m) forwards, then one-forward-one-
backward, then the cool-down backwards; interleaved warm-up = (pp − rank − 1)·2 + (vp − 1)·g virtual micro-batches
(all of them when that reaches m·vp; Megatron-core's `get_pp_rank_microbatches` — older Megatron-LM also warmed up
all of them whenever m = pp), the k-th forward taking the k-th entry of Megatron's schedule table: micro-batches
in groups of g (`microbatch_group_size_per_vp_stage`, default pp), each group run chunk by chunk (the last group holds
what is left); the k-th backward the same entry with the chunks in reverse.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from itertools import accumulate

import numpy as np

#: The parts of an iteration the simulation accounts for (`Timeline.breakdown_us`): the prediction's breakdown.
BREAKDOWN = ("compute", "exposed_communication", "pipeline_bubble", "optimizer", "other")


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
    """After the stage's last backward: the deferred output-layer weight gradients (`busy_end` includes them), gradient
    sync, optimizer, parameter gather and the loss report and logging barrier (predictor.parallel.iteration_syncs)
    (µs, absolute times)."""

    busy_end: float
    sync_end: float
    opt_start: float
    opt_end: float
    end: float
    grad_sync_us: float  # total DP comm time (overlapped or not)
    exposed_sync_us: float
    exposed_gather_us: float
    sync_intervals: list[tuple[float, float]] = field(default_factory=list)  # DP buckets, then embedding sync
    report_us: float = 0.0  # the loss report and logging barrier, after the gather, exposed
    drain_us: float = 0.0  # compute after the last task, before the sync (deferred output-layer weight gradients)


@dataclass
class Timeline:
    """The simulated iteration: every stage's tasks in execution order (built when first asked for: a search reads
    only the tails and the breakdown) and its tail."""

    pp: int
    vp: int
    microbatches: int
    tails: list[StageEnd]
    iteration_us: float
    breakdown_us: dict[str, float]
    critical_stage: int
    _runs: "_Runs" = field(repr=False, compare=False)

    @cached_property
    def tasks(self) -> list[list[Task]]:
        return self._runs.tasks()


def schedule_table(m: int, vp: int, group: int) -> list[tuple[int, int]]:
    """Megatron's interleaved schedule table: (micro-batch, chunk) of the k-th virtual micro-batch."""
    table: list[tuple[int, int]] = []
    for first in range(0, m, group):
        last = m if first + group >= m else first + group
        table.extend((i, c) for c in range(vp) for i in range(first, last))
    return table


def stage_order(stage: int, pp: int, vp: int, m: int, group: int | None = None) -> list[tuple[str, int, int]]:
    """Megatron's task order on one stage: [(kind, microbatch, chunk)]; `group`: the interleaved schedule's
    micro-batches per chunk in a row (default pp)."""
    if vp == 1:
        warm = min(pp - stage - 1, m)
        fwd = [("F", i, 0) for i in range(m)]
        bwd = [("B", i, 0) for i in range(m)]
    else:
        total = m * vp
        g = group or pp
        warm = min((pp - stage - 1) * 2 + (vp - 1) * g, total)
        table = schedule_table(m, vp, g)
        fwd = [("F", i, c) for i, c in table]
        bwd = [("B", i, vp - 1 - c) for i, c in table]
    order = fwd[:warm]
    steady = len(fwd) - warm
    for i in range(steady):
        order.append(fwd[warm + i])
        order.append(bwd[i])
    order.extend(bwd[steady:])
    return order


@dataclass(frozen=True)
class _Plan:
    """Megatron's task order for (pp, vp, m), shared by every configuration with those: per stage, each task's
    work slot (F: s·vp + c, B: pp·vp + s·vp + c) and the flat position of the task it waits on (`n`, a slot that
    is always 0.0, when none), in the stage's order; flat positions run stage by stage from `offsets[s]`."""

    pp: int
    vp: int
    m: int
    group: int
    orders: tuple[list, ...]  # stage_order per stage
    works: tuple[tuple[int, ...], ...]
    deps: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    n: int
    # by flat position: the warm-up and flush tasks, whose P2P sends block the stage even where the steady state's
    # run beside the next task (Megatron's interleaved schedule without --overlap-p2p-communication-warmup-flush);
    # empty: none such
    edge: tuple[bool, ...] = ()

    @cached_property
    def levels(self) -> list[tuple]:
        """The tasks in dependency levels (a level's tasks wait only on earlier levels' tasks): per level the
        arrays (positions, position of the stage's previous task or `n`, position waited on, work slot). A task's
        level is its end in a simulation where every task lasts 1."""
        works = 2 * self.pp * self.vp
        _, ends = _advance(self, [1] * works, [0] * works, [0] * works, False)
        level = np.array(ends)
        slots = np.argsort(level, kind="stable")
        prev = np.array([self.n if k == 0 else base + k - 1 for s, base in enumerate(self.offsets)
                         for k in range(len(self.works[s]))])
        deps = np.array([d for row in self.deps for d in row])
        work = np.array([w for row in self.works for w in row])
        cuts = np.flatnonzero(np.diff(level[slots])) + 1
        return [(part, prev[part], deps[part], work[part]) for part in np.split(slots, cuts)]


@lru_cache(maxsize=16)  # a big shape's plan holds ~100 bytes a task; a search asks for one shape at a time
def _plan(pp: int, vp: int, m: int, group: int, edges: bool = False) -> _Plan:
    """The plan of (pp, vp, m, group); `edges`: mark each stage's warm-up and flush tasks (`_Plan.edge`)."""
    orders = tuple(stage_order(s, pp, vp, m, group) for s in range(pp))
    offsets, n = [], 0
    for order in orders:
        offsets.append(n)
        n += len(order)
    position = [[[0] * m for _ in range(vp)] for _ in range(2 * pp)]  # [B·pp + s][c][i] → flat position
    for s, order in enumerate(orders):
        base, fwd, bwd = offsets[s], position[s], position[pp + s]
        for k, (kind, i, c) in enumerate(order):
            (fwd if kind == "F" else bwd)[c][i] = base + k
    works, deps = [], []
    for s, order in enumerate(orders):
        stage_works, stage_deps = [], []
        for kind, i, c in order:
            dep = _dependency(kind, s, c, i, pp, vp)
            stage_works.append((kind == "B") * pp * vp + s * vp + c)
            stage_deps.append(n if dep is None else position[(dep[0] == "B") * pp + dep[1]][dep[2]][dep[3]])
        works.append(tuple(stage_works))
        deps.append(tuple(stage_deps))
    edge = tuple(flag for order in orders for flag in warmup_and_flush(order)) if edges else ()
    return _Plan(pp, vp, m, group, orders, tuple(works), tuple(deps), tuple(offsets), n, edge)


def warmup_and_flush(order: list[tuple[str, int, int]]) -> list[bool]:
    """Per task of a stage's order, whether it is a warm-up forward (before the stage's first backward) or a flush
    backward (after its last forward)."""
    kinds = [kind for kind, _, _ in order]
    first_b = kinds.index("B") if "B" in kinds else len(kinds)
    last_f = len(kinds) - 1 - kinds[::-1].index("F") if "F" in kinds else -1
    return [(k < first_b and kind == "F") or (k > last_f and kind == "B") for k, kind in enumerate(kinds)]


@dataclass
class _Runs:
    """Start and end of every task of one simulated pipeline, by flat position (see `_Plan`)."""

    plan: _Plan
    works: list[Work]  # by work slot
    sends: list[float]  # P2P send blocking the stage after the task, by work slot (0.0 with overlap_p2p)
    starts: list | np.ndarray
    ends: list | np.ndarray
    # the P2P send by work slot, which the plan's edge tasks block on (given wherever the plan marks edges)
    links: list[float] = field(default_factory=list)

    def send(self, position: int, slot: int) -> float:
        """The P2P send blocking the stage after the task at flat `position` (work slot `slot`)."""
        return self.links[slot] if self.plan.edge and self.plan.edge[position] else self.sends[slot]

    def tasks(self) -> list[list[Task]]:
        plan, out = self.plan, []
        starts, ends = list(map(float, self.starts)), list(map(float, self.ends))
        for s, order in enumerate(plan.orders):
            base, works = plan.offsets[s], plan.works[s]
            out.append([Task(kind, s, c, i, starts[base + k], ends[base + k], self.works[works[k]],
                             self.send(base + k, works[k])) for k, (kind, i, c) in enumerate(order)])
        return out

    def stage_sum(self, s: int, values: list[float]) -> float:
        """Σ over the stage's tasks, in its order, of a per-work-slot value (the sum a loop over its tasks makes)."""
        return sum(map(values.__getitem__, self.plan.works[s]))

    def stage_sends(self, s: int) -> float:
        """Σ of the P2P sends blocking stage `s` after its tasks."""
        if not self.plan.edge:
            return self.stage_sum(s, self.sends)
        base = self.plan.offsets[s]
        return sum(self.send(base + k, w) for k, w in enumerate(self.plan.works[s]))


def _advance(plan: _Plan, total: list, blocking: list, link: list, overlap_p2p: bool) -> tuple[list, list]:
    """(starts, ends) by flat position, one configuration. Each stage advances through its order while the tasks
    it waits on are done; a task starts when both its stage and its input are free: start = max(stage clock,
    input's arrival), end = start + work + blocking send; its output arrives at end (+ the send beside the next
    task with `overlap_p2p`)."""
    pp = plan.pp
    edge = plan.edge if overlap_p2p else ()
    starts: list = [None] * plan.n
    ends: list = [None] * plan.n
    arrival: list = [None] * plan.n + [0.0]  # None: not simulated yet; the last slot: no input to wait for
    count, clock = [0] * pp, [0.0] * pp
    remaining = plan.n
    while remaining:
        before = remaining
        for s in range(pp):
            deps, slots, k, now, base = plan.deps[s], plan.works[s], count[s], clock[s], plan.offsets[s]
            size = len(deps)
            while k < size:
                ready = arrival[deps[k]]
                if ready is None:
                    break
                w = slots[k]
                start = now if now > ready else ready
                if edge and edge[base + k]:  # a warm-up or flush task: its send blocks
                    now = start + total[w] + link[w]
                    arrival[base + k] = now
                else:
                    now = start + total[w] + blocking[w]
                    arrival[base + k] = now + link[w] if overlap_p2p else now
                starts[base + k] = start
                ends[base + k] = now
                k += 1
            remaining -= k - count[s]
            count[s], clock[s] = k, now
        if remaining == before:  # cannot happen for Megatron's orders; guards an inconsistent schedule
            raise RuntimeError("pipeline schedule deadlocked")
    return starts, ends


def _advance_many(plan: _Plan, total: np.ndarray, blocking: np.ndarray, link: np.ndarray, overlap_p2p: bool
                  ) -> tuple[np.ndarray, np.ndarray]:
    """`_advance` of several configurations at once (columns of `total`, `blocking`, `link`: work slot ×
    configuration), one dependency level at a time: the same additions and maxima, in the same order, on arrays."""
    n, k = plan.n, total.shape[1]
    starts = np.empty((n, k))
    ends = np.zeros((n + 1, k))  # the last row: before a stage's first task, and the input of a task with none
    arrival = np.zeros((n + 1, k)) if overlap_p2p else ends
    edge = np.array(plan.edge, dtype=bool) if overlap_p2p and plan.edge else None
    for slots, prev, deps, works in plan.levels:
        start = np.maximum(ends[prev], arrival[deps])
        end = start + total[works]
        if edge is None:
            end += blocking[works]
        else:  # warm-up and flush tasks block on their sends (`_advance`)
            end += np.where(edge[slots][:, None], link[works], blocking[works])
        starts[slots] = start
        ends[slots] = end
        if overlap_p2p:
            arrival[slots] = end + link[works] if edge is None else \
                np.where(edge[slots][:, None], end, end + link[works])
    return starts, ends[:n]


#: Configurations × pipeline stages from which one shared plan is simulated with arrays instead of task by task.
VECTOR_MIN = 12


def pipeline_runs(jobs: list[tuple[list[list[Work]], list[list[Work]], int, float, bool, int | None, bool]]
                  ) -> list[_Runs]:
    """Start/end of every task of each job (fwd, bwd, m, p2p_us, overlap_p2p, group: the interleaved schedule's
    micro-batches per chunk in a row, None for pp; edges_block). fwd[s][c] / bwd[s][c]: one
    micro-batch of chunk c on stage s. A task's P2P send blocks its stage (1F1B's batched send/recv), or with
    `overlap_p2p` (Megatron-core's interleaved schedule) runs beside the stage's next task: the receiver still waits
    for it, the sender does not; with `edges_block` too, the warm-up and flush tasks' sends block (Megatron overlaps
    them only with --overlap-p2p-communication-warmup-flush). Jobs of one pipeline shape (pp, vp, m) share its plan;
    enough of them together are simulated as arrays (`_advance_many`), else one by one (`_advance`): the same numbers
    either way."""
    prepared: list[tuple[list[Work], list[float], list[float], list[float]]] = []
    groups: dict[tuple[int, int, int, bool, int, bool], list[int]] = {}
    for j, (fwd, bwd, m, p2p_us, overlap_p2p, group, edges_block) in enumerate(jobs):
        pp, vp = len(fwd), len(fwd[0])
        works = [w for row in fwd for w in row] + [w for row in bwd for w in row]
        link = [p2p_us if _sends(kind, s, c, pp, vp) else 0.0 for kind in "FB" for s in range(pp) for c in range(vp)]
        prepared.append((works, [w.total for w in works], [0.0] * len(works) if overlap_p2p else link, link))
        groups.setdefault((pp, vp, m, overlap_p2p, group or pp, bool(overlap_p2p and edges_block)), []).append(j)
    out: list = [None] * len(jobs)
    for (pp, vp, m, overlap_p2p, group, edges), members in groups.items():
        plan = _plan(pp, vp, m, group, edges)
        if len(members) * pp < VECTOR_MIN:
            for j in members:
                works, total, blocking, link = prepared[j]
                out[j] = _Runs(plan, works, blocking, *_advance(plan, total, blocking, link, overlap_p2p), link)
            continue
        total_c, blocking_c, link_c = (np.array([prepared[j][i] for j in members]).T for i in (1, 2, 3))
        starts, ends = _advance_many(plan, total_c, blocking_c, link_c, overlap_p2p)
        for col, j in enumerate(members):
            works, _, blocking, link = prepared[j]
            out[j] = _Runs(plan, works, blocking, starts[:, col], ends[:, col], link)  # views: tasks built if asked
    return out


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


def simulate(fwd: list[list[Work]], bwd: list[list[Work]], m: int, **options) -> Timeline:
    """The whole iteration (see `simulate_many` for the options)."""
    return simulate_many([(fwd, bwd, m, options)])[0]


def simulate_many(jobs: list[tuple[list[list[Work]], list[list[Work]], int, dict]]) -> list[Timeline]:
    """The whole iteration of each job (fwd, bwd, micro-batches, options); jobs of one pipeline shape are simulated
    together (`pipeline_runs`). Options, per stage: grad_buckets_us (DP bucket collectives in order),
    embedding_sync_us (tied embedding all-reduce), optimizer_us, param_gather_us (distributed optimizer's
    all-gather, exposed unless overlap_param_gather: overlapped with the next forward), report_us (the loss report and
    logging barrier per iteration, after it, exposed); overlap_grad (buckets beside the last backward of their model
    chunk); grad_bucket_chunks (per stage, each bucket's model chunk; default 0); iteration_overhead_us; p2p_us and
    overlap_p2p (P2P sends beside the next task); p2p_edges_block (with overlap_p2p, the warm-up and flush tasks'
    sends block all the same); microbatch_group (the interleaved schedule's micro-batches per chunk in a row; default
    pp); drain_us (compute after the stage's last task, before its gradient sync)."""
    runs = pipeline_runs([(fwd, bwd, m, options.get("p2p_us", 0.0), options.get("overlap_p2p", False),
                           options.get("microbatch_group"), options.get("p2p_edges_block", False))
                          for fwd, bwd, m, options in jobs])
    return [_finish(run, m, **{k: v for k, v in options.items()
                               if k not in ("p2p_us", "overlap_p2p", "microbatch_group", "p2p_edges_block")})
            for run, (_, _, m, options) in zip(runs, jobs)]


def _finish(runs: _Runs, m: int, *, grad_buckets_us: list[list[float]] | None = None, overlap_grad: bool = False,
            grad_bucket_chunks: list[list[int]] | None = None, embedding_sync_us: list[float] | None = None,
            optimizer_us: list[float] | None = None,
            param_gather_us: list[float] | None = None, overlap_param_gather: bool = False,
            report_us: list[float] | None = None, iteration_overhead_us: float = 0.0,
            drain_us: list[float] | None = None) -> Timeline:
    """Gradient sync, optimizer and breakdown after the simulated pipeline (`drain_us`: compute a stage runs after its
    last task, before its gradient sync: the deferred output-layer weight gradients)."""
    pp, vp = runs.plan.pp, runs.plan.vp
    grad_buckets_us = grad_buckets_us or [[] for _ in range(pp)]
    embedding_sync_us = embedding_sync_us or [0.0] * pp
    optimizer_us = optimizer_us or [0.0] * pp
    param_gather_us = param_gather_us or [0.0] * pp
    report_us = report_us or [0.0] * pp
    drain_us = drain_us or [0.0] * pp
    sync_ends, busy_ends, intervals = [], [], []
    for s in range(pp):
        last = runs.plan.offsets[s] + len(runs.plan.works[s]) - 1
        last_end = float(runs.ends[last]) + drain_us[s]
        busy_ends.append(last_end)
        if overlap_grad and grad_buckets_us[s]:
            chunks = grad_bucket_chunks[s] if grad_bucket_chunks else [0] * len(grad_buckets_us[s])
            spans, t = _overlapped_spans(grad_buckets_us[s], chunks, _last_backwards(runs, s), last_end)
        else:  # after the stage's last backward, one after the other
            ends = list(accumulate(grad_buckets_us[s], initial=last_end))
            spans, t = list(zip(ends[:-1], ends[1:])), ends[-1]
        t = max(t, last_end)
        if embedding_sync_us[s]:
            spans.append((t, t + embedding_sync_us[s]))
        intervals.append(spans)
        sync_ends.append(t + embedding_sync_us[s])
    opt_start = max(sync_ends)  # grad-norm / found-inf all-reduce over all ranks: a global barrier
    tails = []
    for s in range(pp):
        opt_end = opt_start + optimizer_us[s]
        gather = 0.0 if overlap_param_gather else param_gather_us[s]
        tails.append(StageEnd(busy_ends[s], sync_ends[s], opt_start, opt_end, opt_end + gather + report_us[s],
                              sum(grad_buckets_us[s]) + embedding_sync_us[s], sync_ends[s] - busy_ends[s], gather,
                              intervals[s], report_us[s], drain_us[s]))
    iteration = max(t.end for t in tails) + iteration_overhead_us
    works = runs.works
    totals = [w.total for w in works]
    busy = [runs.stage_sum(s, totals) + runs.stage_sends(s) + drain_us[s] for s in range(pp)]
    crit = max(range(pp), key=lambda s: (busy[s], -s))
    tail = tails[crit]
    breakdown = {
        "compute": runs.stage_sum(crit, [w.compute for w in works]) + drain_us[crit],
        "exposed_communication": runs.stage_sum(crit, [w.comm for w in works]) + runs.stage_sends(crit)
        + tail.exposed_sync_us + tail.exposed_gather_us + tail.report_us,
        "optimizer": optimizer_us[crit],
        "other": runs.stage_sum(crit, [w.other for w in works]) + iteration_overhead_us,
    }
    # what is left of the iteration: below a part in 10^12 of it, the rounding of the sums, not waiting
    bubble = iteration - sum(breakdown.values())
    breakdown["pipeline_bubble"] = bubble if bubble > 1e-12 * iteration else 0.0
    return Timeline(pp, vp, m, tails, iteration, breakdown, crit, runs)


def _last_backwards(runs: _Runs, s: int) -> dict[int, tuple[float, float]]:
    """(start, end) of the last backward task (or weight-gradient task) of each model chunk on stage `s`: the stage's
    order read from its end, until every chunk is found."""
    base, order, out = runs.plan.offsets[s], runs.plan.orders[s], {}
    for k in range(len(order) - 1, -1, -1):
        kind, _, chunk = order[k]
        if kind != "F" and chunk not in out:
            out[chunk] = (float(runs.starts[base + k]), float(runs.ends[base + k]))
            if len(out) == runs.plan.vp:
                break
    return out


def _overlapped_spans(buckets: list[float], chunks: list[int], last_backward: dict[int, tuple[float, float]],
                      last_end: float) -> tuple[list[tuple[float, float]], float]:
    """(start, end) of each DP bucket collective (in the order given) overlapped with the backward, and when the last
    ends: the i-th of a chunk's n buckets is ready after (i+1)/n of the chunk's last backward, and they run one after
    the other on the stage's communication stream in the order they are ready."""
    of_chunk = Counter(chunks)
    ready, seen = [], dict.fromkeys(of_chunk, 0)
    for chunk in chunks:
        start, end = last_backward.get(chunk, (last_end, last_end))
        seen[chunk] += 1
        ready.append(start + (end - start) * seen[chunk] / of_chunk[chunk])
    spans: list[tuple[float, float]] = [(0.0, 0.0)] * len(buckets)
    t = float("-inf")
    for i in sorted(range(len(buckets)), key=lambda i: (ready[i], i)):
        start = ready[i] if ready[i] > t else t
        t = start + buckets[i]
        spans[i] = (start, t)
    return spans, t
