"""A predicted trace names the hardware it predicts: a CPU prediction is a CPU run on gloo (no device, no kernels,
gloo's collectives, as the reference trainer's CPU captures hold them), a GPU prediction its architecture's kernels
and its vendor's device and communication library. Read back by tracekit's own reader, every naming of one
prediction gives the same operators, passes, layers and times."""
from __future__ import annotations

import gzip
import json
import re

import pytest
from typer.testing import CliRunner

from extractors.kineto import read_trace
from predictor import ModelSet, predict_iteration
from predictor.report.kernel_names import device_names
from predictor.report.trace_out import dumps, rank_trace, write_traces
from tracekit.cli import app
from tracekit.core.cluster import Cluster
from tracekit.core.config import TrainingConfig

CPU = "cpu-intel-xeon-processor"
#: TP 2 × PP 2 × DP 2 with the distributed optimizer (all-reduce, reduce-scatter, all-gather, send/recv) and MoE
#: experts over EP 2 (all-to-all).
CONFIG = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 128, "micro_batch_size": 2,
          "global_batch_size": 16, "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
          "world_size": 8, "use_distributed_optimizer": True, "overlap_grad_reduce": True, "num_experts": 4,
          "expert_model_parallel_size": 2, "moe_token_dispatcher_type": "alltoall", "sequence_parallel": True}
#: What each architecture's traces hold (real traces' names: the corpus's, published ones for cuDNN attention), and
#: the device's compute capability.
GPUS = {
    "V100-SXM2-32GB": (("volta_fp16_s884gemm", "fmha_cutlassF_f16_aligned_64x64_rf_sm70", "ncclDevKernel_"), (7, 0)),
    "A100-SXM4-80GB": (("ampere_bf16_s16816gemm", "flash::flash_fwd_kernel", "ncclDevKernel_ReduceScatter"), (8, 0)),
    "H100-80GB-HBM3": (("sm90_xmma_gemm_bf16bf16", "native_sdpa_sm90_flash_fprop", "ncclDevKernel_AllReduce"), (9, 0)),
    "H200-141GB": (("sm90_xmma_gemm_bf16bf16", "native_sdpa_sm90_flash_bprop", "ncclDevKernel_AllGather"), (9, 0)),
    "B200-180GB": (("nvjet_sm100_", "native_sdpa_sm100_flash_fprop", "ncclDevKernel_SendRecv"), (10, 0)),
    "GB200-186GB": (("nvjet_sm100_", "native_sdpa_sm100_flash_bprop", "ncclDevKernel_AllReduce"), (10, 0)),
    "MI300X": (("Cijk_Alik_Bljk_BBS_", "_ISA942_", "ck_tile::FmhaFwdKernel", "ncclDevKernel_Generic"), (9, 4)),
    "MI250X": (("Cijk_Alik_Bljk_BBS_", "_ISA90a_", "ck_tile::FmhaBwdDQDKDVKernel", "ncclDevKernel_Generic"), (9, 0)),
    "MI355X": (("Cijk_Alik_Bljk_BBS_", "_ISA950_", "ck_tile::FmhaFwdKernel", "ncclDevKernel_Generic"), (9, 5)),
}
#: Names that say which hardware a trace is of: none may appear in another's.
MARKERS = ("volta_", "ampere_", "sm90", "sm100", "Cijk_", "ck_tile", "flash::", "ncclDevKernel_Generic")


def _config(**extra) -> TrainingConfig:
    return TrainingConfig.from_mapping({**CONFIG, "bf16": True, **extra})


@pytest.fixture(scope="module")
def prediction():
    return predict_iteration(_config(), Cluster(CPU, gpus_per_node=8), ModelSet.load(None))


def _write(prediction, hardware: str, path) -> dict:
    doc = rank_trace(prediction, 0, 2, device_names(hardware))
    path.write_bytes(dumps(doc))
    return doc


def _read(path):
    """(the trace, per (pass, primitive) time, per (pass, primitive, layer) time of the compute rows) read back. The
    optimizer step is left out of the last: a CPU run names its range (`Optimizer.step#Adam.step`, an annotation, as
    the reference trainer's captures hold it), a GPU trace's is the launching op around its kernels."""
    trace = read_trace(path)
    events = trace.device_events
    compute = events[(events["category"] == "computation") & (events["pass"] != "optimizer")]
    return (trace, events.groupby(["pass", "primitive"])["dur_us"].sum(),
            compute.groupby(["pass", "primitive", compute["layer"].fillna("")])["dur_us"].sum())


def test_a_cpu_prediction_is_a_cpu_run_on_gloo(prediction, tmp_path):
    (path,) = write_traces(prediction, tmp_path, ranks=[0])
    doc = json.loads(gzip.decompress(path.read_bytes()))
    assert doc["deviceProperties"] == [] and doc["cpu_model"] == CPU[len("cpu-"):]
    info = doc["distributedInfo"]
    assert info["backend"] == "gloo" and info["world_size"] == 8
    groups = {g["pg_desc"]: g for g in info["pg_config"]}
    assert groups["TENSOR_MODEL_PARALLEL_GROUP"]["pg_size"] == 2 and groups["TENSOR_MODEL_PARALLEL_GROUP"]["ranks"] \
        == [0, 1]
    assert groups["PIPELINE_MODEL_PARALLEL_GROUP"]["ranks"] == [0, 4]
    assert {g["backend_config"] for g in info["pg_config"]} == {"cpu:gloo,cuda:gloo"}
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert {e["cat"] for e in events} == {"cpu_op", "user_annotation"}  # no kernel, launch, flow or GPU range
    text = json.dumps(doc["traceEvents"])
    for word in MARKERS + ("nccl", "NVIDIA", "cuda", "Kernel", "stream"):
        assert word not in text, word
    names = {e["name"] for e in events}
    assert {"gloo:all_reduce", "gloo:all_gather", "gloo:all_to_all", "gloo:send", "c10d::_reduce_scatter_base_",
            "aten::mm", "autograd::engine::evaluate_function: MmBackward0", "Optimizer.step#Adam.step"} <= names
    threads = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    gloo = {e["tid"] for e in events if e["name"].startswith("gloo:")}
    assert gloo and all(threads[t].endswith("(pt_gloo_runloop)") for t in gloo)
    trace = read_trace(path)
    assert trace.is_cpu_run and trace.hardware == CPU and trace.backend == "gloo"
    assert [s for s, _, _ in trace.iterations] == [1, 2]
    kinds = set(trace.device_events["primitive"])
    assert {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "gemm", "optimizer"} <= kinds


def test_every_naming_of_one_prediction_reads_back_the_same(prediction, tmp_path):
    """The CPU run and every GPU's trace of one timeline: the same time per pass and primitive (collectives
    included), and per pass, primitive and layer for the operators."""
    _write(prediction, CPU, tmp_path / "cpu.json")
    _, by_kind, by_layer = _read(tmp_path / "cpu.json")
    assert by_kind[("bwd", "gemm")] > 0 and by_kind[("comm", "reduce_scatter")] > 0
    for hardware in GPUS:
        path = tmp_path / f"{hardware}.json"
        _write(prediction, hardware, path)
        trace, kinds, layers = _read(path)
        assert trace.hardware == hardware and not trace.is_cpu_run
        assert list(kinds.index) == list(by_kind.index) and list(layers.index) == list(by_layer.index), hardware
        assert kinds.to_numpy() == pytest.approx(by_kind.to_numpy(), rel=1e-9), hardware
        assert layers.to_numpy() == pytest.approx(by_layer.to_numpy(), rel=1e-9), hardware


@pytest.mark.parametrize("hardware", sorted(GPUS))
def test_a_gpu_prediction_names_its_architectures_kernels_and_device(hardware, tmp_path):
    prediction = predict_iteration(_config(), Cluster(hardware, gpus_per_node=8), ModelSet.load(None))
    (path,) = write_traces(prediction, tmp_path, ranks=[0])
    doc = json.loads(gzip.decompress(path.read_bytes()))
    (device,) = doc["deviceProperties"]
    expected, capability = GPUS[hardware]
    assert (device["computeMajor"], device["computeMinor"]) == capability
    amd = hardware.startswith("MI")
    assert device["name"] == ("AMD Instinct " if amd else "NVIDIA ") + hardware
    assert device["warpSize"] == (64 if amd else 32)
    assert doc["distributedInfo"]["backend"] == "nccl"  # RCCL too: PyTorch names ROCm's backend nccl
    kernels = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "kernel"}
    text = "\n".join(kernels)
    for name in expected:
        assert name in text, name
    for marker in MARKERS:
        if not any(marker in name for name in expected):
            assert marker not in text, marker
    comm = [k for k in kernels if "nccl" in k.lower()]
    assert comm and all(k == "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)" for k in comm) == amd
    assert read_trace(path).hardware == hardware  # the device's name reads back as the hardware predicted


def test_the_html_timeline_of_a_cpu_prediction_names_cpu_work(prediction, tmp_path):
    """The diff page's timeline titles (its hover text) are the trace's own names: gloo's collectives and aten ops."""
    traces = tmp_path / "predicted"
    write_traces(prediction, traces, ranks=[0])
    page = tmp_path / "report.html"
    done = CliRunner().invoke(app, ["diff", str(traces), str(traces), "--html", str(page), "--json"])
    assert done.exit_code == 0, done.stderr
    lane = re.search(r"<svg[^>]*id=.timeline-predicted.*?</svg>", page.read_text(), re.S)
    assert lane
    titles = re.findall(r"<title>([^<]*) — [\d.]+ µs</title>", lane.group(0))
    assert titles and any(t.startswith("gloo:") for t in titles) and any(t.startswith("aten::") for t in titles)
    for word in ("nccl", "sm90", "flash::", "NVIDIA", "Kernel"):
        assert not any(word in t for t in titles), word


@pytest.mark.parametrize("precision", ["fp8-cs", "fp8-block"])
def test_a_low_precision_recipe_traces_its_fp8_gemms(precision, tmp_path):
    """The recipes whose names are not a dtype (current scaling, blockwise) write their GEMMs' fp8 kernels."""
    prediction = predict_iteration(_config(precision=precision), Cluster("H100-80GB-HBM3", gpus_per_node=8),
                                   ModelSet.load(None))
    (path,) = write_traces(prediction, tmp_path, ranks=[0])
    doc = json.loads(gzip.decompress(path.read_bytes()))
    gemms = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "kernel" and "xmma_gemm" in e["name"]}
    assert gemms and all("e4m3" in name for name in gemms)
    assert set(read_trace(path).device_events["primitive"]) >= {"gemm", "attention"}


@pytest.mark.parametrize("hardware", [CPU, "H100-80GB-HBM3"])
def test_every_op_of_an_iteration_ends_inside_its_step_range(hardware):
    """An iteration's ops are placed by summing their times, its `ProfilerStep` range spans the simulated period:
    the last op still ends inside the range, as a profiler's trace holds it (a reader that takes containment
    strictly counted it out of the iteration). Here, an H100 prediction from the bundled models: the second
    pipeline stage's loss-report all-reduce summed past its second iteration's period by one ulp."""
    prediction = predict_iteration(_config(), Cluster("H100-80GB-HBM3", gpus_per_node=8), ModelSet.load(None))
    for rank in range(8):
        events = [e for e in rank_trace(prediction, rank, 2, device_names(hardware))["traceEvents"]
                  if e.get("ph") == "X"]
        steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
        assert len(steps) == (2 if hardware == CPU else 4)
        for step in steps:
            end = step["ts"] + step["dur"]
            mine = [e for e in events if (e["pid"] == 0) == (step["pid"] == 0) and e not in steps
                    and step["ts"] <= e["ts"] < end]
            assert mine and all(e["ts"] + e["dur"] <= end for e in mine), (rank, step["name"])
