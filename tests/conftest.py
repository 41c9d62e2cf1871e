"""Shared fixtures: where the real corpus lives (CI has ../shared beside the checkout)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("TRACEKIT_CORPUS", ROOT.parent / "shared" / "corpus"))
KINETO = CORPUS / "kineto"
SAMPLES = CORPUS / "operator-samples"
E2E = CORPUS / "e2e"
TRACES = ROOT / "traces"


@pytest.fixture(scope="session")
def corpus() -> Path:
    assert CORPUS.is_dir(), f"the shared corpus is expected at {CORPUS} (set TRACEKIT_CORPUS)"
    return CORPUS
