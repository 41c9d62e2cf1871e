"""Megatron's `--defer-embedding-wgrad-compute` (tracekit.core.runtime.deferred_share, predictor.schedule.stage_work,
predictor.memory.stages): the last pipeline stage keeps each deferred output-layer call's input and output gradient
and computes their weight gradients in the pipeline flush. Facts: Megatron's refusals (model_parallel_config.py), the
buffers' bytes ([s, b, h/tp] and [s, b, V/tp] in bf16 per call), the weight-gradient GEMM's FLOPs against the GPU's
peak, and the work moved rather than added."""
from __future__ import annotations

import json

import pytest

from extractors.jobs.megatron import config_from_argv
from predictor import ModelSet, predict_iteration
from predictor.memory.stages import stage_memory
from predictor.report.trace_out import rank_trace
from predictor.schedule.stage_work import deferred_wgrad_us
from tracekit.core.cluster import preset
from tracekit.core.errors import ConfigError
from tracekit.core.hardware import hardware_spec

HW = "H100-80GB-HBM3"
S, B, H, V, TP, M = 4096, 1, 2048, 128000, 2, 32
#: A pipeline whose last stage is the busiest (a 128k vocabulary's output layer and loss beside its layers).
JOB = (f"--num-layers 8 --hidden-size {H} --num-attention-heads 16 --seq-length {S} --max-position-embeddings {S} "
       f"--micro-batch-size {B} --global-batch-size {M} --pipeline-model-parallel-size 2 "
       f"--tensor-model-parallel-size {TP} --sequence-parallel --bf16 --vocab-size {V} "
       "--make-vocab-size-divisible-by 128")


def config(extra: str = ""):
    return config_from_argv(f"{JOB} {extra}", {"world_size": 4})


@pytest.fixture(scope="module")
def models():
    return ModelSet.load(None)


@pytest.mark.parametrize("extra, words", [
    ("--defer-embedding-wgrad-compute --pipeline-model-parallel-size 1",
     "Cannot defer embedding wgrad compute when pipeline model parallel is not used"),
    ("--defer-embedding-wgrad-compute --no-gradient-accumulation-fusion",
     "Cannot defer embedding wgrad compute when gradient accumulation fusion is not used"),
    ("--defer-embedding-wgrad-compute --wgrad-deferral-limit -1", "greater than or equal to 0"),
])
def test_megatron_refuses_it_where_it_does(extra, words):
    with pytest.raises(ConfigError, match=words):
        config(extra).validate()


def test_the_buffers_are_each_deferred_calls_input_and_output_gradient():
    plain, every, four = (stage_memory(config(x), HW) for x in (
        "", "--defer-embedding-wgrad-compute", "--defer-embedding-wgrad-compute --wgrad-deferral-limit 4"))
    per_call = S * B * (H / TP + V / TP) * 2 / 1e9  # GB: the SP-sharded input and the vocabulary-parallel gradient
    assert every[1]["activations"] - plain[1]["activations"] == pytest.approx(M * per_call)
    assert four[1]["activations"] - plain[1]["activations"] == pytest.approx(4 * per_call)
    assert every[0] == plain[0]  # only the stage with the output layer keeps them


def test_the_weight_gradients_move_to_the_flush_and_the_busiest_stage_gets_lighter(models):
    cluster = preset("dgx-h100")
    plain = predict_iteration(config(), cluster, models)
    deferred = predict_iteration(config("--defer-embedding-wgrad-compute"), cluster, models)
    drain = deferred.timeline.tails[1].drain_us
    # one [h, s·b] × [s·b, V/tp] weight-gradient GEMM per micro-batch, never faster than the dense bf16 peak
    peak = hardware_spec(HW).peak_tflops("bf16") * 1e6  # FLOPs per µs
    assert drain == pytest.approx(deferred_wgrad_us(deferred.graph, deferred.durations_us))
    assert drain >= M * 2 * S * B * H * (V / TP) / peak
    # the work moves, none is added: the last stage's compute is the same, the steady state lighter
    assert deferred.breakdown["compute"] == pytest.approx(plain.breakdown["compute"])
    assert plain.timeline.critical_stage == deferred.timeline.critical_stage == 1
    assert deferred.iteration_time_s < plain.iteration_time_s


def test_the_predicted_trace_runs_the_flush_after_the_last_backward(models):
    prediction = predict_iteration(config("--defer-embedding-wgrad-compute"), preset("dgx-h100"), models)
    tail = prediction.timeline.tails[1]
    doc = rank_trace(prediction, 2, 1)  # rank 2: the first of the last stage (tp 2)
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    wgrad = [[V // TP, S * B], [S * B, H]]  # the output layer's weight gradient: dYᵀ · X
    launch = max((e for e in ops if e["name"] == "aten::mm" and e["args"].get("Input Dims") == wgrad),
                 key=lambda e: e["ts"])
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    flush = next(e for e in kernels if e["args"].get("External id") == launch["args"].get("External id"))
    assert flush["dur"] == pytest.approx(tail.drain_us, rel=1e-6)
    before = [e["ts"] + e["dur"] for e in kernels if e["ts"] < flush["ts"] and not e["name"].startswith("nccl")]
    assert flush["ts"] >= max(before) - 1e-3  # after the stage's last backward kernel
    json.dumps(doc)  # the document serialises
