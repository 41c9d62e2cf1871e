"""A prediction dict (`predictor.predict.Prediction.to_dict()`, or a `tracekit predict --json` document) as one
side of a comparison: the same `Side` as traces give, per stage instead of per rank. The dict holds no timeline and
no layers: given the prediction's own traces (`predict --trace-out`, summarized by `sides.summarize_traces`), each
rank takes its stage's timeline and time per layer from them, its numbers still from the dict.
"""
from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

from tracekit.core.errors import InputError

from .checks import CONFIG_KEYS, GROUP_DEGREES
from .sides import RankSummary, Side, empty_ops


def summarize_prediction(prediction: dict[str, Any], ranks: Iterable[int], ranks_per_stage: int,
                         traces: Side | None = None) -> Side:
    """A prediction dict as a Side whose ranks are the given real ranks (every rank of a stage gets that stage's
    predicted operators; the prediction is per stage, not per rank). `traces`: the prediction's own traces as a
    Side, whose ranks lend their stage's timeline and per-layer times."""
    if "iteration_time_s" not in prediction:
        raise InputError("prediction", "not a tracekit prediction (no iteration_time_s)")
    config = prediction.get("config") or {}
    ops_by_stage = _prediction_ops(prediction)
    iteration_us = float(prediction["iteration_time_s"]) * 1e6
    out: dict[int, RankSummary] = {}
    for rank in ranks:
        stage = rank // ranks_per_stage
        ops = ops_by_stage.get(stage, ops_by_stage.get(None, empty_ops()))
        totals = ops.groupby("primitive", as_index=False).agg(time_us=("time_us", "sum"), count=("count", "sum"))
        out[rank] = RankSummary(rank, stage, [0], [iteration_us], [], ops, totals, totals, None)
        drawn = _stage_rank(traces, stage)
        if drawn is not None:
            out[rank].timeline, out[rank].layer_ops = drawn.timeline, drawn.ops
    groups = {}
    for desc, degree in GROUP_DEGREES.items():
        value = config.get(CONFIG_KEYS[degree])
        if value:
            groups[desc] = int(value)
    side = Side("predicted", "prediction", config.get("world_size"), prediction.get("hardware"), out, groups,
                set(), [iteration_us], [])
    breakdown = prediction.get("breakdown")
    if isinstance(breakdown, dict):
        side.breakdown_override = {k: float(v) for k, v in breakdown.items() if isinstance(v, (int, float))}
        side.breakdown_source = "prediction"
    return side


def _stage_rank(traces: Side | None, stage: int) -> RankSummary | None:
    """The first rank of `stage` in the prediction's traces (one trace per stage), or None."""
    if traces is None:
        return None
    return next((r for _, r in sorted(traces.ranks.items()) if r.stage == stage), None)


def _prediction_ops(prediction: dict[str, Any]) -> dict[int | None, pd.DataFrame]:
    """Per-stage operator time per iteration from the prediction's `operators` list."""
    rows = []
    for op in prediction.get("operators") or []:
        count = float(op.get("count", 1) or 0)
        if op.get("time_s") is None:
            continue
        total = float(op["time_s"]) * 1e6  # per iteration on one GPU of the stage
        rows.append({
            "stage": op.get("stage"), "pass": str(op.get("pass", "fwd")), "primitive": str(op.get("primitive")),
            "layer": str(op.get("layer") or ""),
            "time_us": float(total), "count": count,
        })
    if not rows:
        return {}
    frame = pd.DataFrame(rows)
    out: dict[int | None, pd.DataFrame] = {}
    for stage, group in frame.groupby(frame["stage"].fillna(-1).astype(int)):
        key = None if stage == -1 else int(stage)
        out[key] = (group.groupby(["pass", "primitive", "layer"], as_index=False)
                    .agg(time_us=("time_us", "sum"), count=("count", "sum")))
    return out
