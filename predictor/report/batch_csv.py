"""A batch of predictions as a table (`tracekit predict --batch --csv-out`): every input column of the row, then
OUTPUT_COLUMNS — the prediction (blank on error), what was assumed reading the row, warnings and the error."""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Protocol

from predictor.schedule.pipeline import BREAKDOWN
from tracekit.core.stacks import Stack

OUTPUT_COLUMNS = (
    "predicted_iteration_time_s", *(f"predicted_{k}_s" for k in BREAKDOWN), "predicted_tflops_per_gpu",
    "predicted_mfu", "predicted_tokens_per_s", "predicted_memory_gb_per_gpu", "hardware_used", "cluster", "stack",
    "prediction_notes", "warnings", "error",
)


class InputRow(Protocol):
    """What a table row read as a job (`extractors.jobs.BatchRow`) carries into its output row."""

    cells: dict[str, str]
    stack: Stack | None
    notes: list[str]


def output_row(row: InputRow, prediction: Any = None, error: str | None = None) -> dict[str, Any]:
    """The row's input cells + prediction columns (blank on error) + what was assumed reading it."""
    out: dict[str, Any] = dict(row.cells)
    if prediction is not None:
        out["predicted_iteration_time_s"] = f"{prediction.iteration_time_s:.6g}"
        for key in BREAKDOWN:
            out[f"predicted_{key}_s"] = f"{prediction.breakdown[key]:.6g}"
        out["predicted_tflops_per_gpu"] = f"{prediction.tflops_per_gpu:.4g}"
        out["predicted_mfu"] = "" if prediction.mfu is None else f"{prediction.mfu:.4g}"
        out["predicted_tokens_per_s"] = f"{prediction.tokens_per_s:.6g}"
        out["predicted_memory_gb_per_gpu"] = f"{prediction.memory_gb_per_gpu['total']:.3g}"
        out["hardware_used"] = prediction.hardware_used
        out["cluster"] = prediction.cluster.name
        out["stack"] = row.stack.name if row.stack else ""
        out["warnings"] = " | ".join(prediction.warnings)
        out["error"] = ""
    else:
        out.update({c: "" for c in OUTPUT_COLUMNS})
        out["error"] = error or "failed"
    out["prediction_notes"] = " | ".join(row.notes)
    return out


def write_rows(path: str | Path, header: list[str], rows: list[dict[str, Any]]) -> None:
    """The output CSV (input columns first, then OUTPUT_COLUMNS), written atomically."""
    from tracekit.core.atomic import atomic_write_text

    columns = header + [c for c in OUTPUT_COLUMNS if c not in header]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())
