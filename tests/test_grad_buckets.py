"""Megatron's gradient buckets (predictor.parallel.grad_buckets), as the pinned Megatron-LM cuts them: the default
size max(40M, 1M · dp·cp) elements; `--ddp-bucket-size` and `--ddp-num-buckets`; one bucket per buffer without
`overlap_grad_reduce`, on every pipeline stage but the first and for every model chunk but the first; and the
schedule, where a chunk's buckets are ready with that chunk's last backward. Facts checked: every element of every
chunk is reduced exactly once, the bucket counts Megatron's rule gives, the bytes each collective moves."""
from __future__ import annotations

import pytest

from extractors.jobs.megatron import config_from_argv
from predictor.architecture.params import chunk_params
from predictor.assembly.graph import build_graph
from predictor.parallel.grad_buckets import MIN_ELEMENTS, bucket_elements
from predictor.schedule.pipeline import Work, simulate
from tracekit.core.errors import ConfigError

HW = "A100-SXM4-80GB"
JOB = ("--num-layers 16 --hidden-size 4096 --num-attention-heads 32 --seq-length 2048 --micro-batch-size 1 "
       "--global-batch-size 320 --bf16")


def graph(extra: str, gpus: int = 16):
    c = config_from_argv(f"{JOB} {extra}", {"world_size": gpus})
    return c, build_graph(c, HW, 8)


def dense_buckets(g, stage: int) -> dict[int, list[float]]:
    """Per model chunk, the bytes of each dense bucket's collective on `stage`, in order."""
    out: dict[int, list[float]] = {}
    for o in g.grad_sync[stage]:
        if o.group == "dpcp":
            out.setdefault(o.chunk, []).append(g.specs[o.spec]["bytes"])
    return out


@pytest.mark.parametrize("extra", ["--overlap-grad-reduce", "", "--overlap-grad-reduce --ddp-bucket-size 7000000",
                                   "--overlap-grad-reduce --ddp-num-buckets 5"])
@pytest.mark.parametrize("split", ["--pipeline-model-parallel-size 2",
                                   "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2",
                                   "--tensor-model-parallel-size 2"])
def test_every_gradient_is_reduced_once(extra, split):
    """All-reduce buckets move the chunk's gradients (fp32 main grads under bf16: 4 bytes each) exactly once."""
    c, g = graph(f"{split} {extra}")
    for stage in range(c.pp):
        buckets = dense_buckets(g, stage)
        for chunk in range(c.vp):
            dense, _ = chunk_params(c, stage, chunk)
            assert sum(buckets[chunk]) == pytest.approx(dense * 4)


def test_only_the_first_stages_first_chunk_is_cut_and_only_with_overlap():
    """Megatron: bucket_size None (the whole buffer) without overlap_grad_reduce, off the first pipeline stage and for
    every chunk after the first; else max(40M, 1M · dp·cp) elements (dp·cp = 4 here: the 40M floor)."""
    c, g = graph("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 --overlap-grad-reduce")
    first = dense_buckets(g, 0)
    dense0, _ = chunk_params(c, 0, 0)
    assert len(first[0]) == -(-dense0 // MIN_ELEMENTS) > 1
    assert all(len(first[chunk]) == 1 for chunk in range(1, c.vp))
    assert all(len(sizes) == 1 for sizes in dense_buckets(g, 1).values())
    _, plain = graph("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2")
    assert all(len(sizes) == 1 for stage in (0, 1) for sizes in dense_buckets(plain, stage).values())
    # 160 data-parallel ranks: 1M elements each make a 160M-element bucket
    c, wide = graph("--overlap-grad-reduce", gpus=160)
    dense, _ = chunk_params(c, 0, 0)
    assert max(dense_buckets(wide, 0)[0]) == pytest.approx(160_000_000 * 4)
    assert len(dense_buckets(wide, 0)[0]) == -(-dense // 160_000_000)


def test_the_bucket_flags_set_the_size():
    c, g = graph("--overlap-grad-reduce --ddp-bucket-size 100000000")
    dense, _ = chunk_params(c, 0, 0)
    sizes = dense_buckets(g, 0)[0]
    assert len(sizes) == -(-dense // 100_000_000) and max(sizes) == pytest.approx(100_000_000 * 4)
    _, g = graph("--overlap-grad-reduce --ddp-num-buckets 6")
    assert len(dense_buckets(g, 0)[0]) in (6, 7)  # the rank's parameters // 6 each, and what is left
    # the distributed optimizer reduce-scatters each bucket: 1/dp of it per rank
    c, g = graph("--overlap-grad-reduce --ddp-num-buckets 6 --use-distributed-optimizer")
    assert sum(dense_buckets(g, 0)[0]) == pytest.approx(dense * 4 / c.dp)
    for bad in ("--ddp-bucket-size 0", "--ddp-num-buckets -2"):
        with pytest.raises(ConfigError, match="must be ≥ 1"):
            graph(f"--overlap-grad-reduce {bad}")


def test_a_bucket_holds_at_least_one_parameter_tensor():
    assert bucket_elements(10, 3, 100) == [3, 3, 3, 1]
    assert bucket_elements(10, 1, 4) == [3, 3, 2, 2]  # 10 one-element buckets, but 4 tensors: 4 equal slices
    assert bucket_elements(10, None, 4) == [10] and bucket_elements(0, 3, 4) == []
    _, g = graph("--overlap-grad-reduce --ddp-bucket-size 1")
    from predictor.architecture.tensors import chunk_tensors

    c = g.config
    assert len(dense_buckets(g, 0)[0]) == chunk_tensors(c, 0, 0).tensors


def test_a_chunks_buckets_wait_for_its_last_backward():
    """Interleaved, pp 2 × 2 chunks, 4 micro-batches: chunk 1's one bucket starts when chunk 1's last backward on the
    stage ends, before chunk 0's; chunk 0's two buckets are ready half-way through and at the end of its own."""
    pp, vp, m = 2, 2, 4
    fwd = [[Work(1.0)] * vp for _ in range(pp)]
    bwd = [[Work(2.0)] * vp for _ in range(pp)]
    buckets = [[0.5, 0.5, 0.25], [0.5]]
    tl = simulate(fwd, bwd, m, grad_buckets_us=buckets, grad_bucket_chunks=[[0, 0, 1], [1]], overlap_grad=True)
    for stage in range(pp):
        last = {t.chunk: t for t in tl.tasks[stage] if t.kind == "B"}
        spans = tl.tails[stage].sync_intervals
        chunks = [[0, 0, 1], [1]][stage]
        for (start, end), chunk, dur in zip(spans, chunks, buckets[stage]):
            assert end - start == pytest.approx(dur)
            assert start >= last[chunk].start + (last[chunk].end - last[chunk].start) / 2 - 1e-9
        if stage == 0:
            assert spans[2][0] == pytest.approx(last[1].end) and last[1].end < last[0].end
            assert spans[0][0] == pytest.approx((last[0].start + last[0].end) / 2)
    # the same buckets all of chunk 0: each waits for chunk 0's last backward, later than chunk 1's would
    late = simulate(fwd, bwd, m, grad_buckets_us=buckets, grad_bucket_chunks=[[0, 0, 0], [0]], overlap_grad=True)
    assert late.tails[0].sync_intervals[2][0] > tl.tails[0].sync_intervals[2][0]
