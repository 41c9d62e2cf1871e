"""Check predictions against measurements — the application's side of `tracekit diff` and `tracekit validate`.

This package reads files (traces through `extractors.kineto`'s public API, predictions, capture manifests, CSVs),
calls `predictor` to predict and `tracekit.compare` to compare, and returns plain dicts and DiffReports; the CLI
prints them and `tracekit.report` makes pages of them. One job per module:

- `published.py` — score predictions of published end-to-end results (`validate_published`, `read_published`,
  `--hardware-map` / `--set` parsing);
- `traces.py` — trace discovery and the inputs of a diff (trace files, a prediction JSON, a run's configuration);
- `diff.py` — a prediction against real traces (`diff_paths`, `diff_inputs`);
- `run.py` — validate a captured run, optionally refitting on it (`validate_run`);
- `hta.py` — the real side's breakdown measured by HTA where it can load the traces.

The names below are what the CLI and tests use.
"""
from .diff import diff_inputs, diff_paths
from .published import (
    PublishedRow,
    parse_hardware_map,
    parse_sets,
    read_published,
    validate_published,
)
from .run import validate_run

__all__ = [
    "PublishedRow", "diff_inputs", "diff_paths", "parse_hardware_map", "parse_sets", "read_published",
    "validate_published", "validate_run",
]
