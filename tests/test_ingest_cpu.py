"""CPU runs: the HTA cpu_only fixture, and a 2-rank gloo run captured here with torch.profiler."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from extractors.kineto import ingest_paths, read_trace
from tests.conftest import KINETO
from tracekit.core.hardware import cpu_hardware_id
from tracekit.core.store import SampleStore

CAPTURE = Path(__file__).parent / "data" / "gloo_capture.py"


def test_hta_cpu_only_fixture_is_a_cpu_run():
    trace = read_trace(KINETO / "hta" / "cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    assert trace.is_cpu_run and trace.hardware == "cpu-unknown"  # torch does not record the CPU model
    assert (trace.rank, trace.world_size) == (34, 300)
    events = trace.device_events
    gloo = events[events["name"] == "gloo:all_reduce"]
    assert len(gloo) == 10 and set(gloo["primitive"]) == {"all_reduce"}
    # message sizes recorded in the file: Input Dims [[321271]] and [[2082411]] of type float
    assert sorted(set(gloo["bytes"])) == [321271 * 4, 2082411 * 4]
    assert set(gloo["group_size"]) == {300.0}  # the default group: world size
    assert set(events.loc[events["name"] == "aten::empty", "category"]) == {"computation"}


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gloo")
    done = subprocess.run([sys.executable, str(CAPTURE), str(out)], timeout=240, capture_output=True, text=True)
    assert done.returncode == 0, f"gloo capture failed:\n{done.stderr[-4000:]}"
    return out


def test_captured_gloo_run_ingests_as_cpu_samples(gloo_run, tmp_path):
    store = SampleStore(tmp_path / "store")
    result = ingest_paths([gloo_run], store)
    assert not result.errors and len(result.traces) == 2
    assert result.matched_collectives == 6  # 3 steps × 2 all_reduces, on both ranks
    samples = store.read()
    assert set(samples["hardware"]) == {cpu_hardware_id()}
    reduce = samples[samples["primitive"] == "all_reduce"]
    assert len(reduce) == 12
    assert sorted(set(reduce["bytes"])) == [1000 * 4, 64 * 32 * 4]  # the tensors the script all-reduces
    assert set(reduce["group_size"]) == {2.0} and set(reduce["dtype"]) == {"fp32"}
    assert reduce["wait_us"].notna().all() and (reduce["duration_us"] >= 0).all()
    gemm = samples[samples["primitive"] == "gemm"]
    assert len(gemm) == 6
    assert set(zip(gemm["m"], gemm["k"], gemm["n"])) == {(64.0, 128.0, 32.0)}
    assert sorted(samples["iteration"].dropna().unique()) == [1, 2, 3]
    # the gloo:send / gloo:recv work records sit inside c10d::send / c10d::recv_ on the calling thread
    p2p = samples[samples["primitive"] == "send_recv"]
    assert sorted(p2p["rank"].tolist()) == [0, 0, 0, 1, 1, 1]
    assert set(p2p["bytes"]) == {64 * 32 * 4} and set(p2p["group_size"]) == {2.0}
    assert p2p["wait_us"].isna().all()  # point-to-point transfers are not matched
