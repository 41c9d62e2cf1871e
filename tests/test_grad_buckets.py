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
from predictor.costs.physics.roofline import MEMORY_EFFICIENCY
from predictor.parallel.grad_buckets import MIN_ELEMENTS, bucket_elements
from predictor.schedule.framework_costs import pass_costs
from predictor.schedule.pipeline import Work, simulate
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError
from tracekit.core.hardware import hardware_spec

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


# -- the in-place scaling of the gradient buffers -------------------------------------------------------------------
def scaling_us(extra: str, gpus: int = 16, hw: str = HW) -> float:
    """Device µs of stage 0's per-iteration passes (pass_costs), where the gradient buffers' scaling is priced (the
    result checks' norm read, a pass of its own, left out: tests/test_result_checks.py)."""
    c = config_from_argv(f"{JOB} {extra} --no-check-for-nan-in-loss-and-grad", {"world_size": gpus})
    return pass_costs(build_graph(c, hw, 8)).iteration_device_us[0]


def gpt_params(tp: int) -> float:
    """Parameters one GPU of tensor-parallel size `tp` holds of JOB's model (16 layers, h 4096, learned positions,
    tied output layer, vocabulary 50257 padded to 128·tp): a layer's QKV, projection and MLP weights (12h²), the
    column-parallel layers' biases (QKV 3h, FC1 4h: split) and the row-parallel ones' (projection and FC2: whole),
    its two LayerNorms, then the word and position embeddings and the final norm."""
    h, layers = 4096, 16
    vocab = -(-50257 // (128 * tp)) * 128 * tp
    per_layer = 12 * h * h / tp + (3 * h + 4 * h) / tp + (h + h) + 2 * 2 * h
    return layers * per_layer + vocab * h / tp + 2048 * h + 2 * h


@pytest.mark.parametrize("tp", [1, 2])
def test_megatrons_ddp_scales_every_gradient_once_before_reducing(tp):
    """By default each bucket is multiplied by 1/(dp·cp) before its collective: a read and a write of every fp32
    gradient the GPU holds. With --ddp-average-in-collective the collective averages and nothing is scaled; with one
    data-parallel rank the factor is 1 and Megatron skips it."""
    split = f"--tensor-model-parallel-size {tp}"
    default, averaged = scaling_us(split), scaling_us(f"{split} --ddp-average-in-collective")
    bandwidth = hardware_spec(HW).mem_bw_gbs * 1e3 * MEMORY_EFFICIENCY  # bytes per µs
    assert (default - averaged) * bandwidth == pytest.approx(2 * 4 * gpt_params(tp), rel=1e-3)
    assert scaling_us(split, gpus=tp) == pytest.approx(averaged)  # dp 1: nothing to scale


def test_a_per_token_loss_scales_after_the_reduction_even_on_one_rank():
    """--calculate-per-token-loss: no scaling before the collective, every buffer divided by the token count after
    it (finalize_model_grads), whatever the data-parallel size."""
    one = scaling_us("", gpus=1)
    assert scaling_us("--calculate-per-token-loss", gpus=1) > one
    assert scaling_us("--calculate-per-token-loss") == pytest.approx(scaling_us(""))
    with pytest.raises(ConfigError, match="refuses --ddp-average-in-collective with --calculate-per-token-loss"):
        config_from_argv(f"{JOB} --calculate-per-token-loss --ddp-average-in-collective", {"world_size": 16}).validate()


def test_averaging_in_the_collective_still_scales_the_expert_buffers():
    """With expert parallelism the expert buffers are reduced over fewer ranks (edp 4) than the dense ones (dp·cp
    16): averaged in the collective, they are still scaled by edp/(dp·cp) before it, and only they; without expert
    parallelism both are reduced over the same ranks and nothing is scaled."""
    moe = "--num-experts 8 --moe-router-topk 2 --ddp-average-in-collective"
    c = config_from_argv(f"{JOB} {moe} --expert-model-parallel-size 4", {"world_size": 16})
    _, expert = chunk_params(c, 0, 0)
    bandwidth = hardware_spec(HW).mem_bw_gbs * 1e3 * MEMORY_EFFICIENCY
    assert expert > 0
    assert scaling_us(f"{moe} --expert-model-parallel-size 4") * bandwidth == pytest.approx(2 * 4 * expert, rel=1e-3)
    assert scaling_us(moe) == 0


@pytest.mark.parametrize("key", ["calculate_per_token_loss", "ddp_average_in_collective"])
def test_the_scaling_switches_take_true_or_false_only(key):
    job = {"num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 1024, key: "maybe"}
    with pytest.raises(ConfigError, match=f"{key}: 'maybe' is not true or false"):
        TrainingConfig.from_mapping(job, strict=True)
