"""The sample store under concurrency: many processes importing into one store lose nothing and write nothing twice,
and a process killed in the middle of an import never leaves an unreadable or inconsistent store."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import SAMPLES
from tracekit.core.store import SampleStore

ROOT = Path(__file__).resolve().parent.parent
TRACEKIT = str(Path(sys.executable).parent / "tracekit")  # the installed command of this virtualenv
#: 16 real published sample files: the seed paper's small Perlmutter/Vista operator tables and vTrain's tables
FILES = sorted([p for p in (SAMPLES / "estimate-train-time").glob("*/operator/*_fp16.csv")
                if p.stat().st_size < 40_000], key=lambda p: p.stat().st_size)[:9] + \
    sorted((SAMPLES / "vtrain-allreduce" / "a100").glob("AR_GPU*_LUT.csv"))


def _run_import(paths: list[Path], store: Path) -> int:
    """One `tracekit import` process per format for `paths`; rows written."""
    written = 0
    for fmt, group in (("ett", [p for p in paths if "AR_GPU" not in p.name]),
                       ("nccl-tests", [p for p in paths if "AR_GPU" in p.name])):
        if not group:
            continue
        extra = ["--hardware", "A100-SXM4-40GB"] if fmt == "nccl-tests" else []
        done = subprocess.run([TRACEKIT, "import", *map(str, group), "--format", fmt, *extra, "--store", str(store),
                               "--json"], capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        written += sum(f.get("written", 0) for f in json.loads(done.stdout).get("files", []))
    return written


def test_eight_processes_sixteen_files_nothing_lost_nothing_twice(tmp_path):
    assert len(FILES) == 16
    store = tmp_path / "store"
    with ThreadPoolExecutor(8) as pool:  # 8 importing processes at once, 2 files each
        list(pool.map(lambda i: _run_import(FILES[i::8], store), range(8)))
    sources = SampleStore(store).sources()
    assert len(sources) == 16
    samples = SampleStore(store).read()
    assert len(samples) == sum(s["rows"] for s in sources.values())
    assert _run_import(FILES, store) == 0  # everything is there exactly once: re-importing writes nothing
    assert not list(store.rglob("*.tmp"))


@pytest.mark.parametrize("delay_s", [0.4, 1.0, 2.0])
def test_an_import_killed_at_any_point_leaves_a_consistent_store(tmp_path, delay_s):
    store = tmp_path / "store"
    _run_import(FILES[:2], store)
    before = SampleStore(store).sources()
    proc = subprocess.Popen([TRACEKIT, "import", *map(str, FILES[2:9]), "--format", "ett",
                             "--store", str(store)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(delay_s)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    after = SampleStore(store)
    sources = after.sources()  # readable
    assert set(before) <= set(sources)
    samples = after.read()
    assert len(samples) == sum(s["rows"] for s in sources.values())  # every recorded source whole, nothing else
    counts = samples.groupby("source").size().to_dict()
    assert counts == {sid: meta["rows"] for sid, meta in sources.items()}
    _run_import(FILES[:9], store)  # a rerun completes what the killed one did not record
    assert set(SampleStore(store).sources()) >= set(sources) and len(SampleStore(store).sources()) == 9
