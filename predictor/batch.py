"""Predictions of many jobs at once (`tracekit predict --batch` and `tracekit validate --published` both call
`predict_rows`, so the same rows get the same predictions): the rows of a published table as read by
`extractors.jobs`, in chunks of one batched model call each.

A row that does not state its micro-batch is predicted at each of `MICRO_BATCHES` its global batch and data
parallelism allow, and takes the fastest of those that fit in the GPU's memory (1 if none fits): Megatron
has no default micro-batch (`--micro-batch-size` is required: its `validate_args` asserts one), and a published table
reports runs its authors tuned (Narayanan et al. 2021 §3.4: the best micro-batch depends on the model and the split).
The choice is made on predicted times only, never on the measured one; one warning of the prediction says which was
taken and what each other would give."""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence

from tracekit.core.calibration import Calibration
from tracekit.core.cluster import Cluster
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError
from tracekit.core.stacks import Stack

#: The micro-batches a row without one of its own is predicted at (powers of two, as tuners try them; up to
#: `tracekit search`'s largest).
MICRO_BATCHES = (1, 2, 4, 8, 16)


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
                result = _fastest_that_fits(result, alternatives[k])
            out[i] = result
        if on_chunk:
            on_chunk(len(part))
    return out


def _micro_batches(config: TrainingConfig) -> list[TrainingConfig]:
    """`config` at each other of MICRO_BATCHES its global batch allows (Megatron's checks:
    `TrainingConfig.validate`)."""
    out = []
    for mb in MICRO_BATCHES:
        if mb == config.micro_batch_size:
            continue
        try:
            out.append(dataclasses.replace(config, micro_batch_size=mb).validate())
        except ConfigError:
            continue
    return out


def _fastest_that_fits(prediction: Any, alternatives: list[tuple[TrainingConfig, Any]]) -> Any:
    """Of a row's prediction and its `alternatives` (the same row at other micro-batches), the fastest that fits in
    memory (the smallest micro-batch when none does), with one warning saying which micro-batch it took and what
    each other gives."""
    tried = sorted([prediction] + [result for _, result in alternatives if not isinstance(result, Exception)],
                   key=lambda p: p.config.micro_batch_size)
    fitting = [p for p in tried if p.fits_in_memory is not False]
    chosen = min(fitting, key=lambda p: p.iteration_time_s) if fitting else tried[0]
    parts = []
    for other in tried:
        if other is chosen:
            continue
        fits = "" if other.fits_in_memory is not False else ", does not fit"
        parts.append(f"{other.config.micro_batch_size}: {other.iteration_time_s:.4g} s "
                     f"({other.iteration_time_s / chosen.iteration_time_s - 1:+.1%}{fits})")
    how = "the fastest that fits" if fitting else "none fits: the smallest"
    said = "; ".join(parts) if parts else "no other micro-batch the global batch allows"
    allowed = ", ".join(str(p.config.micro_batch_size) for p in tried)
    chosen.warnings.append(f"micro_batch_size not stated: {chosen.config.micro_batch_size} taken, {how} of the "
                           f"micro-batches the global batch allows ({allowed}; Megatron has no default); at "
                           f"micro-batch {said} (the table does not say which the run used)")
    return chosen
