"""Unaligned shapes on NVIDIA GPUs: the kernels they force and what they cost (`predictor.costs.physics.kernel_paths`,
#24).

Physics and invariants, on the bundled models and the datasheet table: an unaligned shape is never predicted faster
than the next aligned one, no estimate beats the dtype's dense peak or the memory bandwidth, the scalar path moves
every operand at least once, and the fitted rate is below one warp-wide instruction per clock."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from predictor.costs.learned.models import ModelSet
from predictor.costs.physics import kernel_paths
from tracekit.core.hardware import hardware_spec

H100 = "H100-80GB-HBM3"


def _bmm(hardware: str, shapes: list[tuple[int, int, int, int]], dtype: str = "bf16") -> pd.DataFrame:
    return pd.DataFrame([{"hardware": hardware, "primitive": "bmm", "pass": "fwd", "dtype": dtype,
                          "variant": "aten::bmm", "m": m, "n": n, "k": k, "batch": b} for m, n, k, b in shapes])


def _softmax(hardware: str, shapes: list[tuple[int, int]], dtype: str = "bf16") -> pd.DataFrame:
    return pd.DataFrame([{"hardware": hardware, "primitive": "softmax", "pass": "fwd", "dtype": dtype,
                          "variant": "aten::_softmax", "rows": r, "width": w, "numel": r * w} for r, w in shapes])


def _up8(x: int) -> int:
    """The next multiple of 8 elements (16 bytes of bf16): the aligned shape."""
    return -(-x // 8) * 8


UNALIGNED = [(5185, 64, 5185, 16), (5185, 5185, 64, 16), (1000, 1001, 1003, 4), (4096, 4095, 4096, 1),
             (2049, 2050, 2051, 2), (777, 333, 4097, 8)]


@pytest.mark.parametrize("hardware", [H100, "B200-180GB", "A100-SXM4-80GB", "GH200-120GB"])
def test_unaligned_bmm_is_never_faster_than_the_next_aligned_shape(hardware):
    models = ModelSet.load()
    odd = models.predict(_bmm(hardware, UNALIGNED))["duration_us"].to_numpy()
    aligned = models.predict(_bmm(hardware, [(m, _up8(n), _up8(k), b) for m, n, k, b in UNALIGNED]))
    assert (odd >= aligned["duration_us"].to_numpy()).all()


def test_unaligned_estimates_stay_below_the_dense_peak_and_the_bandwidth():
    models = ModelSet.load()
    spec = hardware_spec(H100)
    bmm = _bmm(H100, UNALIGNED)
    t = models.predict(bmm)["duration_us"].to_numpy() * 1e-6
    flops = 2.0 * bmm["m"] * bmm["n"] * bmm["k"] * bmm["batch"]
    assert (flops / t <= spec.peak_tflops_fp16 * 1e12).all()
    soft = _softmax(H100, [(82960, 5185), (4096, 1025), (100000, 3001)])
    t = models.predict(soft)["duration_us"].to_numpy() * 1e-6
    assert (2 * 2 * soft["numel"] / t <= spec.mem_bw_gbs * 1e9).all()  # one read and one write of bf16


def test_unaligned_softmax_row_is_never_faster_than_the_aligned_width():
    models = ModelSet.load()
    widths = [1025, 2049, 3001, 5185, 8191]
    odd = models.predict(_softmax(H100, [(65536, w) for w in widths]))["duration_us"].to_numpy()
    aligned = models.predict(_softmax(H100, [(65536, _up8(w)) for w in widths]))["duration_us"].to_numpy()
    assert (odd >= aligned).all()


def test_only_unaligned_nvidia_half_precision_tiled_gemms_take_the_scalar_path():
    shapes = [(5185, 64, 5185, 16), (5184, 64, 5184, 16), (5184, 1, 768, 1), (141, 30522, 512, 1)]
    frame = pd.concat([_bmm(H100, shapes),
                       _bmm("MI300X", [(5185, 64, 5185, 16)]), _bmm(H100, [(5185, 64, 5185, 16)], dtype="fp8")],
                      ignore_index=True)
    assert kernel_paths.unaligned_gemm(frame).tolist() == [True, False, False, False, False, False]
    soft = pd.concat([_softmax(H100, [(100, 5185), (100, 5184), (100, 1001)]), _softmax("MI300X", [(100, 5185)])],
                     ignore_index=True)
    assert kernel_paths.unaligned_softmax(soft).tolist() == [True, False, False, False]


def test_the_scalar_path_moves_every_operand_at_least_once_and_reuses_tiles():
    m, n, k, b = (np.array(v, dtype=float) for v in ([5185, 128, 4096], [64, 128, 4097], [5185, 7, 4096], [16, 1, 2]))
    elements = kernel_paths.scalar_gemm_elements(m, n, k, b)
    assert (elements >= b * (m * k + n * k + m * n)).all()
    # one more column of 128-wide tiles: A read once more, 128 more columns of B per row of tiles, 128 of C
    more = kernel_paths.scalar_gemm_elements(m, n + 128, k, b)
    assert np.allclose(more - elements, b * (m * k + 128 * k * np.ceil(m / 128) + m * 128))


def test_the_fitted_scalar_rate_is_physical():
    rate = kernel_paths.constants()["scalar_gemm_elements_per_sm_clock"]
    assert 0 < rate < 32  # at most one warp-wide load per SM per clock
    fit = kernel_paths.constants()["fit"]
    assert not any(hw.startswith("H100") for hw in fit["hardware"])  # never fitted on the kernels it is scored on


# The FP32 lanes of one SM, as the architecture whitepapers state them (GA100: 64 FP32 cores per SM, A100
# whitepaper 2020; GH100: 128 per SM, H100 whitepaper 2022, "2x faster clock-for-clock performance per SM").
WHITEPAPER_FP32_LANES = {"A100-SXM4-80GB": 64, "A100-SXM4-40GB": 64, "H100-80GB-HBM3": 128, "GH200-120GB": 128,
                         "H100-PCIE-80GB": 128}


@pytest.mark.parametrize("hardware,lanes", sorted(WHITEPAPER_FP32_LANES.items()))
def test_the_datasheet_table_gives_the_whitepapers_fp32_lanes_per_sm(hardware, lanes):
    assert kernel_paths.fp32_lanes_per_sm(hardware) == pytest.approx(lanes, rel=0.01)


def test_the_hopper_scalar_rate_is_the_ampere_rate_times_the_lane_ratio():
    fitted = kernel_paths.constants()["scalar_gemm_elements_per_sm_clock"]
    fit_hw = kernel_paths.constants()["fit"]["hardware"][0]
    assert fit_hw.startswith("A100")
    assert kernel_paths.scalar_rate(fit_hw) == pytest.approx(fitted)
    assert kernel_paths.scalar_rate(H100) == pytest.approx(fitted * 128 / 64, rel=0.01)
    # a time: the element traffic of the same shape takes (A100 SMs × tensor clock × 64) / (H100 SMs × tensor
    # clock × 128): 108 · 1410 MHz · 64 against 132 · 1830 MHz · 128 (datasheet figures, see the next test)
    shape = [(5185, 64, 5185, 16)]
    floor = kernel_paths.KERNEL_OVERHEAD_US
    ta = kernel_paths.scalar_gemm_us(_bmm("A100-SXM4-80GB", shape))[0] - floor
    th = kernel_paths.scalar_gemm_us(_bmm(H100, shape))[0] - floor
    assert th / ta == pytest.approx((108 * 1410 * 64) / (132 * 1830 * 128), rel=0.01)


# The clock each part's datasheet quotes its dense fp16 tensor peak at: peak / (SMs × whitepaper dense FLOPs per SM
# per clock): A100 312 TF / (108 × 2048) = 1410 MHz, H100 SXM 989.4 / (132 × 4096) = 1830, H100 PCIe 756 / (114 ×
# 4096) = 1619, V100 125 / (80 × 1024) = 1526; B200's per-SM rate is not in the table: its table clock.
TENSOR_CLOCK_MHZ = {"A100-SXM4-80GB": 1410, H100: 1830, "GH200-120GB": 1830, "H100-PCIE-80GB": 1619,
                    "V100-SXM2-32GB": 1526, "B200-180GB": 1965}


@pytest.mark.parametrize("hardware,mhz", sorted(TENSOR_CLOCK_MHZ.items()))
def test_the_tensor_clock_is_the_one_the_datasheet_peak_is_quoted_at(hardware, mhz):
    clock = kernel_paths.tensor_clock_hz(hardware)
    assert clock == pytest.approx(mhz * 1e6, rel=0.005)
    assert clock <= hardware_spec(hardware).clock_mhz * 1e6  # never above the table's (FP32) clock


def test_the_scalar_path_never_beats_the_dense_peak_and_grows_with_every_dimension():
    spec = hardware_spec(H100)
    base = np.array([(5185, 64, 5185, 16), (1001, 1001, 1001, 1), (4095, 4095, 4095, 4), (129, 3, 77, 64)], float)
    t = kernel_paths.scalar_gemm_us(_bmm(H100, [tuple(r) for r in base]))
    flops = 2.0 * base.prod(axis=1)
    assert (flops / (t * 1e-6) <= spec.peak_tflops_fp16 * 1e12).all()
    for axis in range(4):
        grown = base.copy()
        grown[:, axis] += 1
        assert (kernel_paths.scalar_gemm_us(_bmm(H100, [tuple(r) for r in grown])) > t).all()


def test_the_gpu_side_floor_is_a_kernel_not_a_launch():
    assert 0.5 <= kernel_paths.gpu_floor_us() < kernel_paths.KERNEL_OVERHEAD_US  # a GPU-side kernel: a µs or more


@pytest.mark.parametrize("hardware", [H100, "B200-180GB", "A100-SXM4-80GB"])
def test_no_estimate_is_below_the_gpu_side_floor(hardware):
    models = ModelSet.load()
    floor = kernel_paths.gpu_floor_us()
    tiny = pd.concat([_bmm(hardware, [(1, 1, 1, 1), (5, 5, 64, 12), (5, 64, 5, 12), (8, 8, 8, 1)]),
                      _softmax(hardware, [(1, 1), (60, 5), (8, 8)])], ignore_index=True)
    act = pd.DataFrame([{"hardware": hardware, "primitive": "activation", "pass": "fwd", "dtype": "bf16",
                         "variant": "aten::gelu", "numel": n} for n in (1, 8, 1024)])
    rows = pd.concat([tiny, act], ignore_index=True)
    t = models.predict(rows)["duration_us"].to_numpy()
    assert (t >= floor - 1e-9).all()
    gemm = rows["primitive"].isin(["gemm", "bmm"]).to_numpy()
    assert (t[gemm] >= kernel_paths.KERNEL_OVERHEAD_US - 1e-9).all()  # a GEMM kernel keeps its fixed time


def test_the_roofline_answers_lose_only_the_host_part_of_the_launch():
    """Rows only the roofline answers: an activation on H100 is the roofline less (launch − floor), never below the
    floor; a bmm below H100's table grid keeps the roofline (a GEMM kernel's fixed time)."""
    from predictor.costs.physics.roofline import estimate_us

    models = ModelSet.load()
    floor = kernel_paths.gpu_floor_us()
    act = pd.DataFrame([{"hardware": H100, "primitive": "activation", "pass": "fwd", "dtype": "bf16",
                         "variant": "aten::gelu", "numel": n} for n in (1, 4096, 1 << 20, 1 << 28)])
    bmm = _bmm(H100, [(2, 2, 2, 1), (16, 16, 16, 2), (64, 64, 64, 1), (200, 200, 200, 1)])
    for rows in (act, bmm):
        out = models.predict(rows)
        assert (out["path"] == "roofline").all()
        roof = np.asarray(estimate_us(rows))
        want = roof if rows is bmm else np.maximum(floor, roof - (kernel_paths.KERNEL_OVERHEAD_US - floor))
        assert out["duration_us"].to_numpy() == pytest.approx(want)


@pytest.mark.parametrize("hardware", [H100, "A100-SXM4-80GB", "B200-180GB"])
def test_a_bmm_estimate_never_beats_the_dense_peak(hardware):
    models = ModelSet.load()
    spec = hardware_spec(hardware)
    shapes = [(4096, 4096, 4096, 64), (5185, 64, 5185, 16), (5, 5, 64, 12), (128, 128, 128, 1024), (1, 4096, 4096, 8)]
    rows = _bmm(hardware, shapes)
    t = models.predict(rows)["duration_us"].to_numpy() * 1e-6
    flops = 2.0 * rows["m"] * rows["n"] * rows["k"] * rows["batch"]
    assert (flops / t <= spec.peak_tflops_fp16 * 1e12).all()
