"""Every benchmark script still imports what it names: three had stopped running (`ranking.py`, `collective_physics.py`,
`twin_links.py`) when the modules they read moved, and nothing noticed. Each is loaded as `python benchmarks/X.py`
loads it (its folder first on the path); what runs under `if __name__ == "__main__"` is not run (some are modules
other benchmarks import)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_the_benchmark_imports(script, monkeypatch):
    monkeypatch.syspath_prepend(str(script.parent))
    spec = importlib.util.spec_from_file_location(f"benchmark_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)  # an ImportError or NameError of a moved module fails here
