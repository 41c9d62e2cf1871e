"""Where the data shipped with tracekit lives (`tracekit/data/`: datasheets, stack profiles, bundled models, fitted
constants), so that every reader names it one way wherever its module sits."""
from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"
