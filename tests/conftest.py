"""Shared fixtures: where the real corpus lives (CI has ../shared beside the checkout)."""
from __future__ import annotations

import atexit
import csv
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("TRACEKIT_CORPUS", ROOT.parent / "shared" / "corpus"))
KINETO = CORPUS / "kineto"
SAMPLES = CORPUS / "operator-samples"
E2E = CORPUS / "e2e"
TRACES = ROOT / "traces"

# Measured CPU rates are cached per machine; tests (and their subprocesses) keep theirs out of the user's cache,
# in a folder removed when the session ends.
if "TRACEKIT_CACHE_DIR" not in os.environ:
    os.environ["TRACEKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="tracekit-test-cache-")
    atexit.register(shutil.rmtree, os.environ["TRACEKIT_CACHE_DIR"], ignore_errors=True)


def bridge_rows() -> list[tuple[int, dict[str, str]]]:
    """(CSV line, cells) of every row of the corpus's Megatron-Bridge table (line 1 is the header), as
    `predictor.batch.parse_row` takes them."""
    with (E2E / "megatron_bridge_perf.csv").open(newline="") as f:
        return list(enumerate(csv.DictReader(f), start=2))


@pytest.fixture(scope="session")
def corpus() -> Path:
    assert CORPUS.is_dir(), f"the shared corpus is expected at {CORPUS} (set TRACEKIT_CORPUS)"
    return CORPUS


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray of 2 CPUs for the whole session (each start costs seconds); skipped without the extra."""
    ray = pytest.importorskip("ray")
    from tracekit.core.ray_runtime import connect

    connect(num_cpus=2, object_store_memory=80 * 1024 * 1024)
    yield ray
    ray.shutdown()


def dump_dom(page: Path, profile: Path) -> str:
    """The DOM headless Chromium renders for an HTML page (scripts run), with its profile in `profile`."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "headless Chromium is required (Debian package `chromium`; .ci/run installs it)"
    done = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", f"--user-data-dir={profile}", "--dump-dom",
         page.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
