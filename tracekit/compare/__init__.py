"""Trace comparison: a prediction against the real traces of the same configuration, and where the error comes from.

Why here, in the application layer (beside `tracekit/validate`, `tracekit/report`) and not in `predictor/`: the
comparison joins what the two library parts produce — real runs parsed by `extractors.kineto` (`KinetoTrace`) and
predictions made by `predictor` (`Prediction.to_dict()`, or predicted traces read back by the same extractor) — and
by the dependency rule only application modules may depend on both. It is not part of the model: nothing in
`predictor/` or `extractors/` uses it. It imports neither of them at run time (traces are typed under
TYPE_CHECKING, predictions are plain dicts), only `tracekit.core`, numpy and pandas; reading files, HTA and
writing pages are the callers' (`tracekit.validate`, `tracekit.report`).

Modules, one job each:

- `sides.py` — one side (real or predicted traces) summarized per rank and iteration (`summarize_traces`, `Side`,
  `RankSummary`, `trace_groups`, `side_breakdown`);
- `prediction.py` — a prediction dict as a Side (`summarize_prediction`);
- `checks.py` — whether both sides can be the same job (`check_same_configuration`, `check_same_split`);
- `tables.py` — the comparison tables (per primitive / pass / layer / stage, largest contributors, unmatched);
- `diff.py` — `diff_sides` → `DiffReport` (its `to_dict()` is the `--json` document);
- `breakdown.py` — tracekit's own measure of an iteration's compute, exposed communication, bubble, optimizer.

Rows are data: the sentences people read are made in `tracekit.report.diff_text`.
"""
from .breakdown import IterationBreakdown, iteration_breakdown, mean_breakdown
from .checks import check_same_configuration, check_same_split
from .diff import DiffReport, diff_sides
from .prediction import summarize_prediction
from .sides import RankSummary, Side, side_breakdown, summarize_traces, trace_groups

__all__ = [
    "DiffReport", "IterationBreakdown", "RankSummary", "Side", "check_same_configuration", "check_same_split",
    "diff_sides", "iteration_breakdown", "mean_breakdown", "side_breakdown", "summarize_prediction",
    "summarize_traces", "trace_groups",
]
