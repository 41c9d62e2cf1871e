"""Pipeline schedule facts computed by hand (Narayanan et al. 2021; Megatron's schedules.py)."""
from __future__ import annotations

import pytest

from predictor.schedule.pipeline import Work, simulate, stage_order


def uniform(pp: int, vp: int, f: float, b: float):
    return [[Work(f)] * vp for _ in range(pp)], [[Work(b)] * vp for _ in range(pp)]


@pytest.mark.parametrize("pp, m", [(2, 4), (4, 8), (4, 4), (8, 32)])
def test_1f1b_bubble_share(pp, m):
    fwd, bwd = uniform(pp, 1, 1.0, 2.0)
    tl = simulate(fwd, bwd, m)
    assert tl.iteration_us == pytest.approx((m + pp - 1) * 3.0)
    assert tl.breakdown_us["pipeline_bubble"] / tl.iteration_us == pytest.approx((pp - 1) / (m + pp - 1))
    assert tl.breakdown_us["compute"] == pytest.approx(m * 3.0)


@pytest.mark.parametrize("m", [3, 7, 11])
def test_one_stage_has_no_bubble_not_even_rounding(m):
    """pp = 1 never waits: the bubble (what the parts leave of the iteration) is exactly 0, not the 1e-15 µs the
    float sums of these parts leave over (checked by hand: 7 micro-batches of these works leave 3.6e-15)."""
    tl = simulate([[Work(0.7, 0.1, 0.05)]], [[Work(1.4, 0.1, 0.05)]], m)
    assert tl.breakdown_us["pipeline_bubble"] == 0.0
    assert sum(tl.breakdown_us.values()) == pytest.approx(tl.iteration_us, rel=1e-12)


@pytest.mark.parametrize("pp, vp, m", [(4, 2, 8), (4, 4, 16), (2, 3, 4)])
def test_interleaving_divides_bubble_by_vp(pp, vp, m):
    f, b = 1.0, 2.0  # per stage and micro-batch; each chunk does 1/vp of it
    fwd, bwd = uniform(pp, vp, f / vp, b / vp)
    tl = simulate(fwd, bwd, m)
    assert tl.breakdown_us["pipeline_bubble"] == pytest.approx((pp - 1) * (f + b) / vp)
    assert tl.iteration_us == pytest.approx(m * (f + b) + (pp - 1) * (f + b) / vp)


@pytest.mark.parametrize("pp, m", [(4, 8), (8, 16), (4, 2)])
def test_warmup_forwards(pp, m):
    for rank in range(pp):
        order = stage_order(rank, pp, 1, m)
        first_b = [k for k, _, _ in order].index("B")
        assert first_b == min(pp - rank - 1, m) + (1 if m > pp - rank - 1 else 0)
        assert sorted(i for k, i, _ in order if k == "F") == list(range(m))
        assert sorted(i for k, i, _ in order if k == "B") == list(range(m))


def test_interleaved_order_covers_every_chunk_once():
    pp, vp, m = 4, 2, 8
    for rank in range(pp):
        order = stage_order(rank, pp, vp, m)
        assert sorted((i, c) for k, i, c in order if k == "F") == [(i, c) for i in range(m) for c in range(vp)]
        assert sorted((i, c) for k, i, c in order if k == "B") == [(i, c) for i in range(m) for c in range(vp)]
        # Megatron's warm-up: (pp − rank − 1)·2 + (vp − 1)·pp forwards before the first backward
        assert [k for k, _, _ in order].index("B") == (pp - rank - 1) * 2 + (vp - 1) * pp + 1


def test_p2p_transfers_lengthen_the_pipeline():
    pp, m, p2p = 4, 8, 0.5
    fwd, bwd = uniform(pp, 1, 1.0, 2.0)
    tl = simulate(fwd, bwd, m, p2p_us=p2p)
    # each of the pp−1 hops costs one transfer on the way down and one on the way up; the middle stages also
    # pay their own sends in steady state: the last stage's start is (pp−1)·(1+p2p) after stage 0's first forward
    first_b_last = [t for t in tl.tasks[pp - 1] if t.kind == "B"][0]
    assert first_b_last.start == pytest.approx((pp - 1) * (1.0 + p2p) + 1.0)
    assert tl.iteration_us > (m + pp - 1) * 3.0


def test_grad_sync_overlap_and_optimizer_barrier():
    pp, m = 2, 4
    fwd, bwd = uniform(pp, 1, 1.0, 2.0)
    buckets = [[1.0, 1.0], [1.0, 1.0]]
    plain = simulate(fwd, bwd, m, grad_buckets_us=buckets, optimizer_us=[3.0, 1.0])
    assert plain.iteration_us == pytest.approx((m + pp - 1) * 3.0 + 2.0 + 3.0)
    overlapped = simulate(fwd, bwd, m, grad_buckets_us=buckets, overlap_grad=True, optimizer_us=[3.0, 1.0])
    # bucket 0 ready half-way through the last backward (t−1), runs to t; bucket 1 ready at t, ends at t+1
    assert overlapped.iteration_us == pytest.approx((m + pp - 1) * 3.0 + 1.0 + 3.0)
    assert sum(plain.breakdown_us.values()) == pytest.approx(plain.iteration_us)


def _reference(fwd, bwd, m, p2p, overlap, edges_block=False):
    """The schedule as the docstring states it, one task at a time: a stage runs its tasks in Megatron's order; a
    task waits for its stage and for its input (the previous stage's forward / next stage's backward of the same
    micro-batch and chunk, across the chunk boundary between the last and the first stage, and the last chunk's
    own forward), and ends after its work and, unless overlapped, its P2P send; with `edges_block` the warm-up
    forwards (before the stage's first backward) and the flush backwards (after its last forward) send blocking."""
    pp, vp = len(fwd), len(fwd[0])
    orders = [stage_order(s, pp, vp, m) for s in range(pp)]
    edge = {}
    for s, order in enumerate(orders):
        kinds = [k for k, _, _ in order]
        first_b, last_f = kinds.index("B"), len(kinds) - 1 - kinds[::-1].index("F")
        for k, (kind, i, c) in enumerate(order):
            edge[(kind, s, c, i)] = (kind == "F" and k < first_b) or (kind == "B" and k > last_f)
    arrival, rows, pos, clock = {}, [[] for _ in range(pp)], [0] * pp, [0.0] * pp

    def needs(kind, s, c, i):
        if kind == "F":
            return ("F", s - 1, c, i) if s > 0 else ("F", pp - 1, c - 1, i) if c > 0 else None
        return ("B", s + 1, c, i) if s < pp - 1 else ("B", 0, c + 1, i) if c < vp - 1 else ("F", s, c, i)

    while any(pos[s] < len(orders[s]) for s in range(pp)):
        for s in range(pp):
            while pos[s] < len(orders[s]):
                kind, i, c = orders[s][pos[s]]
                dep = needs(kind, s, c, i)
                if dep is not None and dep not in arrival:
                    break
                sends = pp > 1 and not ((kind == "F" and s == pp - 1 and c == vp - 1) or
                                        (kind == "B" and s == 0 and c == 0))
                send = p2p if sends else 0.0
                start = max(clock[s], arrival[dep] if dep else 0.0)
                work = (fwd if kind == "F" else bwd)[s][c].total
                blocks = not overlap or (edges_block and edge[(kind, s, c, i)])
                clock[s] = start + work + (send if blocks else 0.0)
                arrival[(kind, s, c, i)] = clock[s] + (0.0 if blocks else send)
                rows[s].append((kind, c, i, start, clock[s]))
                pos[s] += 1
    return rows


SHAPES = [(1, 1, 6), (2, 1, 5), (4, 1, 8), (4, 1, 2), (4, 2, 8), (3, 3, 6), (8, 1, 3), (4, 4, 4), (16, 1, 20),
          (6, 2, 12)]


@pytest.mark.parametrize("path", ["one by one", "arrays"])
def test_fast_simulation_equals_the_reference_exactly(monkeypatch, path):
    """Both ways the pipeline is simulated (task by task, and several configurations as arrays one dependency level
    at a time) give every task's start and end exactly as the reference does, on non-uniform stages and chunks
    (first and last stages heavier, as embedding and loss make them), with and without P2P time and overlap."""
    import random

    from predictor.schedule import pipeline as schedule

    monkeypatch.setattr(schedule, "VECTOR_MIN", 1 if path == "arrays" else 10 ** 9)
    rng = random.Random(7)
    for pp, vp, m in SHAPES:
        jobs = []
        for _ in range(3):
            fwd = [[Work(rng.uniform(0.5, 3), rng.uniform(0, 1), rng.uniform(0, 0.2)) for _ in range(vp)]
                   for _ in range(pp)]
            bwd = [[Work(rng.uniform(1, 6), rng.uniform(0, 2), rng.uniform(0, 0.2)) for _ in range(vp)]
                   for _ in range(pp)]
            options = {"p2p_us": rng.choice([0.0, rng.uniform(0.01, 1.5)]), "overlap_p2p": rng.random() < 0.5,
                       "p2p_edges_block": rng.random() < 0.5,
                       "grad_buckets_us": [[rng.uniform(0, 2) for _ in range(rng.randint(0, 4))] for _ in range(pp)],
                       "overlap_grad": rng.random() < 0.5, "optimizer_us": [rng.uniform(1, 2) for _ in range(pp)]}
            jobs.append((fwd, bwd, m, options))
        for (fwd, bwd, m_, options), timeline in zip(jobs, schedule.simulate_many(jobs)):
            expected = _reference(fwd, bwd, m_, options["p2p_us"], options["overlap_p2p"],
                                  options["p2p_edges_block"])
            got = [[(t.kind, t.chunk, t.microbatch, t.start, t.end) for t in row] for row in timeline.tasks]
            assert got == expected, (pp, vp, m)
            assert [t.busy_end for t in timeline.tails] == [row[-1][4] for row in expected]
            alone = simulate(fwd, bwd, m_, **options)  # the same job by itself
            assert alone.iteration_us == timeline.iteration_us and alone.breakdown_us == timeline.breakdown_us


def test_interleaved_groups_follow_megatrons_table():
    """Megatron's documented orders (model_parallel_config.py, microbatch_group_size_per_vp_stage): PP=2 VP=2 with
    groups of 2 and 4 micro-batches runs forwards 0 1 0 1 2 3 2 3; groups of 3 and 5 micro-batches 0 1 2 0 1 2 3 4 3
    4; and the default group (pp) is the depth-first order the schedule used before groups existed."""
    from predictor.schedule.pipeline import schedule_table

    assert [i for i, _ in schedule_table(4, 2, 2)] == [0, 1, 0, 1, 2, 3, 2, 3]
    assert [i for i, _ in schedule_table(5, 2, 3)] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in schedule_table(5, 2, 3)] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    for pp, vp, m in ((2, 2, 4), (4, 3, 8), (4, 2, 12)):
        old = [((k // (pp * vp)) * pp + k % pp, (k % (pp * vp)) // pp) for k in range(m * vp)]
        assert schedule_table(m, vp, pp) == old
    # every (micro-batch, chunk) once, forward and backward, on every stage, whatever the group
    for rank in range(4):
        order = stage_order(rank, 4, 2, 5, 5)
        assert sorted((i, c) for k, i, c in order if k == "F") == [(i, c) for i in range(5) for c in range(2)]
        assert sorted((i, c) for k, i, c in order if k == "B") == [(i, c) for i in range(5) for c in range(2)]


def test_a_five_microbatch_interleaved_run_simulates():
    """The CI case Megatron runs with pp 4, one layer per virtual stage and groups of 5 (5 micro-batches): Megatron
    accepts it, so the simulation must run it, and its bubble lies between the 1F1B one and none."""
    work = [[Work(compute=10.0)] * 2 for _ in range(4)]
    back = [[Work(compute=20.0)] * 2 for _ in range(4)]
    grouped = simulate(work, back, 5, microbatch_group=5)
    busy = 5 * 2 * 30.0
    assert busy < grouped.iteration_us < busy + 3 * 2 * 30.0


def test_megatrons_warmup_and_flush_sends_block_unless_it_overlaps_them_too():
    """The interleaved schedule overlaps P2P in its steady state; its warm-up forwards and flush backwards wait for
    their sends unless --overlap-p2p-communication-warmup-flush: between fully overlapped and fully blocking, the
    exposed communication is the edge tasks' sends, and the steady state's forwards send for free."""
    pp, vp, m, p2p = 4, 2, 16, 1.0
    fwd, bwd = uniform(pp, vp, 0.5, 1.0)
    free = simulate(fwd, bwd, m, p2p_us=p2p, overlap_p2p=True)
    edges = simulate(fwd, bwd, m, p2p_us=p2p, overlap_p2p=True, p2p_edges_block=True)
    blocking = simulate(fwd, bwd, m, p2p_us=p2p)
    assert free.iteration_us < edges.iteration_us < blocking.iteration_us
    for s, row in enumerate(edges.tasks):
        kinds = [t.kind for t in row]
        first_b, last_f = kinds.index("B"), len(kinds) - 1 - kinds[::-1].index("F")
        sends_forward = [t for k, t in enumerate(row) if t.kind == "F" and not (s == pp - 1 and t.chunk == vp - 1)]
        assert all(t.send == p2p for k, t in enumerate(row) if t.kind == "F" and k < first_b
                   and not (s == pp - 1 and t.chunk == vp - 1))
        assert all(t.send == 0.0 for k, t in enumerate(row) if first_b < k < last_f and t.kind == "F")
        assert sends_forward
    sends = sum(t.send for t in edges.tasks[edges.critical_stage])
    assert edges.breakdown_us["exposed_communication"] == pytest.approx(sends)


def test_overlapping_the_warmup_and_flush_needs_the_interleaved_overlap():
    """Megatron's model_parallel_config refuses --overlap-p2p-communication-warmup-flush without the interleaved
    schedule's P2P overlap (1F1B batches its P2P; --no-overlap-p2p-communication turns it off)."""
    from extractors.jobs.megatron import config_from_argv
    from tracekit.core.errors import ConfigError

    base = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --micro-batch-size 1 "
            "--global-batch-size 16 --pipeline-model-parallel-size 2 --bf16 --overlap-p2p-communication-warmup-flush")
    for extra in ("", "--num-layers-per-virtual-pipeline-stage 2 --no-overlap-p2p-communication"):
        with pytest.raises(ConfigError, match="only compatible with overlap_p2p_comm"):
            config_from_argv(f"{base} {extra}", {"world_size": 8}).validate()
    c = config_from_argv(f"{base} --num-layers-per-virtual-pipeline-stage 2", {"world_size": 8}).validate()
    assert c.run.overlap_p2p_comm_warmup_flush
