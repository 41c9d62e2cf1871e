"""Predictions of many jobs at once (`tracekit predict --batch` and `tracekit validate --published` both call
`predict_rows`, so the same rows get the same predictions): the rows of a published table as read by
`extractors.jobs`, in chunks of one batched model call each.

A row that does not state its micro-batch is predicted at Megatron's default (1, said in its notes), and also at the
micro-batches of `MICRO_BATCHES` its global batch and data parallelism allow: one warning of its prediction says what
each would give (the table does not say which the run used, so none is picked by the measured time)."""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence

from tracekit.core.calibration import Calibration
from tracekit.core.cluster import Cluster
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError
from tracekit.core.stacks import Stack

#: The other micro-batches a row without one of its own is predicted at.
MICRO_BATCHES = (2, 4, 8)


class JobRow(Protocol):
    """A row read as a job (`extractors.jobs.BatchRow`): its error, or its configuration, cluster and stack, and the
    settings it left to their defaults."""

    error: str | None
    assumed: tuple[str, ...]

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
        configs, clusters = [config for config, _, _ in parsed], [where for _, where, _ in parsed]
        cals = [calibration if calibration is not None else rows[i].calibration for i in part]
        others = [_micro_batches(config) if "micro_batch_size" in rows[i].assumed else []
                  for i, config in zip(part, configs)]
        extra = [(k, alt) for k, alts in enumerate(others) for alt in alts]
        results = predict_many(configs + [alt for _, alt in extra], clusters + [clusters[k] for k, _ in extra],
                               models, cals + [cals[k] for k, _ in extra])
        alternatives: dict[int, list[tuple[TrainingConfig, Any]]] = {}
        for (k, alt), result in zip(extra, results[len(part):]):
            alternatives.setdefault(k, []).append((alt, result))
        for k, (i, result) in enumerate(zip(part, results)):
            if k in alternatives and not isinstance(result, Exception):
                result.warnings.append(_micro_batch_warning(result, alternatives[k]))
            out[i] = result
        if on_chunk:
            on_chunk(len(part))
    return out


def _micro_batches(config: TrainingConfig) -> list[TrainingConfig]:
    """`config` at each of MICRO_BATCHES its global batch allows (Megatron's checks: `TrainingConfig.validate`)."""
    out = []
    for mb in MICRO_BATCHES:
        if mb == config.micro_batch_size:
            continue
        try:
            out.append(dataclasses.replace(config, micro_batch_size=mb).validate())
        except ConfigError:
            continue
    return out


def _micro_batch_warning(prediction: Any, alternatives: list[tuple[TrainingConfig, Any]]) -> str:
    """One line: what the row's prediction would be at the other micro-batches."""
    base = prediction.iteration_time_s
    parts = []
    for alt, result in alternatives:
        if isinstance(result, Exception):
            continue
        fits = "" if result.fits_in_memory is not False else ", does not fit"
        change = result.iteration_time_s / base - 1
        parts.append(f"{alt.micro_batch_size}: {result.iteration_time_s:.4g} s ({change:+.1%}{fits})")
    said = "; ".join(parts) if parts else "no other micro-batch the global batch allows"
    return (f"micro_batch_size not stated ({prediction.config.micro_batch_size} assumed); at micro-batch {said} (the "
            "table does not say which the run used)")
