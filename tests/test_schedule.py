"""Pipeline schedule facts computed by hand (Narayanan et al. 2021; Megatron's schedules.py)."""
from __future__ import annotations

import pytest

from predictor.schedule import Work, simulate, stage_order


def uniform(pp: int, vp: int, f: float, b: float):
    return [[Work(f)] * vp for _ in range(pp)], [[Work(b)] * vp for _ in range(pp)]


@pytest.mark.parametrize("pp, m", [(2, 4), (4, 8), (4, 4), (8, 32)])
def test_1f1b_bubble_share(pp, m):
    fwd, bwd = uniform(pp, 1, 1.0, 2.0)
    tl = simulate(fwd, bwd, m)
    assert tl.iteration_us == pytest.approx((m + pp - 1) * 3.0)
    assert tl.breakdown_us["pipeline_bubble"] / tl.iteration_us == pytest.approx((pp - 1) / (m + pp - 1))
    assert tl.breakdown_us["compute"] == pytest.approx(m * 3.0)


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
