"""The physics fallback (roofline from datasheet peaks, hand-computed here) and how ModelSet.predict chooses between
a model, a derived estimate (related collective, sibling device) and the roofline."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from extractors import ett
from predictor.costs.learned.models import ModelSet
from predictor.costs.learned.training import train_models
from predictor.costs.physics import roofline
from tests.conftest import SAMPLES

ETT = SAMPLES / "estimate-train-time"


def op(**row) -> dict:
    return {"dtype": "fp16", "variant": None, **row}


def test_gemm_roofline_from_datasheet_peak():
    frame = pd.DataFrame([op(hardware="H100-80GB-HBM3", primitive="gemm", **{"pass": "fwd"}, m=4096, n=4096, k=4096,
                             batch=1)])
    flops = 2 * 4096**3
    compute_us = flops / (989e12 * 0.7) * 1e6  # dense fp16 tensor peak of the H100 SXM datasheet, 70% achievable
    memory_us = 2 * 3 * 4096**2 / (3350e9 * 0.8) * 1e6
    assert compute_us > memory_us
    assert roofline.estimate_us(frame)[0] == pytest.approx(compute_us + 5.0, rel=1e-9)


def test_memory_bound_and_collective_rooflines():
    frame = pd.DataFrame([
        op(hardware="MI300X", primitive="norm", **{"pass": "bwd"}, rows=8192, width=8192, numel=8192 * 8192),
        op(hardware="B200-180GB", primitive="all_reduce", **{"pass": "comm"}, bytes=2**30, group_size=8,
           ranks_per_node=8, nodes=1),
        op(hardware="A100-SXM4-40GB", primitive="all_gather", **{"pass": "comm"}, bytes=2**26, group_size=16,
           ranks_per_node=8, nodes=2),
    ])
    est = roofline.estimate_us(frame)
    assert est[0] == pytest.approx(3 * 2 * 8192**2 / (5300e9 * 0.8) * 1e6 + 5.0)  # read x, dy; write dx
    assert est[1] == pytest.approx(2 * 7 / 8 * 2**30 / (900e9 * 0.8) * 1e6 + 14 * 3.0 + 5.0)
    assert est[2] == pytest.approx(15 * 2**26 / (25e9 * 0.8) * 1e6 + 15 * 10.0 + 5.0)


def test_unknown_hardware_has_no_roofline():
    """No datasheet peaks → no estimate (NaN), never a bare launch overhead posing as a time."""
    frame = pd.DataFrame([op(hardware="Z9000", primitive="gemm", **{"pass": "fwd"}, m=4096, n=4096, k=4096, batch=1),
                          op(hardware="Z9000", primitive="all_reduce", **{"pass": "comm"}, bytes=2**20, group_size=8,
                             ranks_per_node=8, nodes=1)])
    assert np.isnan(roofline.estimate_us(frame)).all()


def test_cpu_rates_are_measured_and_cached():
    first = roofline.rates("cpu-test-machine")
    assert first is roofline.rates("cpu-other-name")  # this machine's CPU, looked up once per process
    assert 1e8 < first.vector_flops < 1e14 and 1e8 < first.mem_bw < 1e13
    frame = pd.DataFrame([op(hardware="cpu-test-machine", primitive="gemm", **{"pass": "fwd"}, dtype="fp32",
                             m=512, n=512, k=512, batch=1)])
    expected = max(2 * 512**3 / (first.vector_flops * 0.7), 4 * 3 * 512**2 / (first.mem_bw * 0.8)) * 1e6 + 5.0
    assert roofline.estimate_us(frame)[0] == pytest.approx(expected)


def test_cpu_rates_are_kept_per_machine(tmp_path):
    """Every process predicts with the same CPU rates: measured once, then read from the cache file; a corrupt
    file is measured over and replaced."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "TRACEKIT_CACHE_DIR": str(tmp_path)}
    code = "from predictor.costs.physics import roofline; r = roofline.rates('cpu-x'); print(r.vector_flops, r.mem_bw)"
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert runs[0] == runs[1]
    (hardware, recorded), = json.loads((tmp_path / "cpu-rates.json").read_text()).items()
    assert hardware.startswith("cpu-") and f"{recorded['vector_flops']} {recorded['mem_bw']}\n" == runs[0]
    (tmp_path / "cpu-rates.json").write_text("{truncated")
    rerun = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert float(rerun.stdout.split()[0]) > 1e8
    assert set(json.loads((tmp_path / "cpu-rates.json").read_text())) == {hardware}


@pytest.fixture(scope="module")
def comm_models(tmp_path_factory):
    """A100 all-gather models only (two intra-node topologies of the paper's sweep, first 150 rows each)."""
    frames = [ett.read_file(ETT / "Perlmutter" / "nccl" / f"NVIDIAA100-SXM4-80GB_allgather_large_fp16_1_{g}.csv")
              .head(150) for g in (2, 4)]
    frames.append(ett.read_file(ETT / "Perlmutter" / "operator" / "NVIDIAA100-SXM4-80GB_res_add_fp16.csv"))
    out = tmp_path_factory.mktemp("comm") / "models"
    train_models(pd.concat(frames, ignore_index=True), out, {}, folds=2)
    return ModelSet.load(out)


def test_paths_model_derived_and_roofline(comm_models):
    base = dict(hardware="A100-SXM4-80GB", **{"pass": "comm"}, group_size=4, ranks_per_node=4, nodes=1)
    b = 2 * 150e6
    ops = pd.DataFrame([
        op(primitive="all_gather", bytes=b, **base),
        op(primitive="reduce_scatter", bytes=b, **base),
        op(primitive="all_reduce", bytes=4 * b, **base),
        op(primitive="all_gather", bytes=b, **{**base, "hardware": "H100-80GB-HBM3"}),
        op(hardware="A100-SXM4-40GB", primitive="elementwise", **{"pass": "fwd"}, variant="res_add", rows=8192,
           width=4096, numel=8192 * 4096),
        op(hardware="A100-SXM4-80GB", primitive="elementwise", **{"pass": "fwd"}, variant="res_add", rows=8192,
           width=4096, numel=8192 * 4096),
    ])
    ops.index = [10, 11, 12, 13, 14, 15]
    out = comm_models.predict(ops)
    assert list(out.index) == [10, 11, 12, 13, 14, 15]
    assert out["path"].tolist() == ["model", "derived", "derived", "roofline", "derived", "model"]
    ag = out.loc[10, "duration_us"]
    assert out.loc[11, "duration_us"] == pytest.approx(ag)  # reduce-scatter: same traffic as all-gather
    assert out.loc[12, "duration_us"] == pytest.approx(2 * ag)  # all-reduce of 4b = RS + AG of b each (n = 4)
    assert out.loc[13, "duration_us"] == pytest.approx(roofline.estimate_us(ops.loc[[13]])[0])
    assert bool(out.loc[13, "out_of_range"])
    # 40 GB part: the 80 GB model scaled by the ratio of the two rooflines (bandwidth 1555 vs 2039 GB/s)
    ratio = roofline.estimate_us(ops.loc[[14]])[0] / roofline.estimate_us(ops.loc[[15]])[0]
    assert out.loc[14, "duration_us"] == pytest.approx(out.loc[15, "duration_us"] * ratio)
    assert ratio == pytest.approx((2 * 2 * 8192 * 4096 / (1555e9 * 0.8) * 1e6 + 5)
                                  / (2 * 2 * 8192 * 4096 / (2039e9 * 0.8) * 1e6 + 5))


def test_prediction_is_vectorized_and_flags_out_of_range(comm_models):
    shapes = np.geomspace(1e6, 1e10, 2000)
    ops = pd.DataFrame({"hardware": "A100-SXM4-80GB", "primitive": "all_gather", "pass": "comm", "dtype": "fp16",
                        "variant": None, "bytes": shapes, "group_size": 2.0, "ranks_per_node": 2.0, "nodes": 1.0})
    out = comm_models.predict(ops)
    meta = next(m.meta for m in comm_models.models if m.primitive == "all_gather" and m.group == "1x2")
    lo, hi = meta["ranges"]["bytes"]
    assert out["out_of_range"].tolist() == [not (lo <= s <= hi) for s in shapes]
    assert (out["path"] == "model").all() and np.isfinite(out["duration_us"]).all()


def test_a_cpu_model_predicts_the_same_on_a_machine_with_other_rates(tmp_path):
    """Models carry the CPU rates they were normalised with: trained where this CPU measured R, loaded where it
    measures R/7 (another machine's cache file), they give the same estimates — not ones shifted by the features."""
    import json
    import subprocess
    import sys

    from predictor.costs.physics.roofline import cpu_rates
    from tracekit.core.hardware import cpu_hardware_id

    here = cpu_rates()
    fast, slow = tmp_path / "fast", tmp_path / "slow"
    for folder, factor in ((fast, 1.0), (slow, 1 / 7)):
        folder.mkdir()
        rates = {k: (v * factor if k != "sms" else v) for k, v in here.__dict__.items()}
        (folder / "cpu-rates.json").write_text(json.dumps({cpu_hardware_id(): rates}))
    data = Path(__file__).parent / "data" / "cpu_collectives.csv"
    train = (f"import pandas as pd; from predictor.costs.learned.training import train_models; "
             f"train_models(pd.read_csv({str(data)!r}, comment='#'), {str(tmp_path / 'set')!r}, {{}}, folds=2)")
    ask = (f"import pandas as pd; from predictor.costs.learned.models import ModelSet; "
           f"s = pd.read_csv({str(data)!r}, comment='#').drop(columns='duration_us'); "
           f"print(list(ModelSet.load({str(tmp_path / 'set')!r}).predict(s)['duration_us']))")

    def run(code: str, cache) -> str:
        env = {**os.environ, "TRACEKIT_CACHE_DIR": str(cache)}
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent.parent).stdout

    run(train, fast)
    assert run(ask, fast) == run(ask, slow)
    recorded = json.loads((tmp_path / "set" / "index.json").read_text())["rates"]
    assert set(recorded) == {"cpu-intel-xeon-processor"}
    assert recorded["cpu-intel-xeon-processor"]["vector_flops"] == pytest.approx(here.vector_flops)
