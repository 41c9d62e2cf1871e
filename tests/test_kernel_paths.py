"""Unaligned shapes on NVIDIA GPUs: the kernels they force and what they cost (`predictor.kernel_paths`, #24).

Physics and invariants, on the bundled models and the datasheet table: an unaligned shape is never predicted faster
than the next aligned one, no estimate beats the dtype's dense peak or the memory bandwidth, the scalar path moves
every operand at least once, and the fitted rate is below one warp-wide instruction per clock."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from predictor import kernel_paths
from predictor.models import ModelSet
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
