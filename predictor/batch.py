"""Predictions of many jobs at once (`tracekit predict --batch` and `tracekit validate --published` both call
`predict_rows`, so the same rows get the same predictions): the rows of a published table as read by
`extractors.jobs`, in chunks of one batched model call each."""
from __future__ import annotations

from typing import Any, Protocol, Sequence

from tracekit.core.calibration import Calibration
from tracekit.core.cluster import Cluster
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError
from tracekit.core.stacks import Stack


class JobRow(Protocol):
    """A row read as a job (`extractors.jobs.BatchRow`): its error, or its configuration, cluster and stack."""

    error: str | None

    @property
    def calibration(self) -> Calibration | None: ...

    def complete(self) -> tuple[TrainingConfig, Cluster, Stack]: ...


def predict_rows(rows: Sequence[JobRow], models: Any, calibration: Calibration | None = None, chunk: int = 64,
                 on_chunk: Any = None) -> list[Any]:
    """Every row predicted: `tracekit predict --batch` and `tracekit validate --published` both call this, so the
    same rows get the same predictions. A row's own stack constants unless `calibration` replaces them all; rows in
    chunks of `chunk` (one batched model call each), `on_chunk(rows_done)` after each. Returns one item per row, in
    order: its Prediction, or the exception that stopped it (a row that did not parse: ConfigError(its error))."""
    from predictor.predict import predict_many

    out: list[Any] = [None] * len(rows)
    good = []
    for i, row in enumerate(rows):
        if row.error is not None:
            out[i] = ConfigError(row.error)
        else:
            good.append(i)
    if on_chunk and len(good) < len(rows):
        on_chunk(len(rows) - len(good))
    for first in range(0, len(good), chunk):
        part = good[first:first + chunk]
        parsed = [rows[i].complete() for i in part]
        results = predict_many([config for config, _, _ in parsed], [where for _, where, _ in parsed], models,
                               [calibration if calibration is not None else rows[i].calibration for i in part])
        for i, result in zip(part, results):
            out[i] = result
        if on_chunk:
            on_chunk(len(part))
    return out
