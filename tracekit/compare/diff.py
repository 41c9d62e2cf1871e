"""Align a prediction with the real traces of the same configuration and attribute the error: `diff_sides` compares
two summarized sides (`sides.summarize_traces`, `prediction.summarize_prediction`) rank by rank and returns a
`DiffReport`, whose `to_dict()` is the `--json` document of `tracekit diff` / `tracekit validate`.

Both sides are built from the device events exactly as ingest classified them, so the totals of each side are what
ingest reports for it. The error is always predicted − real: positive means the prediction is too slow. Raises
ConfigError when the sides cannot be the same job (`checks.py`) and InputError when they share no rank.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

import pandas as pd

from tracekit.core.errors import InputError

from .checks import check_same_configuration
from .sides import RankSummary, Side, side_breakdown
from .tables import (
    by_layer,
    by_stage,
    compare,
    contributors,
    iteration_time,
    mean_over_ranks,
    stage_cells,
    unmatched,
)


@dataclass
class DiffReport:
    """Predicted vs real, aligned per rank and iteration. `to_dict()` is the `--json` document."""

    iteration_time_s: dict[str, Any]
    by_primitive: list[dict[str, Any]]
    by_pass: list[dict[str, Any]]
    by_layer: list[dict[str, Any]]
    by_stage: list[dict[str, Any]]
    breakdown: dict[str, Any]
    largest_contributors: list[dict[str, Any]]
    unmatched: dict[str, list[dict[str, Any]]]
    alignment: list[dict[str, Any]]
    totals: dict[str, dict[str, dict[str, float]]]  # side → primitive → {count, time_us} over its whole traces
    inputs: dict[str, str]
    rank: int
    warnings: list[str] = field(default_factory=list)
    timelines: dict[str, Any] = field(default_factory=dict)  # for the HTML page; not part of the JSON

    def to_dict(self) -> dict[str, Any]:
        return {
            "iteration_time_s": self.iteration_time_s,
            "by_primitive": self.by_primitive,
            "by_pass": self.by_pass,
            "by_layer": self.by_layer,
            "by_stage": self.by_stage,
            "breakdown": self.breakdown,
            "largest_contributors": self.largest_contributors,
            "unmatched": self.unmatched,
            "alignment": self.alignment,
            "totals": self.totals,
            "inputs": self.inputs,
            "rank": self.rank,
            "warnings": self.warnings,
        }


def diff_sides(predicted: Side, real: Side, rank: int | None = None,
               config: dict[str, Any] | None = None) -> DiffReport:
    """Compare two summarized sides rank by rank (ranks both have); raises ConfigError on a configuration
    mismatch and InputError when they share no rank."""
    check_same_configuration(predicted, real, config)
    totals = {"real": _trace_totals(real), "predicted": _trace_totals(predicted)}
    predicted = _stand_ins(predicted, real)
    ranks = sorted(set(predicted.ranks) & set(real.ranks))
    if not ranks:
        raise InputError(real.source, f"shares no rank with the prediction (real ranks {sorted(real.ranks)}, "
                                      f"predicted {sorted(predicted.ranks)})")
    warnings = []
    if _known(predicted.hardware) and _known(real.hardware) and predicted.hardware.lower() != real.hardware.lower():
        warnings.append(f"hardware differs: predicted for {predicted.hardware}, measured on {real.hardware}")
    if set(real.ranks) - set(ranks):
        warnings.append(f"real ranks without a prediction are left out: {sorted(set(real.ranks) - set(ranks))}")
    chosen = rank if rank is not None else ranks[0]
    if chosen not in ranks:
        raise InputError(real.source, f"rank {chosen} is not on both sides (common ranks: {ranks})")

    real_ops = mean_over_ranks([real.ranks[r].ops for r in ranks])
    pred_ops = mean_over_ranks([predicted.ranks[r].ops for r in ranks])
    pred_layers = mean_over_ranks([_layer_ops(predicted.ranks[r]) for r in ranks])
    iteration = iteration_time(predicted, real)
    cells = stage_cells(predicted, real, ranks)
    report = DiffReport(
        iteration_time_s=iteration,
        by_primitive=compare(real_ops, pred_ops, ["primitive"], real, ranks),
        by_pass=compare(real_ops, pred_ops, ["pass"]),
        by_layer=by_layer(real_ops, pred_layers) if (real_ops["layer"] != "").any() else [],
        by_stage=by_stage(cells, predicted, real, ranks),
        breakdown=_breakdowns(predicted, real, ranks),
        largest_contributors=contributors(cells, iteration.get("error")),
        unmatched=unmatched(real_ops, pred_ops),
        alignment=_alignment(predicted, real, ranks),
        totals=totals,
        inputs={"predicted": predicted.source, "real": real.source},
        rank=chosen,
        warnings=warnings,
        timelines={"rank": chosen, "real": real.ranks[chosen].timeline,
                   "predicted": predicted.ranks[chosen].timeline},
    )
    return report


def _layer_ops(summary: RankSummary) -> pd.DataFrame:
    """A rank's ops per layer: its own, or, for a prediction dict's rank, those of its stage's predicted trace."""
    return summary.layer_ops if summary.layer_ops is not None else summary.ops


def _trace_totals(side: Side) -> dict[str, dict[str, float]]:
    frame = pd.concat([r.trace_totals for r in side.ranks.values()]).groupby("primitive").sum()
    return {str(k): {"count": float(v["count"]), "time_us": float(v["time_us"])} for k, v in frame.iterrows()}


def _known(hardware: str | None) -> TypeGuard[str]:
    return bool(hardware and "unknown" not in hardware.lower())


def _stand_ins(predicted: Side, real: Side) -> Side:
    """Predicted traces hold one rank per pipeline stage: let it stand in for the other real ranks of its stage."""
    by_stage: dict[int, RankSummary] = {}
    for summary in predicted.ranks.values():
        by_stage.setdefault(summary.stage, summary)
    ranks = dict(predicted.ranks)
    for rank, summary in real.ranks.items():
        if rank not in ranks and summary.stage in by_stage:
            proxy = by_stage[summary.stage]
            ranks[rank] = replace(proxy, rank=rank, source_rank=proxy.rank)
    return replace(predicted, ranks=ranks)


def _alignment(predicted: Side, real: Side, ranks: list[int]) -> list[dict[str, Any]]:
    """Per rank: the real steps kept (and dropped as warm-up), the predicted step each is compared with, and both
    steps' iteration times."""
    out = []
    for rank in ranks:
        mine, theirs = real.ranks[rank], predicted.ranks[rank]
        n = len(theirs.steps)
        pairs = [(i, i % n) for i in range(len(mine.steps))] if n else []
        out.append({
            "rank": rank, "stage": mine.stage,
            "predicted_rank": rank if theirs.source_rank is None else theirs.source_rank,
            "real_steps": mine.steps, "dropped_steps": mine.dropped_steps, "predicted_steps": theirs.steps,
            "matched": [[mine.steps[i], theirs.steps[j]] for i, j in pairs],
            "iteration_s": [[mine.iteration_us[i] / 1e6, theirs.iteration_us[j] / 1e6] for i, j in pairs],
        })
    return out


def _breakdowns(predicted: Side, real: Side, ranks: list[int]) -> dict[str, Any]:
    out = {"real": side_breakdown(real, ranks), "predicted": side_breakdown(predicted, ranks),
           "real_source": real.breakdown_source, "predicted_source": predicted.breakdown_source}
    if real.hta is not None:
        out["hta"] = real.hta
    return out
