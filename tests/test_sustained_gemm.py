"""The sustained GEMM ceilings (predictor.costs.physics.sustained_gemm, tracekit/data/sustained_gemm.json), the A100's
and Hopper's: a training graph's half-precision (and on Hopper fp8) GEMMs are no faster than their FLOPs at them, the
GEMMs below keep their samples' speed, other parts and operator-level answers are untouched, and each ceiling is what
the corpus's bursts exceed."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from predictor.costs.learned.models import ModelSet
from predictor.costs.physics import sustained_gemm
from predictor.predict import prepare_many
from tracekit.core.cluster import Cluster
from tracekit.core.config import TrainingConfig
from tracekit.core.hardware import hardware_spec

A100 = "A100-SXM4-80GB"
H100 = "H100-80GB-HBM3"


def gpt(hidden: int, micro_batch: int, **kw) -> TrainingConfig:
    return TrainingConfig(num_layers=4, hidden_size=hidden, num_attention_heads=hidden // 128, seq_length=2048,
                          micro_batch_size=micro_batch, global_batch_size=micro_batch, precision="fp16", **kw)


def flops(spec: dict) -> float:
    """A GEMM row's FLOPs by hand: 2·m·n·k per batch, the backward's two GEMMs (dgrad and wgrad) twice that."""
    m, n, k, batch = (float(spec.get(key) or 0.0) for key in ("m", "n", "k", "batch"))
    return 2.0 * m * n * k * max(batch, 1.0) * (2.0 if spec["pass"] == "bwd" else 1.0)


def estimates(config: TrainingConfig, hardware: str, models: ModelSet) -> tuple[list[dict], np.ndarray]:
    [(graph, est, _, _)] = prepare_many([config], Cluster(hardware, 8), models)
    return graph.specs, est.duration_us


def test_a_training_graphs_a100_gemms_are_no_faster_than_the_ceiling_and_the_slower_ones_keep_their_speed():
    ceiling = sustained_gemm.ceilings()[A100]["fp16"]
    models = ModelSet.load()
    config = gpt(8192, 8)  # GEMMs of 2·16384·8192·(3·8192) FLOPs and more: the samples' bursts exceed the ceiling
    specs, capped = estimates(config, A100, models)
    _, burst = estimates(config, A100, models.unsustained())
    gemm = np.array([s["primitive"] in ("gemm", "bmm") for s in specs])
    work = np.array([flops(s) for s in specs])
    with np.errstate(divide="ignore", invalid="ignore"):
        burst_rate = work / burst / 1e6  # TFLOP/s
    assert (capped[gemm] >= work[gemm] / (ceiling * 1e6) * (1 - 1e-9)).all()
    raised = gemm & (burst_rate > ceiling * 1.001)
    assert raised.sum() >= 4  # the QKV, MLP and output GEMMs of a wide layer, forward and backward
    assert np.allclose(capped[raised], work[raised] / (ceiling * 1e6))
    assert np.array_equal(capped[~raised], burst[~raised])  # everything else as the samples answer it
    assert (capped >= burst).all()


def test_parts_without_a_ceiling_and_left_out_parts_keep_their_bursts():
    models = ModelSet.load()
    config = gpt(8192, 8)
    # no ceiling fitted: their GEMMs at what their tables measured (GH200 a 1,000 W superchip, the H100 PCIe card
    # 350 W: not the 700 W SXM board Hopper's ceiling is fitted for)
    for hardware in ("B200-180GB", "GH200-120GB", "H100-PCIE-80GB"):
        assert hardware not in sustained_gemm.ceilings()
        assert np.array_equal(estimates(config, hardware, models)[1],
                              estimates(config, hardware, models.unsustained())[1])
    # a part priced with an A100 SXM's models takes its ceiling with them (the PCIe card's own, under 300 W, would be
    # lower and is not fitted)
    [(graph, _, _, _)] = prepare_many([config], Cluster("A100-PCIE-80GB", 8), models)
    assert graph.hardware in sustained_gemm.ceilings()
    assert A100 not in models.without(A100).gemm_ceilings()
    assert A100 in models.gemm_ceilings() and models.unsustained().gemm_ceilings() == {}


def test_operator_answers_stay_the_samples_bursts():
    """`ModelSet.predict` answers what the samples time (a kernel in a burst): it is what they are scored against."""
    row = pd.DataFrame([{"hardware": A100, "primitive": "gemm", "pass": "fwd", "dtype": "fp16", "variant": "linear3",
                         "m": 16384.0, "n": 32768.0, "k": 8192.0, "batch": 1.0}])
    answer = float(ModelSet.load().predict(row)["duration_us"].iloc[0])
    assert flops(row.iloc[0].to_dict()) / answer / 1e6 > sustained_gemm.ceilings()[A100]["fp16"]


def test_only_tensor_core_gemms_in_a_bounded_dtype_are_bounded():
    rows = pd.DataFrame([
        {"hardware": A100, "primitive": "gemm", "pass": "fwd", "dtype": "fp16", "m": 4096.0, "n": 4096.0, "k": 4096.0},
        {"hardware": A100, "primitive": "bmm", "pass": "bwd", "dtype": "bf16", "m": 2048.0, "n": 2048.0, "k": 128.0,
         "batch": 64.0},
        {"hardware": H100, "primitive": "gemm", "pass": "bwd", "dtype": "fp8", "m": 4096.0, "n": 4096.0, "k": 4096.0},
        {"hardware": A100, "primitive": "gemm", "pass": "fwd", "dtype": "tf32", "m": 4096.0, "n": 4096.0, "k": 4096.0},
        {"hardware": A100, "primitive": "gemm", "pass": "fwd", "dtype": "fp8", "m": 4096.0, "n": 4096.0, "k": 4096.0},
        {"hardware": A100, "primitive": "norm", "pass": "fwd", "dtype": "fp16", "numel": 1e8},
        {"hardware": "B200-180GB", "primitive": "gemm", "pass": "fwd", "dtype": "bf16", "m": 4096.0, "n": 4096.0,
         "k": 4096.0},
        # every 8-bit float recipe at the part's fp8 ceiling (one clock): blockwise (DeepSeek-style), rowwise
        {"hardware": H100, "primitive": "gemm", "pass": "fwd", "dtype": "fp8_block", "m": 4096.0, "n": 4096.0,
         "k": 4096.0},
        {"hardware": H100, "primitive": "gemm", "pass": "fwd", "dtype": "fp8_row", "m": 4096.0, "n": 4096.0,
         "k": 4096.0},
        {"hardware": H100, "primitive": "gemm", "pass": "fwd", "dtype": "nvfp4", "m": 4096.0, "n": 4096.0, "k": 4096.0},
    ])
    floor = sustained_gemm.floor_us(rows, {A100: sustained_gemm.half(250.0), H100: {"fp8": 1000.0}})
    assert floor[0] == pytest.approx(2 * 4096**3 / 250e6)
    assert floor[1] == pytest.approx(2 * 2 * 2048 * 2048 * 128 * 64 / 250e6)  # a backward: both GEMMs
    assert floor[2] == pytest.approx(2 * 2 * 4096**3 / 1000e6)  # fp8 at the part's fp8 ceiling
    assert list(floor[3:7]) == [0.0, 0.0, 0.0, 0.0]  # tf32, fp8 on a part without an fp8 ceiling, a norm, no ceiling
    assert list(floor[7:9]) == pytest.approx([2 * 4096**3 / 1000e6] * 2)
    assert floor[9] == 0.0  # a 4-bit format is not an fp8 one


def test_the_ceiling_is_below_what_the_a100_bursts_reach_and_records_its_fit(corpus):
    """The ceiling is a fact about the seed paper's burst samples: several of their GEMMs run above it (else it would
    bound nothing), none above the dense peak; the file says which rows it was fitted on and its held-out score."""
    doc = json.loads(sustained_gemm.CEILINGS.read_text())
    ceiling = sustained_gemm.ceilings()[A100]["fp16"]
    frame = pd.read_csv(corpus / "operator-samples/estimate-train-time/Perlmutter/operator/"
                        "NVIDIAA100-SXM4-80GB_linear3_fp16.csv")  # MLP up: [l·b, dim] × [dim, 4·dim/mp]
    rate = 2 * frame["b"] * frame["l"] * frame["dim"] * 4 * frame["dim"] / frame["mp"] / frame["F_dur(us)"] / 1e6
    peak = hardware_spec(A100).peak_tflops("fp16")
    assert (rate > ceiling).sum() > 10 and rate.max() < peak
    assert ceiling < peak
    assert doc["parts"]["A100-SXM4-40GB"]["tflops"] == ceiling  # one die, one 400 W limit
    fit = doc["fits"]["A100"]
    assert fit["rows"]["file"] == "e2e/vtrain_a100_multi_node.csv"
    assert fit["held_out"]["mape"] < fit["mape_without"]


def test_a_training_graphs_hopper_gemms_are_held_to_one_clock_in_bf16_and_fp8():
    """On an H100 SXM a training graph's bf16 GEMMs are no faster than Hopper's ceiling and its fp8 GEMMs no faster
    than their fp8 ceiling; the large ones of a wide layer, whose bursts exceed it, run at it; nothing is faster."""
    ceiling = sustained_gemm.ceilings()[H100]
    models = ModelSet.load()
    for precision, dtype in (("bf16", "bf16"), ("fp8", "fp8")):
        config = TrainingConfig(num_layers=4, hidden_size=8192, num_attention_heads=64, seq_length=4096,
                                micro_batch_size=2, global_batch_size=2, precision=precision)
        specs, capped = estimates(config, H100, models)
        _, burst = estimates(config, H100, models.unsustained())
        bounded = np.array([s["primitive"] in ("gemm", "bmm") and s.get("dtype") == dtype for s in specs])
        work = np.array([flops(s) for s in specs])
        assert (capped[bounded] >= work[bounded] / (ceiling[dtype] * 1e6) * (1 - 1e-9)).all()
        with np.errstate(divide="ignore", invalid="ignore"):
            raised = bounded & (work / burst / 1e6 > ceiling[dtype] * 1.001)
        assert raised.sum() >= 4, precision
        assert (capped >= burst).all()


def test_hoppers_ceiling_is_below_xlas_h100_bursts_one_for_the_700_w_boards_and_fp8_keeps_the_measured_ratio(corpus):
    """Hopper's ceiling is a fact about XLA's H100 table: its large bf16 shapes run above it in bursts (else it would
    bound nothing), below the dense peak; the H100, H800 and H200 SXM boards share it (one die, 700 W); its fp8 ceiling
    is the bf16 one times the fp8-over-bf16 speed-up H200's matmul table measured at its large transformer shapes."""
    ceilings = sustained_gemm.ceilings()
    ceiling = ceilings[H100]["bf16"]
    table = pd.read_csv(corpus / "operator-samples/xla-matmul/h100_sm90.csv")
    bf16 = table[table["dtype_key"] == "bf16xbf16->bf16"]
    large = bf16[2.0 * bf16["b"] * bf16["m"] * bf16["n"] * bf16["k"] >= 2**36]
    assert (large["tflops"] > ceiling).mean() > 0.5  # most of its large shapes burst above it
    assert ceiling < hardware_spec(H100).peak_tflops("bf16")
    assert ceilings["H800-80GB-HBM3"] == ceilings["H200-141GB"] == ceilings[H100]
    measured = json.loads((corpus / "operator-samples/h200-matmul/gemm.json").read_text())["rows"]
    rate = {(r["dtype"], r["scaling"], r["m"], r["n"], r["k"]): r["tflops"] for r in measured}
    ratios = [rate[("fp8_e4m3", "tensorwise", m, n, k)] / t for (dtype, _, m, n, k), t in rate.items()
              if dtype == "bf16" and 2.0 * m * n * k >= 2**36 and ("fp8_e4m3", "tensorwise", m, n, k) in rate]
    assert len(ratios) >= 5
    assert ceilings[H100]["fp8"] / ceiling == pytest.approx(float(np.median(ratios)), rel=2e-3)
    assert 1.0 < ceilings[H100]["fp8"] / ceiling < 2.0  # not the datasheet's 2×
    fit = json.loads(sustained_gemm.CEILINGS.read_text())["fits"]["Hopper"]
    assert fit["rows"]["file"] == "e2e/megatron_bridge_perf.csv"
    assert fit["held_out"]["mape"] < fit["mape_without"]
    [ci] = [v for k, v in fit["scored_on"].items() if "megatron_ci_golden" in k]
    assert ci["mape"] <= ci["mape_without"]  # scored on the other Hopper family it applies to: no worse there


def test_megatron_bridge_takes_no_device_scale_where_a_part_has_a_ceiling():
    """A GPU's sustained rate is the hardware's: the megatron-bridge profile scales no architecture whose parts have a
    ceiling (its tensor-core ops would be slowed twice)."""
    from tracekit.core.hardware import architecture
    from tracekit.core.stacks import get_stack

    scaled = get_stack("megatron-bridge").device_scale
    assert not {architecture(part) for part in sustained_gemm.ceilings()} & set(scaled)
