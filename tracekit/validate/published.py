"""Score predictions of published end-to-end results: a CSV of measured iteration times (the `predictor.batch`
columns plus `iteration_time_s`) → each row predicted as `tracekit predict --batch` would, with its error.

Inputs: the CSV, optional `TEXT=HARDWARE_ID` mappings and Megatron settings for every row (`--hardware-map`,
`--set`), a ModelSet and a Calibration. Output: a plain dict (rows worst first, MAPE / median / p90 APE, rows that
could not be predicted). Raises InputError naming the file and line of a row it cannot read, ConfigError for a
malformed mapping or setting.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from extractors.jobs import parse_row, read_rows
from predictor import ModelSet, ape_stats, predict_rows
from tracekit.core.config import check_settings
from tracekit.core.errors import ConfigError, InputError

if TYPE_CHECKING:
    from extractors.jobs import BatchRow
    from predictor import Calibration
    from tracekit.core.cluster import Cluster
    from tracekit.core.config import TrainingConfig

REQUIRED_COLUMNS = ("hardware_gpu", "iteration_time_s")


@dataclass
class PublishedRow:
    """One measured end-to-end result: its CSV line, configuration and cluster (or why it cannot be predicted),
    and the measured iteration time."""

    line: int  # line in the CSV file (the header is line 1)
    ref: str
    config: TrainingConfig | None
    cluster: Cluster | None
    measured_s: float
    error: str | None
    parsed: BatchRow  # the row as `predictor.batch` read it: its stack (and constants), what was assumed


def parse_hardware_map(items: Iterable[str]) -> dict[str, str]:
    """`TEXT=HARDWARE_ID` pairs: a row whose hardware_gpu contains TEXT (case-insensitive) is predicted on
    HARDWARE_ID."""
    out: dict[str, str] = {}
    for item in items:
        text, eq, hardware = item.partition("=")
        if not eq or not text.strip() or not hardware.strip():
            raise ConfigError(f"--hardware-map expects TEXT=HARDWARE_ID, got {item!r}")
        out[text.strip()] = hardware.strip()
    return out


def parse_sets(items: Iterable[str]) -> dict[str, str]:
    """`KEY=VALUE` Megatron settings (`--set` of predict and validate); a key tracekit does not read is an error
    (with a suggestion), not an override silently without effect."""
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    try:
        check_settings(out)
    except ConfigError as exc:
        raise ConfigError(f"--set: {exc}") from exc
    return out


def read_published(path: str | Path, hardware_map: dict[str, str] | None = None,
                   overrides: dict[str, Any] | None = None) -> list[PublishedRow]:
    """Rows of an e2e CSV (the `predictor.batch` schema plus the measured `iteration_time_s`). Configurations and
    clusters are parsed as `tracekit predict --batch` does; `hardware_map` picks the hardware id of rows by a
    substring of their hardware_gpu text (else it is derived from that text)."""
    path = Path(path)
    header, cells = read_rows(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise InputError(path, f"not an e2e results CSV: lacks column(s) {', '.join(missing)}")
    rows = []
    for i, row in enumerate(cells):
        line = i + 2
        try:
            measured = float(row["iteration_time_s"])
        except ValueError:
            raise InputError(path, f"line {line}: iteration_time_s {row['iteration_time_s']!r} is not a number")
        if not measured > 0:
            raise InputError(path, f"line {line}: iteration_time_s must be positive, got {measured}")
        text = row.get("hardware_gpu", "")
        hardware = next((hw for key, hw in (hardware_map or {}).items() if key.lower() in text.lower()), None)
        parsed = parse_row(row, line, hardware, None, overrides)
        rows.append(PublishedRow(line, row.get("row_ref") or f"line {line}", parsed.config, parsed.cluster,
                                 measured, parsed.error, parsed))
    return rows


def validate_published(path: str | Path, hardware_map: dict[str, str] | None = None, models: ModelSet | None = None,
                       overrides: dict[str, Any] | None = None, calibration: Calibration | None = None,
                       on_batch: Callable[[int], None] | None = None, batch: int = 64) -> dict[str, Any]:
    """Predict every row of a published e2e CSV and score it: {"rows" (worst first), "mape", "median_ape",
    "p90_ape", "failed"}. `models`: a ModelSet (default: the bundled models); `overrides`: Megatron settings for
    every row (like `predict --set`); `calibration`: a predictor Calibration used instead of each row's stack
    profile constants (None: each row's own, as `predict --batch` uses them). Rows are predicted by
    `predictor.predict_rows`, the code path of `tracekit predict --batch`, in batches of `batch`; `on_batch(rows)`
    reports progress. A row that cannot be predicted is listed under "failed" and left out of the statistics."""
    rows = read_published(path, hardware_map, overrides)
    models = models if models is not None else ModelSet.load()
    out_rows: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    results = predict_rows([r.parsed for r in rows], models, calibration, batch, on_batch)
    for row, prediction in zip(rows, results):
        if isinstance(prediction, Exception):
            failed.append({"line": row.line, "ref": row.ref, "error": str(prediction)})
            continue
        c, where, stack = row.parsed.complete()
        predicted = float(prediction.iteration_time_s)
        out_rows.append({
            "line": row.line, "ref": row.ref, "hardware": where.hardware,
            "hardware_used": prediction.hardware_used, "cluster": prediction.cluster.name,
            "stack": stack.name, "notes": list(row.parsed.notes), "warnings": list(prediction.warnings),
            "world_size": c.world_size, "tp": c.tp, "pp": c.pp,
            "dp": c.dp, "micro_batch_size": prediction.config.micro_batch_size,
            "global_batch_size": c.global_batch_size,
            "num_layers": c.num_layers, "hidden_size": c.hidden_size,
            "measured_s": row.measured_s, "predicted_s": predicted, "error_s": predicted - row.measured_s,
            "ape": abs(predicted - row.measured_s) / row.measured_s,
        })
    if not out_rows:
        raise InputError(path, f"no row could be predicted (line {failed[0]['line']}: {failed[0]['error']})")
    summary = ape_stats([r["predicted_s"] for r in out_rows], [r["measured_s"] for r in out_rows])
    out_rows.sort(key=lambda r: -r["ape"])
    failed.sort(key=lambda f: f["line"])
    return {"file": str(path), "rows": out_rows, **summary, "failed": failed,
            "calibration": calibration.name if calibration is not None else "stack profiles"}
