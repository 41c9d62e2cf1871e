"""PyTorch's zero-bubble pipeline schedules (predictor.schedule.zero_bubble), checked by the physics of a pipeline:
every task of every (stage, micro-batch) runs once on the rank its placement names, never before what it waits on, the
split backward does the same work as the whole one, and filling the bubble with weight gradients shortens the iteration
against 1F1B's known bubble of (pp − 1)·(F + B). The placements are written out here from PyTorch's definitions
(loop: stage g on rank g mod pp; V: rank r holds stages r and 2·pp − 1 − r), not read from the code."""
from __future__ import annotations

from collections import Counter

import pytest

from predictor.schedule.pipeline import Work, simulate
from predictor.schedule.zero_bubble import simulate as simulate_zb
from tracekit.core.errors import ConfigError

SPLIT = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
V = ("ZBVZeroBubble", "DualPipeV")


def _global_stage(schedule: str, rank: int, chunk: int, pp: int) -> int:
    if schedule in V:
        return rank if chunk == 0 else 2 * pp - 1 - rank
    return chunk * pp + rank


def _works(pp: int, n: int, value) -> list[list[Work]]:
    return [[Work(value(r, c)) for c in range(n)] for r in range(pp)]


def _run(schedule: str, pp: int, m: int, f=1.0, i=1.0, w=1.0, p2p=0.0):
    """The timeline with uneven stage costs (so that waiting matters) unless constants are given."""
    n = 2
    fwd = _works(pp, n, lambda r, c: f * (1 + 0.1 * r + 0.05 * c))
    inp = _works(pp, n, lambda r, c: i * (1 + 0.07 * ((r + c) % 3)))
    wgt = _works(pp, n, lambda r, c: w * (1 - 0.05 * r))
    if schedule == "LoopedBFS":  # the whole backward
        inp = _works(pp, n, lambda r, c: (i + w) * (1 + 0.07 * ((r + c) % 3)))
        wgt = None
    return simulate_zb(fwd, inp, m, pipeline_schedule=schedule, wgrad=wgt, p2p_us=p2p)


CASES = [(s, pp, m) for s in ("LoopedBFS", *SPLIT) for pp, m in ((2, 4), (3, 6), (4, 8), (4, 12), (4, 3))
         if not (s == "DualPipeV" and m < 2 * pp)]


@pytest.mark.parametrize("schedule, pp, m", CASES)
def test_each_rank_runs_each_stage_and_microbatch_once_per_kind(schedule, pp, m):
    tl = _run(schedule, pp, m)
    kinds = ("F", "I", "W") if schedule in SPLIT else ("F", "B")
    for rank, tasks in enumerate(tl.tasks):
        seen = Counter((t.kind, _global_stage(schedule, rank, t.chunk, pp), t.microbatch) for t in tasks)
        assert set(seen.values()) == {1}
        held = {rank, 2 * pp - 1 - rank} if schedule in V else {rank, rank + pp}
        assert set(seen) == {(k, g, i) for k in kinds for g in held for i in range(m)}


@pytest.mark.parametrize("schedule, pp, m", CASES)
def test_every_task_starts_after_what_it_waits_on(schedule, pp, m):
    tl = _run(schedule, pp, m, p2p=0.3)
    stages = 2 * pp
    span = {}
    for rank, tasks in enumerate(tl.tasks):
        previous_end = 0.0
        for t in tasks:  # one rank runs one task at a time, in its order
            assert t.start >= previous_end - 1e-9
            previous_end = t.end
            kind = "I" if t.kind == "B" else t.kind
            span[kind, _global_stage(schedule, rank, t.chunk, pp), t.microbatch] = \
                (t.start, t.end)
    for (kind, g, i), (start, _) in span.items():
        if kind == "F" and g > 0:
            waits = [("F", g - 1, i)]
        elif kind == "I":
            waits = [("I", g + 1, i)] if g < stages - 1 else [("F", g, i)]
        elif kind == "W":
            waits = [("I", g, i)]
        else:
            waits = []
        for dep in waits:
            assert start >= span[dep][1] - 1e-9, (kind, g, i, dep)


def test_split_backward_fills_1f1b_bubble():
    """Equal F, I and W (B = I + W): 1F1B idles (pp − 1)·(F + B) per rank; ZB-H1-style orders (the interleaved
    zero-bubble order with one stage per rank) fill it with weight gradients, and ZB-V beats the interleaved
    1F1B of the same two stages per rank. Neither can beat the rank's own work."""
    pp, m = 4, 8
    one = [[Work(1.0)] for _ in range(pp)]
    two = [[Work(2.0)] for _ in range(pp)]
    megatron = simulate(one, two, m).iteration_us
    assert megatron == pytest.approx(m * 3 + (pp - 1) * 3)
    zb = simulate_zb(one, one, m, pipeline_schedule="InterleavedZeroBubble", wgrad=one).iteration_us
    assert m * 3 <= zb < megatron
    one2 = [[Work(1.0)] * 2 for _ in range(pp)]
    two2 = [[Work(2.0)] * 2 for _ in range(pp)]
    interleaved = simulate(one2, two2, m).iteration_us
    zbv = simulate_zb(one2, one2, m, pipeline_schedule="ZBVZeroBubble", wgrad=one2).iteration_us
    assert 2 * m * 3 <= zbv < interleaved
    assert zbv - 2 * m * 3 < (interleaved - 2 * m * 3) / 2  # ZB-V: less than half the interleaved bubble


def test_pytorch_limits_are_refused_naming_the_schedule():
    one = [[Work(1.0)] * 2 for _ in range(4)]
    with pytest.raises(ConfigError, match="DualPipeV needs at least as many micro-batches as stages"):
        simulate_zb(one, one, 6, pipeline_schedule="DualPipeV", wgrad=one)
    with pytest.raises(ConfigError, match="did you mean 'ZBVZeroBubble'"):
        simulate_zb(one, one, 8, pipeline_schedule="ZBVZeroBuble", wgrad=one)
    three = [[Work(1.0)] * 3 for _ in range(4)]
    with pytest.raises(ConfigError, match="exactly two stages per rank"):
        simulate_zb(three, three, 8, pipeline_schedule="ZBVZeroBubble", wgrad=three)


TOML = ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 8\nseq_len = 2048\n'
        '[parallelism]\npipeline_parallel_degree = 4\npipeline_parallel_schedule = "{}"\n')


@pytest.fixture(scope="module")
def torchtitan_predictions(tmp_path_factory):
    from extractors.jobs.torchtitan import read_torchtitan
    from predictor.costs.learned.models import ModelSet
    from predictor.predict import predict_many
    from tracekit.core.cluster import Cluster
    from tracekit.core.config import TrainingConfig

    folder = tmp_path_factory.mktemp("jobs")
    names = ("Interleaved1F1B", "ZBVZeroBubble", "InterleavedZeroBubble")
    configs = []
    for name in names:
        job = folder / f"{name}.toml"
        job.write_text(TOML.format(name))
        configs.append(TrainingConfig.from_mapping(read_torchtitan(job, world_size=8).settings).validate())
    out = predict_many(configs, Cluster("H100-80GB-HBM3", gpus_per_node=8), ModelSet.load(None))
    return dict(zip(names, out))


def test_torchtitan_zero_bubble_jobs_are_predicted_and_not_slower_than_interleaved_1f1b(torchtitan_predictions):
    p = torchtitan_predictions
    twin = p["Interleaved1F1B"]
    for name in ("ZBVZeroBubble", "InterleavedZeroBubble"):
        assert p[name].iteration_time_s <= twin.iteration_time_s, name
        assert p[name].breakdown["pipeline_bubble"] < twin.breakdown["pipeline_bubble"], name


def test_split_backward_does_the_whole_backward_work(torchtitan_predictions):
    """Input and weight parts together compute what the whole backward computes, stage by stage of the model
    (the V places the stages on other ranks: compared as the multiset of stage costs)."""
    twin = torchtitan_predictions["Interleaved1F1B"]
    for name in ("ZBVZeroBubble", "InterleavedZeroBubble"):
        p = torchtitan_predictions[name]
        for index in (0, 1):  # forward, backward
            ours = sorted(w.compute for row in p.work[index] for w in row)
            theirs = sorted(w.compute for row in twin.work[index] for w in row)
            assert ours == pytest.approx(theirs, rel=1e-9), (name, index)
        assert p.breakdown["compute"] > 0


def test_predicted_trace_of_a_v_schedule_runs_one_kernel_at_a_time_within_the_iteration(torchtitan_predictions):
    """Each rank's predicted trace (the V's second arm is another layout stage than Megatron's chunk) lays its
    compute kernels one after another, inside one iteration."""
    from predictor.report.trace_out import rank_trace

    p = torchtitan_predictions["ZBVZeroBubble"]
    c = p.config
    for stage in range(c.pp):
        rank = stage * c.tp * c.cp * c.dp
        events = [e for e in rank_trace(p, rank, iterations=1)["traceEvents"]
                  if e.get("ph") == "X" and e.get("cat") == "kernel" and "nccl" not in e["name"].lower()]
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events)
        assert spans
        assert all(b[0] >= a[1] - 1e-6 for a, b in zip(spans, spans[1:]))
        assert spans[-1][1] - spans[0][0] <= p.iteration_time_s * 1e6 + 1e-6


def _zbv_config(tmp_path):
    from extractors.jobs.torchtitan import read_torchtitan
    from tracekit.core.config import TrainingConfig

    job = tmp_path / "zbv.toml"
    job.write_text(TOML.format("ZBVZeroBubble"))
    return TrainingConfig.from_mapping(read_torchtitan(job, world_size=8).settings).validate()


@pytest.mark.parametrize("roles", [(), ("gemm",)])
def test_weight_part_is_the_gemms_weight_gradients(tmp_path, roles):
    """With the GEMM backward held per role, the weight part is exactly the wgrad rows: one forward's FLOPs per
    GEMM, so the weight part's FLOPs equal the layer GEMMs' forward FLOPs. Held whole, each GEMM backward is split
    in two halves. Either way the two parts add up to the whole backward for any operator durations."""
    import numpy as np

    from predictor.assembly.graph import build_graph
    from predictor.schedule.stage_work import split_backward

    graph = build_graph(_zbv_config(tmp_path), "H100-80GB-HBM3", 8, backward_roles=roles)
    dur = np.random.default_rng(0).uniform(1.0, 10.0, len(graph.specs))
    split, parts = split_backward(graph, dur)
    for s in range(graph.config.pp):
        for k in range(graph.config.vp):
            seg = graph.segment(s, k)
            inp, wgt = parts[s][k]
            whole = sum(o.count * dur[o.spec] for o in seg.bwd)
            assert sum(o.count * split[o.spec] for o in inp + wgt) == pytest.approx(whole, rel=1e-12)
            gemm_fwd = sum(o.count * o.flops for o in seg.fwd if graph.specs[o.spec]["primitive"] == "gemm")
            assert all(graph.specs[o.spec]["primitive"] == "gemm" for o in wgt)
            if roles:
                assert {graph.specs[o.spec]["role"] for o in wgt} <= {"wgrad", "bgrad"}
                assert sum(o.count * o.flops for o in wgt) == pytest.approx(gemm_fwd, rel=1e-12)
            else:  # each whole GEMM backward (2 forwards' FLOPs) in both parts at half its time
                assert sum(o.count * o.flops for o in wgt) == pytest.approx(2 * gemm_fwd, rel=1e-12)
                assert all(split[o.spec] == pytest.approx(dur[o.spec] / 2) for o in wgt)
