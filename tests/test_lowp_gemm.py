"""GEMM rates per dtype with the bundled models: a model where the dtype was measured, else the bf16 estimate at a
learned speed-up; physics the estimates must obey whatever path answers (never faster than the dtype's dense peak,
low precision never slower than bf16, a newer GPU faster on large GEMMs), and a clear error for a dtype a part has no
tensor cores for."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from extractors import xla_gemm
from predictor.costs.learned.models import ModelSet
from predictor.costs.physics.lowp_gemm import GRID, learn
from tests.conftest import SAMPLES
from tracekit.core.errors import ConfigError
from tracekit.core.hardware import SPECS

DTYPES = ("fp32", "fp16", "bf16", "fp8", "fp8_block", "mxfp8", "nvfp4", "mxfp4")
GPUS = tuple(SPECS)
LARGE = [(m, n, k) for m in (4096, 8192, 16384) for n in (4096, 8192) for k in (4096, 8192, 16384)]


def rows(hardware: str, dtype: str, shapes, primitive: str = "gemm", batch: int = 1, pass_: str = "fwd",
         role: str | None = None) -> pd.DataFrame:
    return pd.DataFrame([{"hardware": hardware, "primitive": primitive, "pass": pass_, "dtype": dtype, "role": role,
                          "m": float(m), "n": float(n), "k": float(k), "batch": float(batch)} for m, n, k in shapes])


def tflops(frame: pd.DataFrame, us: np.ndarray) -> np.ndarray:
    return 2 * frame["batch"] * frame["m"] * frame["n"] * frame["k"] / us / 1e6


@pytest.fixture(scope="module")
def models() -> ModelSet:
    return ModelSet.load()


def test_b200_bf16_is_faster_than_h100_on_every_large_shape(models):
    for primitive, batch in (("gemm", 1), ("bmm", 4)):
        h100 = models.predict(rows("H100-80GB-HBM3", "bf16", LARGE, primitive, batch))["duration_us"].to_numpy()
        b200 = models.predict(rows("B200-180GB", "bf16", LARGE, primitive, batch))["duration_us"].to_numpy()
        assert (b200 < h100).all(), list(zip(LARGE, h100, b200))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hardware=st.sampled_from(GPUS), dtype=st.sampled_from(DTYPES),
       shape=st.tuples(*[st.sampled_from([1, 16, 100, 256, 1000, 2048, 4096, 5185, 8192, 16384, 53248])] * 3),
       primitive=st.sampled_from(["gemm", "bmm"]), batch=st.sampled_from([1, 2, 8, 64]),
       pass_role=st.sampled_from([("fwd", None), ("bwd", "dgrad"), ("bwd", "wgrad"), ("bwd", None)]))
def test_no_estimate_exceeds_its_dtypes_dense_peak(models, hardware, dtype, shape, primitive, batch, pass_role):
    spec = SPECS[hardware]
    frame = rows(hardware, dtype, [shape], primitive, batch, *pass_role)
    if spec.peak_tflops(dtype) == 0:
        with pytest.raises(ConfigError, match=f"{hardware} has no tensor cores for {dtype} GEMMs"):
            models.predict(frame)
        return
    out = models.predict(frame)
    us = out["duration_us"].to_numpy()
    assert np.isfinite(us).all() and (us > 0).all()
    whole = 2.0 if pass_role == ("bwd", None) else 1.0  # a whole backward is dgrad + wgrad
    assert (tflops(frame, us) * whole <= spec.peak_tflops(dtype) * (1 + 1e-9)).all(), out.to_dict("records")


@pytest.mark.parametrize("hardware", ["H100-80GB-HBM3", "H200-141GB", "MI300X", "B200-180GB", "GB200-186GB"])
def test_fp8_is_faster_than_bf16_and_never_above_its_peak(models, hardware):
    shapes = [(m, n, k) for m in (256, 1024, 4096, 16384) for n in (1024, 8192) for k in (512, 4096, 16384)]
    half = models.predict(rows(hardware, "bf16", shapes))["duration_us"].to_numpy()
    low = models.predict(rows(hardware, "fp8", shapes))
    us = low["duration_us"].to_numpy()
    bounded = (low["path"] == "lowp").to_numpy()
    assert (us[bounded] <= half[bounded] * (1 + 1e-9)).all()  # the bounded estimate: never slower than bf16
    big = np.array([m * n * k >= 4096**3 for m, n, k in shapes])
    assert (us[big] < half[big]).all()  # compute-bound: the fp8 tensor cores win, measured (B200) or estimated
    assert (tflops(rows(hardware, "fp8", shapes), us) <= SPECS[hardware].peak_tflops("fp8") * (1 + 1e-9)).all()


def test_h100_fp8_is_a_bounded_estimate_and_b200_fp8_a_measured_model(models):
    h100 = models.predict(rows("H100-80GB-HBM3", "fp8", [(2048, 2048, 2048)]))
    # its speed-up curve is its own architecture's: H200's measured fp8 table (one die), not Blackwell's
    assert h100["path"].iat[0] == "lowp" and "learned from H200-141GB fp8)" in h100["sources"].iat[0]
    b200 = models.predict(rows("B200-180GB", "fp8", [(2048, 2048, 2048)]))
    assert b200["path"].iat[0] == "model"
    mi355 = models.predict(rows("MI355X", "fp8_block", [(4096, 4096, 4096)]))
    assert mi355["path"].iat[0] == "model"


def test_a_dtype_without_tensor_cores_names_the_gpu_and_the_dtype(models):
    with pytest.raises(ConfigError, match="H100-80GB-HBM3 has no tensor cores for mxfp8 GEMMs"):
        models.predict(rows("H100-80GB-HBM3", "mxfp8", [(4096, 4096, 4096)]))
    with pytest.raises(ConfigError, match="MI355X has no tensor cores for nvfp4 GEMMs"):
        models.predict(rows("MI355X", "nvfp4", [(4096, 4096, 4096)]))


def test_fp32_is_never_faster_than_bf16_nor_its_own_peak(models):
    shapes = [(64, 64, 64), (4096, 4096, 4096)]
    half = models.predict(rows("H100-80GB-HBM3", "bf16", shapes))["duration_us"].to_numpy()
    full = models.predict(rows("H100-80GB-HBM3", "fp32", shapes))["duration_us"].to_numpy()
    assert (full >= half).all()
    assert tflops(rows("H100-80GB-HBM3", "fp32", shapes), full)[1] <= SPECS["H100-80GB-HBM3"].peak_tflops_fp32


def test_the_learned_speed_up_rises_with_bf16_efficiency_and_stays_within_the_peak_ratio():
    samples = xla_gemm.read_file(SAMPLES / "xla-matmul" / "b200_sm100.csv").samples
    (curve,) = learn(samples)
    f = np.array(curve["f"])
    assert curve["hardware"] == "B200-180GB" and curve["dtype"] == "fp8" and curve["shapes"] == 375
    assert len(f) == len(GRID) and (np.diff(f) >= 0).all() and f.min() >= 0 and f.max() <= 1
    # measured: small GEMMs gain little from fp8, the largest nearly the whole peak ratio
    assert f[1] < 0.3 < 0.7 < f[14]


@pytest.mark.parametrize("pass_,role", [("fwd", None), ("bwd", "dgrad"), ("bwd", "wgrad"), ("bwd", None)])
def test_h100_fp8_gains_more_the_larger_the_gemm_and_never_loses_to_bf16(models, pass_, role):
    """The fp8/bf16 speed-up of H100's bounded estimate grows with the GEMM (fixed costs weigh less), from nothing for
    a launch-bound GEMM to most of the datasheet ratio, in every pass and backward role."""
    sizes = [128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384]
    frame = rows("H100-80GB-HBM3", "fp8", [(s, s, s) for s in sizes], pass_=pass_, role=role)
    low = models.predict(frame)["duration_us"].to_numpy()
    half = models.predict(frame.assign(dtype="bf16"))["duration_us"].to_numpy()
    speedup = half / low
    assert (np.diff(speedup) >= -1e-9).all(), speedup
    ratio = SPECS["H100-80GB-HBM3"].peak_tflops("fp8") / SPECS["H100-80GB-HBM3"].peak_tflops("bf16")
    assert (speedup >= 1 - 1e-9).all() and (speedup <= ratio * (1 + 1e-9)).all()
    assert speedup[0] < 1.05 < 1.5 < speedup[-1]  # a launch-bound GEMM gains nothing, a large one most of 2×

