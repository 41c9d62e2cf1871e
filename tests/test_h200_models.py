"""The bundled H200 models (#35): trained on `tracekit sample --device cuda` rows of one H200, stored by the tracekit of
that day under the id `H200`, read as the datasheet's `H200-141GB`; they answer H200 rows and are no transfer source
for other GPUs, since the sampler's times on a GPU are the host's wall clock, not kernel times."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from predictor.costs.learned.models import ModelSet
from predictor.costs.physics.roofline import estimate_us
from predictor.costs.physics.transfer import WALL_CLOCK_SOURCES, kernel_timed, transfer_candidates
from tests.conftest import SAMPLES
from tracekit.core.hardware import hardware_spec
from tracekit.core.store import SampleStore

STORE = SAMPLES / "h200-tracekit-sample" / "store"


def test_the_h200_store_reads_under_the_datasheet_id():
    recorded = json.loads((STORE / "sources.json").read_text())
    assert {meta["hardware"] for meta in recorded.values()} == {"H200"}  # what the sampler wrote that day
    rows = sum(meta["rows"] for meta in recorded.values())
    store = SampleStore(STORE)
    for asked in ("H200-141GB", "H200", None):
        frame = store.read(hardware=asked)
        assert len(frame) == rows and set(frame["hardware"]) == {"H200-141GB"}
    assert store.read(hardware="H100-80GB-HBM3").empty


def test_the_samples_are_wall_clock_times_with_a_host_floor():
    """Why they are no transfer source: every row holds a launch and a synchronize. Facts of the corpus rows: none
    is under 30 µs, no GEMM under 50 µs, and the small GEMMs take over four times their roofline (a median ten)."""
    frame = SampleStore(STORE).read()
    assert frame["duration_us"].min() > 30 and frame.loc[frame["primitive"] == "gemm", "duration_us"].min() > 50
    gemm = frame[(frame["primitive"] == "gemm") & (frame["pass"] == "fwd")]
    small = gemm[gemm["m"] * gemm["n"] * gemm["k"] <= 1024 * 2048 * 1024]
    assert len(small) and (small["duration_us"].to_numpy() > 4 * np.asarray(estimate_us(small))).all()
    assert set(frame["source_path"]) <= WALL_CLOCK_SOURCES


def test_h200_rows_take_the_h200_models_and_other_gpus_never_draw_on_them():
    models = ModelSet.load()
    h200 = [m for m in models.models if m.hardware == "H200-141GB"]
    assert h200 and not any(kernel_timed(m) for m in h200)
    assert all(kernel_timed(m) for m in models.models if m.hardware != "H200-141GB")
    for primitive in ("gemm", "norm", "elementwise", "softmax"):
        assert "H200-141GB" not in transfer_candidates(models, primitive, "fwd")
    # an H200 GEMM inside the sampled shapes, and the same rows on parts that have no models of their own
    rows = pd.DataFrame({"primitive": "gemm", "pass": "fwd", "dtype": "bf16", "variant": None,
                         "m": [8192.0, 16384.0], "n": [6144.0, 8192.0], "k": [2048.0, 8192.0], "batch": 1.0})
    on_h200 = models.predict(rows.assign(hardware="H200-141GB"))
    assert (on_h200["path"] == "model").all()
    flops = 2 * rows["m"] * rows["n"] * rows["k"]
    peak = hardware_spec("H200-141GB").peak_tflops("bf16") * 1e12
    assert (on_h200["duration_us"].to_numpy() >= (flops / peak * 1e6).to_numpy()).all()  # never above the peak
    for other in ("H800-80GB-HBM3", "V100-SXM2-32GB"):
        answered = models.predict(rows.assign(hardware=other))
        assert (answered["path"] == "transfer").all(), other
        assert not answered["sources"].str.contains("H200-141GB").any(), other


def test_a_wall_clock_model_answers_only_well_above_its_host_round_trip():
    """A wall-clock sample is the kernel's time only where the host's round trip (the model's shortest sample) is a
    small part of it: an H200 row the H200 model answers below five times its floor takes the kernel-timed paths
    instead (a training step launches its kernels without waiting for each), while a large GEMM keeps the H200's
    own measurement. The floor is a fact of the store: the shortest sample of the model's rows."""
    models = ModelSet.load()
    frame = SampleStore(STORE).read()
    for model in (m for m in models.models if m.hardware == "H200-141GB"):
        rows = frame[(frame["primitive"] == model.primitive) & (frame["pass"] == model.pass_)]
        assert model.meta["floor_us"] >= rows["duration_us"].min() - 1e-3, model.id
    tiny = pd.DataFrame({"hardware": "H200-141GB", "primitive": "elementwise", "pass": "fwd", "dtype": "bf16",
                         "variant": "res_add", "rows": [2048.0], "width": [1024.0], "numel": [2048.0 * 1024]})
    answered = models.predict(tiny)
    floor = next(m for m in models.models if m.id == "H200-141GB__elementwise__fwd__all").meta["floor_us"]
    assert answered["path"].iloc[0] != "model"
    assert answered["duration_us"].iloc[0] < floor  # a 4 MiB add: microseconds of HBM traffic, not a round trip
    big = pd.DataFrame({"hardware": "H200-141GB", "primitive": "gemm", "pass": "fwd", "dtype": "bf16",
                        "variant": None, "m": [16384.0], "n": [8192.0], "k": [8192.0], "batch": 1.0})
    kept = models.predict(big)
    gemm_floor = next(m for m in models.models if m.id == "H200-141GB__gemm__fwd__all").meta["floor_us"]
    assert kept["path"].iloc[0] == "model" and kept["duration_us"].iloc[0] >= 5 * gemm_floor
