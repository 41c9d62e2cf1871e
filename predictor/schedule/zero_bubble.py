"""PyTorch's pipeline schedules beyond Megatron's (`torch.distributed.pipelining`, what torchtitan runs as
`parallelism.pipeline_parallel_schedule`): their per-rank orders, their stage placement, and the simulation of one
iteration with the backward split into the input gradient (I) and the weight gradient (W).

Orders, per rank, as PyTorch builds them (`tracekit.core.pipeline_layout.ZERO_BUBBLE`; stages numbered 0 … S−1 along
the model, n stages per rank):

- LoopedBFS: loop placement (stage g on rank g mod pp); every micro-batch's forward through the rank's first stage,
  then its next stage, …; then the full backwards (B), stages in reverse and micro-batches in reverse.
- InterleavedZeroBubble (ZB1P of Qi et al., "Zero Bubble Pipeline Parallelism", 2023): loop placement; micro-batches
  in rounds of m // max(1, m // pp); warm-up = (n−1)·round + pp−1−rank forwards (capped at n·m); then per step a
  forward and an input backward, and from step `rank` on the weight backward of the oldest input backward not yet
  followed by one; the cool-down's input backwards each with a weight backward the same way; the weight backwards
  left at the end.
- ZBVZeroBubble (ZB-V, Section 6 of the paper): V placement (rank r holds stages r and 2·pp−1−r); 2·(pp−r)−1
  forwards of the first stage, r pairs (second stage, first stage), pp−r triples F-I-W of the second stage, then
  per step F-I-W of the first stage and F-I-W of the second, the cool-down's input backwards of both stages, and the
  weight backwards left (PyTorch plans max(2·pp−1, m) micro-batches and drops those beyond m).
- DualPipeV (DeepSeek-V3's DualPipe in a V, PyTorch's `ScheduleDualPipeV`): V placement; its eight steps of
  forwards, input backwards with queued weight backwards, full backwards, and overlapped pairs (a forward of one
  stage with the full backward of another micro-batch on the other stage). PyTorch runs such a pair's two halves one
  after the other unless a custom overlap function is registered; tracekit times them one after the other.

The simulation (`simulate`) reuses predictor.schedule.pipeline's engine: each rank runs its order; a task starts when
its rank is free and its input has arrived: F of stage g waits on F of g−1 (none for stage 0), I (or B) of g on I of g+1
(on F of the last stage for the last stage), W on the same stage's I of that micro-batch (earlier on the same rank in
every order). A stage's output crosses a P2P link unless the next stage is on the same rank (the V's turn); the gradient
sync, optimizer and breakdown follow the rank's last task (`schedule._finish`).
"""
from __future__ import annotations

from collections import deque

from predictor.schedule.pipeline import Timeline, Work, _advance, _finish, _Plan, _Runs, simulate_many
from tracekit.core.errors import ConfigError
from tracekit.core.pipeline_layout import SPLIT_BACKWARD, V_SHAPED, check_schedule

#: (kind F | I | W | B, global stage, micro-batch) of one task in a rank's order.
Action = tuple[str, int, int]
KINDS = ("F", "I", "W", "B")


def rank_of(stage: int, pp: int, v_shaped: bool) -> int:
    """The rank holding a global stage: loop placement g mod pp, or the V (rank r: stages r and 2·pp−1−r)."""
    if v_shaped:
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


def segment_of(rank: int, chunk: int, pp: int, schedule: str | None) -> tuple[int, int]:
    """(rank, chunk) of the graph segment (Megatron's layout: virtual stage c·pp + r) that `rank` runs as its
    `chunk`-th stage under `schedule` (None: Megatron's order, the same place)."""
    if schedule in V_SHAPED and chunk == 1:
        return pp - 1 - rank, 1  # stage 2·pp−1−rank
    return rank, chunk


def orders(schedule: str, pp: int, n: int, m: int) -> list[list[Action]]:
    """Every rank's order of `schedule` with pp ranks, n stages per rank and m micro-batches."""
    check_schedule(schedule, pp, n, m)
    build = {"LoopedBFS": _looped_bfs, "InterleavedZeroBubble": _interleaved_zb, "ZBVZeroBubble": _zbv,
             "DualPipeV": _dualpipev}[schedule]
    return [build(rank, pp, n, m) for rank in range(pp)]


def _looped_bfs(rank: int, pp: int, n: int, m: int) -> list[Action]:
    stages = [rank + k * pp for k in range(n)]
    out: list[Action] = [("F", g, i) for g in stages for i in range(m)]
    return out + [("B", g, i) for g in reversed(stages) for i in reversed(range(m))]


class _Order:
    """One rank's order as it is built: the next micro-batch of each (kind, stage), and the input backwards whose
    weight backward is queued for later."""

    def __init__(self) -> None:
        self.actions: list[Action] = []
        self._next: dict[tuple[str, int], int] = {}
        self._queued: deque[tuple[int, int]] = deque()

    def count(self, kind: str, stage: int) -> int:
        return self._next.get((kind, stage), 0)

    def add(self, kind: str, stage: int, queue: bool = False) -> int:
        """The next micro-batch's `kind` of `stage`; an input backward with `queue` leaves its weight backward to
        `weight()`."""
        i = self.count(kind, stage)
        self._next[kind, stage] = i + 1
        self.actions.append((kind, stage, i))
        if queue:
            self._queued.append((stage, i))
        return i

    def full(self, stage: int) -> None:
        """A full backward of the next micro-batch: its input and weight parts back to back."""
        i = self.add("I", stage)
        self.actions.append(("W", stage, i))

    def weight(self) -> None:
        """The weight backward of the oldest queued input backward (none queued: nothing)."""
        if self._queued:
            stage, i = self._queued.popleft()
            self.actions.append(("W", stage, i))

    def drain(self) -> None:
        while self._queued:
            self.weight()


def _interleaved_zb(rank: int, pp: int, n: int, m: int) -> list[Action]:
    per_round = m // max(1, m // pp)
    total = n * m
    warm = min((n - 1) * per_round + pp - 1 - rank, total)
    order = _Order()
    for step in range(total + warm):
        if step < total:
            order.add("F", ((step // per_round) % n) * pp + rank)
        if step >= warm:
            order.add("I", (n - 1 - ((step - warm) // per_round) % n) * pp + rank, queue=True)
            if step - warm >= rank:
                order.weight()
    order.drain()
    return order.actions


def _zbv(rank: int, pp: int, n: int, m: int) -> list[Action]:
    planned = max(2 * pp - 1, m)
    first, second = rank, 2 * pp - 1 - rank
    order = _Order()
    for _ in range(2 * (pp - rank) - 1):
        order.add("F", first)
    for _ in range(rank):
        order.add("F", second)
        order.add("F", first)
    for _ in range(pp - rank):
        for kind in "FIW":
            order.add(kind, second)
    while order.count("F", second) < order.count("F", first) or order.count("F", first) < planned:
        if order.count("F", first) < planned:
            order.add("F", first)
        order.add("I", first)
        order.add("W", first)
        for kind in "FIW":
            order.add(kind, second)
    for _ in range(rank):
        order.add("I", first)
        order.add("I", second)
    for _ in range(pp - rank):
        order.add("I", first)
        order.add("W", first)
    for stage in (second, first):
        while order.count("W", stage) < order.count("I", stage):
            order.add("W", stage)
    return [a for a in order.actions if a[2] < m]


def _dualpipev(rank: int, pp: int, n: int, m: int) -> list[Action]:
    first, second = rank, 2 * pp - 1 - rank
    order = _Order()

    def backward(stage: int, split: bool) -> None:
        """An input backward with its weight backward queued (`split`), or a full backward."""
        if split:
            order.add("I", stage, queue=True)
        else:
            order.full(stage)

    for _ in range(2 * (pp - rank - 1)):
        order.add("F", first)
    for _ in range(rank + 1):
        order.add("F", first)
        order.add("F", second)
    for _ in range(pp - rank - 1):
        backward(second, True)
        order.weight()
        order.add("F", second)
    for _ in range(m - 2 * pp + rank + 1):  # pairs: a forward beside a full backward, run one after the other
        order.add("F", first)
        order.full(second)
        order.add("F", second)
        order.full(first)
    for _ in range(pp - rank - 1):
        order.full(second)
        order.add("F", second)
        order.full(first)
    split = False
    half = (rank + 1) // 2
    for i in range(rank + 1):
        if i == half and rank % 2 == 1:
            split = True
        backward(second, split)
        if i == half and rank % 2 == 0:
            split = True
        backward(first, split)
    for _ in range(pp - rank - 1):
        order.weight()
        backward(first, split)
    for _ in range(rank + 1):
        order.weight()
    order.drain()  # PyTorch's last step drains the queue (kept as a guard: every I gets its W)
    return order.actions


def _dependency(kind: str, g: int, i: int, stages: int, planned: dict[Action, int]) -> Action | None:
    """The task whose output this one waits on (module docstring): F on the previous stage's F; I or B on the next
    stage's I or B (the last stage on its own F); W on nothing beyond its rank's order (its I is earlier there)."""
    if kind == "F":
        return ("F", g - 1, i) if g > 0 else None
    if kind in ("I", "B"):
        if g == stages - 1:
            return ("F", g, i)
        return ("I", g + 1, i) if ("I", g + 1, i) in planned else ("B", g + 1, i)
    return None


def plan(schedule: str, pp: int, n: int, m: int) -> _Plan:
    """predictor.schedule.pipeline's plan of `schedule`: per rank the tasks (kind, micro-batch, chunk) in order, each
    task's work slot (kind index · S + stage) and the flat position of the task it waits on."""
    stages = pp * n
    rank_orders = orders(schedule, pp, n, m)
    offsets, total = [], 0
    for order in rank_orders:
        offsets.append(total)
        total += len(order)
    position: dict[Action, int] = {}
    for r, order in enumerate(rank_orders):
        for k, action in enumerate(order):
            if action in position:
                raise ConfigError(f"pipeline_schedule {schedule}: task {action} planned twice")
            position[action] = offsets[r] + k
    works, deps, shown = [], [], []
    for order in rank_orders:
        row_works, row_deps, row_shown = [], [], []
        for kind, g, i in order:
            dep = _dependency(kind, g, i, stages, position)
            row_works.append(KINDS.index(kind) * stages + g)
            row_deps.append(total if dep is None else position[dep])
            row_shown.append((kind, i, g // pp))  # the chunk: the V's arm, or the loop's turn
        works.append(tuple(row_works))
        deps.append(tuple(row_deps))
        shown.append(row_shown)
    return _Plan(pp, n, m, 0, tuple(shown), tuple(works), tuple(deps), tuple(offsets), total)


def sends(kind: str, g: int, pp: int, n: int, v_shaped: bool) -> bool:
    """Whether the task's output crosses to another rank (forward to g+1, input gradient to g−1)."""
    stages = pp * n
    if kind == "F":
        return g < stages - 1 and rank_of(g + 1, pp, v_shaped) != rank_of(g, pp, v_shaped)
    if kind in ("I", "B"):
        return g > 0 and rank_of(g - 1, pp, v_shaped) != rank_of(g, pp, v_shaped)
    return False


def simulate(fwd: list[list[Work]], bwd: list[list[Work]], m: int, *, pipeline_schedule: str,
             wgrad: list[list[Work]] | None = None, p2p_us: float = 0.0, overlap_p2p: bool = False,
             microbatch_group: int | None = None, p2p_edges_block: bool = False, **options) -> Timeline:
    """One iteration of `pipeline_schedule`. fwd[r][c], bwd[r][c] (the input backward, or the whole backward for
    LoopedBFS) and wgrad[r][c] (the weight backward): one micro-batch of the segment that Megatron's layout places at
    rank r, chunk c, which holds virtual stage c·pp + r of the model, whichever rank the schedule places it on. P2P
    sends block their rank, or with `overlap_p2p` run beside its next task; the other options are
    `schedule.simulate_many`'s (gradient sync, optimizer, overhead), after each rank's last task.
    `microbatch_group` (Megatron's interleaved groups) and `p2p_edges_block` (its warm-up and flush sends) do not
    apply to PyTorch's schedules."""
    pp, n = len(fwd), len(fwd[0])
    v = pipeline_schedule in V_SHAPED
    stages = pp * n
    empty = Work()
    weight = wgrad or [[empty] * n for _ in range(pp)]
    split = pipeline_schedule in SPLIT_BACKWARD
    by_kind = {"F": fwd, "I": bwd if split else [[empty] * n for _ in range(pp)], "W": weight,
               "B": [[empty] * n for _ in range(pp)] if split else bwd}
    works = [by_kind[kind][g % pp][g // pp] for kind in KINDS for g in range(stages)]
    link = [p2p_us if sends(kind, g, pp, n, v) else 0.0 for kind in KINDS for g in range(stages)]
    blocking = [0.0] * len(works) if overlap_p2p else link
    the_plan = plan(pipeline_schedule, pp, n, m)
    starts, ends = _advance(the_plan, [w.total for w in works], blocking, link, overlap_p2p)
    return _finish(_Runs(the_plan, works, blocking, starts, ends), m, **options)


def as_run(fwd: list[list[Work]], bwd: list[list[Work]], m: int, options: dict
           ) -> tuple[list[list[Work]], list[list[Work]]]:
    """A job's forward and backward work per rank and chunk as its schedule runs them (the V's second arm is another
    rank's segment), the backward whole (input and weight parts together); a Megatron job's as they are."""
    schedule = options.get("pipeline_schedule")
    if not schedule:
        return fwd, bwd
    pp, n = len(fwd), len(fwd[0])
    weight = options.get("wgrad")
    run_fwd, run_bwd = [], []
    for r in range(pp):
        row_fwd, row_bwd = [], []
        for c in range(n):
            s, k = segment_of(r, c, pp, schedule)
            w = weight[s][k] if weight else Work()
            row_fwd.append(fwd[s][k])
            row_bwd.append(Work(bwd[s][k].compute + w.compute, bwd[s][k].comm + w.comm, bwd[s][k].other + w.other))
        run_fwd.append(row_fwd)
        run_bwd.append(row_bwd)
    return run_fwd, run_bwd


def simulate_jobs(jobs: list[tuple[list[list[Work]], list[list[Work]], int, dict]]) -> list[Timeline]:
    """`schedule.simulate_many` of the jobs in Megatron's orders and `simulate` of those naming a
    `pipeline_schedule`, in the jobs' order."""
    if not any(options.get("pipeline_schedule") for _, _, _, options in jobs):
        return simulate_many(jobs)
    megatron = [j for j, (_, _, _, options) in enumerate(jobs) if not options.get("pipeline_schedule")]
    out: list = [None] * len(jobs)
    for j, timeline in zip(megatron, simulate_many([jobs[j] for j in megatron])):
        out[j] = timeline
    for j, (fwd, bwd, m, options) in enumerate(jobs):
        if out[j] is None:
            out[j] = simulate(fwd, bwd, m, **options)
    return out
