"""A column-parallel linear's backward collectives run beside its own GEMMs (predictor.schedule.tp_overlap): Megatron's
`LinearWithGradAccumulationAndAsyncCommunication` and Transformer Engine's linear issue the input gradient's
all-reduce (with sequence parallelism its reduce-scatter) before the weight-gradient GEMM and wait after it, and
sequence parallelism's re-gather of the input before the input-gradient GEMM. Facts: a collective its GEMM part
outlasts costs the pass nothing, one longer than it costs only the excess; the stacks whose code does not overlap
(Megatron-LM 2021, GPT-NeoX, torchtitan), tp 1, a CPU and Transformer Engine's userbuffers change nothing; a
Megatron-LM 2022–2023 record that prints the setting off under sequence parallelism keeps the overlap (that
Megatron turned it off there itself); the predicted trace draws each such collective inside its GEMM's span."""
from __future__ import annotations

import gzip
import json

import pytest

from extractors.jobs.megatron import config_from_argv
from predictor import ModelSet, predict_iteration
from predictor.report.trace_out import write_traces
from predictor.schedule import tp_overlap
from tracekit.core.cluster import Cluster
from tracekit.core.config import TrainingConfig
from tracekit.core.stacks import get_stack

HW = "A100-SXM4-80GB"
LAYERS, MB, GBS = 4, 2, 8


def job(h: int, tp: int, extra: str = "") -> str:
    return (f"--num-layers {LAYERS} --hidden-size {h} --num-attention-heads 32 --seq-length 2048 "
            f"--max-position-embeddings 2048 --micro-batch-size {MB} --global-batch-size {GBS} "
            f"--tensor-model-parallel-size {tp} --bf16 {extra}")


@pytest.fixture(scope="module")
def models():
    return ModelSet.load(None)


def run(models, h: int, tp: int, extra: str = "", stack: str = "megatron-core", hardware: str = HW, **settings):
    config = config_from_argv(job(h, tp, extra), {"world_size": tp, **get_stack(stack).config, **settings})
    return predict_iteration(config, Cluster(hardware, gpus_per_node=8), models)


def backward_collectives(prediction, suffixes: tuple[str, ...]) -> tuple[float, float]:
    """(µs of the decoder layers' backward collectives named by `suffixes` in one micro-batch, µs of the part of
    their own linear's backward GEMM each runs beside), from the prediction's operator times."""
    graph, dur = prediction.graph, prediction.durations_us
    ops = graph.segment(0, 0).bwd
    gemms = {(o.name, o.block): float(dur[o.spec]) for o in ops
             if o.per_layer and o.group is None and graph.specs[o.spec]["primitive"] == "gemm"
             and graph.specs[o.spec]["pass"] == "bwd"}
    total = cover = 0.0
    for o in ops:
        if o.per_layer and o.group == "tp" and o.name.endswith(suffixes):
            linear = o.name.rsplit(".", 1)[0]
            t = float(dur[o.spec])
            total += o.count * t
            cover += o.count * min(t, gemms[(linear, o.block)] / 2)  # dgrad and wgrad: one forward's work each
    return total, cover


def test_a_collective_its_weight_gradient_gemm_outlasts_costs_nothing(models):
    """h 8192 over tp 2: each linear's weight-gradient GEMM (≥ 0.8 TFLOP) outlasts its 67 MB all-reduce over NVLink,
    so the backward's two all-reduces a layer leave the iteration — by their whole time, on every micro-batch."""
    overlapped = run(models, 8192, 2)
    plain = run(models, 8192, 2, async_tensor_model_parallel_allreduce=False)
    total, cover = backward_collectives(plain, (".grad_all_reduce",))
    assert total > 0 and cover == pytest.approx(total)  # every one shorter than its GEMM part
    micro_batches = GBS // MB
    saved = plain.iteration_time_s - overlapped.iteration_time_s
    assert saved == pytest.approx(micro_batches * total * 1e-6, rel=1e-9)
    assert overlapped.breakdown["compute"] == pytest.approx(plain.breakdown["compute"], rel=1e-12)


def test_a_collective_longer_than_its_gemm_part_costs_the_excess(models):
    """h 1024 over tp 8: the weight-gradient GEMMs of a narrow layer end before their all-reduce of the whole
    activation: what is saved is the GEMM parts' time, less than the collectives'."""
    overlapped = run(models, 1024, 8)
    plain = run(models, 1024, 8, async_tensor_model_parallel_allreduce=False)
    total, cover = backward_collectives(plain, (".grad_all_reduce",))
    assert 0 < cover < total
    saved = plain.iteration_time_s - overlapped.iteration_time_s
    assert saved == pytest.approx(GBS // MB * cover * 1e-6, rel=1e-9)


def test_sequence_parallelism_hides_the_re_gather_and_the_reduce_scatter(models):
    overlapped = run(models, 8192, 2, "--sequence-parallel")
    plain = run(models, 8192, 2, "--sequence-parallel", async_tensor_model_parallel_allreduce=False)
    total, cover = backward_collectives(plain, (".grad_reduce_scatter", ".input_all_gather"))
    assert total > 0 and cover == pytest.approx(total)
    assert plain.iteration_time_s - overlapped.iteration_time_s == pytest.approx(GBS // MB * total * 1e-6, rel=1e-9)


@pytest.mark.parametrize("stack", ["megatron-lm-2021", "gpt-neox", "torchtitan"])
def test_stacks_whose_linears_reduce_after_their_backward_do_not_overlap(models, stack):
    assert get_stack(stack).config["async_tensor_model_parallel_allreduce"] is False
    config = config_from_argv(job(8192, 2), {"world_size": 2, **get_stack(stack).config})
    assert not config.run.tp_backward_overlap


@pytest.mark.parametrize("tp, extra, hardware", [
    (1, "", HW),  # nothing to hide
    (2, "--sequence-parallel --tp-comm-overlap", HW),  # Transformer Engine's userbuffers hide them their own way
    (2, "", "cpu-intel-xeon-processor"),  # the reference trainer's gloo collectives
])
def test_where_nothing_runs_beside_the_setting_changes_nothing(models, tp, extra, hardware):
    on = run(models, 2048, tp, extra, hardware=hardware)
    off = run(models, 2048, tp, extra, hardware=hardware, async_tensor_model_parallel_allreduce=False)
    assert not tp_overlap.applies(on.graph)
    assert on.iteration_time_s == off.iteration_time_s


def test_a_typed_flag_turns_it_off_and_an_old_record_under_sequence_parallelism_keeps_it():
    typed = config_from_argv(job(2048, 2, "--no-async-tensor-model-parallel-allreduce"))
    assert not typed.run.tp_backward_overlap
    base = {"num_layers": 2, "hidden_size": 2048, "num_attention_heads": 16, "seq_length": 2048,
            "tensor_model_parallel_size": 2, "async_tensor_model_parallel_allreduce": "False"}
    # a Megatron-LM 2022–2023 log: its validate_args printed the setting off under sequence parallelism
    record = TrainingConfig.from_mapping({**base, "sequence_parallel": "True"})
    assert record.run is None or record.run.tp_backward_overlap
    assert not TrainingConfig.from_mapping(base).run.tp_backward_overlap  # without SP the record says what ran
    typed_sp = TrainingConfig.from_mapping({**base, "sequence_parallel": True}, strict=True)
    assert not typed_sp.run.tp_backward_overlap  # typed, it is what the person asked for


def test_the_predicted_trace_draws_each_collective_inside_its_gemm(models, tmp_path):
    prediction = run(models, 8192, 2)
    path, = write_traces(prediction, tmp_path, iterations=1)
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    kernels = {e["args"]["External id"]: e for e in events if e.get("cat") in ("kernel", "gpu_memcpy")
               and "External id" in e.get("args", {})}
    reduces = [e for e in ops if e["name"] == "record_param_comms" and e["args"].get("Collective name") ==
               "allreduce"]
    assert reduces
    step = next(e for e in events if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("ProfilerStep"))
    spans = sorted((k["ts"], k["ts"] + k["dur"]) for k in kernels.values() if k.get("args", {}).get("stream") == 7)
    inside = 0
    for op in reduces:
        k = kernels[op["args"]["External id"]]
        assert step["ts"] <= k["ts"] and k["ts"] + k["dur"] <= step["ts"] + step["dur"] + 1e-3
        inside += any(a <= k["ts"] and k["ts"] + k["dur"] <= b + 1e-3 for a, b in spans)
    # the backward's two all-reduces a layer and micro-batch lie inside a GEMM kernel; the forward's do not
    assert inside == LAYERS * 2 * GBS // MB
