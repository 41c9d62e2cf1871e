"""Align a prediction with the real traces of the same configuration and attribute the error.

Inputs are parsed traces (`extractors.kineto.KinetoTrace`-like objects: path, rank, world_size, hardware,
iterations, device_events) for the real side, and either parsed predicted traces or a prediction dict
(`Prediction.to_dict()`) for the predicted side. Both sides are reduced to the same per-rank, per-iteration
summary — time per (stage, pass, primitive, layer) and the iteration breakdown of `predictor.breakdown` — built from
the device events exactly as ingest classified them, so the totals of each side are what ingest reports for it.

The error is always predicted − real: positive means the prediction is too slow.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable

import numpy as np
import pandas as pd

from tracekit.core.errors import ConfigError, InputError

from .breakdown import IterationBreakdown, iteration_breakdown, mean_breakdown

PASS_WORDS = {"fwd": "forward", "bwd": "backward", "optimizer": "optimizer", "comm": "communication"}
#: Process-group descriptions (Megatron's names) → the configuration's degree they must equal.
GROUP_DEGREES = {
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "DATA_PARALLEL_GROUP": "dp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "CONTEXT_PARALLEL_GROUP": "cp",
}
WARMUP_FACTOR = 1.5  # a first step this much slower than the median of the others is a warm-up outlier
MAX_CONTRIBUTORS = 10


# -- one side, summarized ----------------------------------------------------------------------------------------
@dataclass
class RankSummary:
    """One rank of one side: iteration durations, time per operator key per iteration, breakdown."""

    rank: int
    stage: int
    steps: list[int | None]  # the iterations kept (profiler step numbers; None for a trace without steps)
    iteration_us: list[float]
    dropped_steps: list[int | None]
    ops: pd.DataFrame  # columns: pass, primitive, layer, time_us, count (per iteration, mean over kept steps)
    totals: pd.DataFrame  # columns: primitive, time_us, count (sums over kept steps)
    trace_totals: pd.DataFrame  # columns: primitive, time_us, count (the whole trace, as ingest reports it)
    breakdown: IterationBreakdown | None
    timeline: list[dict] = field(default_factory=list)  # first kept iteration's events (for the report)
    source_rank: int | None = None  # the rank whose trace this is, when it stands in for a rank of its stage


@dataclass
class Side:
    """A prediction or a real run, summarized per rank (traces) or per stage (a prediction dict)."""

    label: str
    source: str
    world_size: int | None
    hardware: str | None
    ranks: dict[int, RankSummary]
    groups: dict[str, int]  # process-group description → size, as the side's collectives show them
    group_sizes: set[int]  # sizes of every process group the side's collectives use
    iteration_us: list[float]  # per step, mean over ranks
    dropped_steps: list[int | None]
    breakdown_source: str = "tracekit"
    breakdown_override: dict[str, float] | None = None  # seconds per part, when measured by another tool (HTA)
    hta: dict[str, Any] | None = None


def summarize_traces(traces: Iterable[Any], label: str, pp: int = 1, ranks_per_stage: int | None = None,
                     drop_warmup: bool = True, process_groups: dict[str, int] | None = None) -> Side:
    """Reduce parsed traces (one per rank) to a Side. `pp`/`ranks_per_stage` map ranks to pipeline stages;
    `process_groups` (description → size, e.g. from the traces' distributedInfo) adds to the groups the
    collectives name."""
    traces = sorted(traces, key=lambda t: (t.rank is None, t.rank if t.rank is not None else 0, str(t.path)))
    if not traces:
        raise InputError(label, "no traces")
    seen: dict[int, Any] = {}
    for i, trace in enumerate(traces):
        rank = trace.rank if trace.rank is not None else i
        if rank in seen:
            raise InputError(trace.path, f"rank {rank} appears twice ({seen[rank].path} too)")
        seen[rank] = trace
    world = max((t.world_size for t in traces if t.world_size), default=None) or len(traces)
    per_stage = ranks_per_stage or max(world // max(pp, 1), 1)
    drop_first = drop_warmup and any(_slow_first_step(trace) for trace in seen.values())  # one step set for all
    ranks = {rank: _summarize_rank(trace, rank, rank // per_stage, pp > 1, drop_first)
             for rank, trace in seen.items()}
    groups, sizes = trace_groups(traces)
    for desc, size in (process_groups or {}).items():
        groups.setdefault(desc, int(size))
        sizes.add(int(size))
    hardware = next((t.hardware for t in traces if getattr(t, "hardware", None)), None)
    steps = _common_steps(ranks)
    iteration_us = [float(np.mean([r.iteration_us[r.steps.index(s)] for r in ranks.values()])) for s in steps]
    dropped = sorted({s for r in ranks.values() for s in r.dropped_steps}, key=lambda s: (s is None, s or 0))
    return Side(label, ", ".join(str(t.path) for t in traces[:3]) + (" …" if len(traces) > 3 else ""),
                world, hardware, ranks, groups, sizes, iteration_us, dropped)


def _slow_first_step(trace: Any) -> bool:
    """Whether the trace's first profiler step is a warm-up outlier (≥ 3 steps, WARMUP_FACTOR × the others' median)."""
    durations = [end - start for _, start, end in trace.iterations or []]
    return len(durations) >= 3 and durations[0] > WARMUP_FACTOR * float(np.median(durations[1:]))


def _summarize_rank(trace: Any, rank: int, stage: int, pipeline: bool, drop_first: bool) -> RankSummary:
    events = trace.device_events
    trace_totals = events.groupby("primitive", as_index=False).agg(time_us=("dur_us", "sum"), count=("dur_us", "size"))
    iterations = list(trace.iterations or [])
    if not iterations:  # a trace without ProfilerStep markers: its device span is one iteration
        if len(events) == 0:
            raise InputError(trace.path, "no device events to compare")
        start = float(events["ts_us"].min())
        end = float((events["ts_us"] + events["dur_us"]).max())
        iterations = [(None, start, end)]
    durations = [float(end - start) for _, start, end in iterations]
    keep = list(range(len(iterations)))
    if drop_first and len(keep) > 1:
        keep = keep[1:]
    kept = [iterations[i] for i in keep]
    dropped = [iterations[i][0] for i in range(len(iterations)) if i not in keep]
    step_col = events["iteration"]
    frames, totals, breakdowns = [], [], []
    timeline: list[dict] = []
    for step, start, end in kept:
        mine = events if step is None else events[step_col == step]
        frames.append(_op_times(mine))
        totals.append(mine[["primitive", "dur_us"]])
        breakdowns.append(iteration_breakdown(mine, start, end, pipeline))
        if not timeline:
            timeline = _timeline(mine, start)
    ops = (pd.concat(frames).groupby(["pass", "primitive", "layer"], dropna=False, as_index=False)
           .agg(time_us=("time_us", "sum"), count=("count", "sum")))
    ops[["time_us", "count"]] = ops[["time_us", "count"]] / len(kept)
    total = pd.concat(totals).groupby("primitive", as_index=False).agg(time_us=("dur_us", "sum"),
                                                                         count=("dur_us", "size"))
    return RankSummary(rank, stage, [s for s, _, _ in kept], [durations[i] for i in keep], dropped, ops, total,
                       trace_totals, mean_breakdown(breakdowns), timeline)


def _op_times(events: pd.DataFrame) -> pd.DataFrame:
    frame = pd.DataFrame({
        "pass": events["pass"].astype(str).to_numpy(),
        "primitive": events["primitive"].astype(str).to_numpy(),
        "layer": _layer_column(events),
        "time_us": events["dur_us"].to_numpy(dtype=float),
    })
    return frame.groupby(["pass", "primitive", "layer"], dropna=False, as_index=False).agg(
        time_us=("time_us", "sum"), count=("time_us", "size"))


def _layer_column(events: pd.DataFrame) -> np.ndarray:
    """The innermost annotation around each event ('' where none)."""
    if "layer" not in events:
        return np.full(len(events), "", dtype=object)
    return events["layer"].fillna("").astype(str).to_numpy(dtype=object)


def _timeline(events: pd.DataFrame, start: float) -> list[dict]:
    return [
        {"ts": float(ts - start), "dur": float(dur), "lane": str(stream), "name": str(name), "category": str(cat)}
        for ts, dur, stream, name, cat in zip(events["ts_us"], events["dur_us"], events["stream"], events["name"],
                                              events["category"])
    ]


def trace_groups(traces: list[Any]) -> tuple[dict[str, int], set[int]]:
    """(process-group description → size, every group size) of the traces' collectives."""
    groups: dict[str, int] = {}
    sizes: set[int] = set()
    for trace in traces:
        events = trace.device_events
        if "group_size" not in events:
            continue
        comm = events[events["category"] == "communication"]
        descs = comm["process_group_desc"] if "process_group_desc" in comm else [None] * len(comm)
        for desc, size in zip(descs, comm["group_size"]):
            if size is None or pd.isna(size):
                continue
            sizes.add(int(size))
            if isinstance(desc, str) and desc:
                groups[desc] = int(size)
    return groups, sizes


def _common_steps(ranks: dict[int, RankSummary]) -> list:
    """Steps every rank kept (positions when steps are unnamed)."""
    lists = [r.steps for r in ranks.values()]
    common = [s for s in lists[0] if all(s in other for other in lists[1:])]
    return common


# -- prediction dict side --------------------------------------------------------------------------------------
def summarize_prediction(prediction: dict[str, Any], ranks: Iterable[int], ranks_per_stage: int) -> Side:
    """A prediction dict as a Side whose ranks are the given real ranks (every rank of a stage gets that stage's
    predicted operators; the prediction is per stage, not per rank)."""
    if "iteration_time_s" not in prediction:
        raise InputError("prediction", "not a tracekit prediction (no iteration_time_s)")
    config = prediction.get("config") or {}
    ops_by_stage = _prediction_ops(prediction)
    iteration_us = float(prediction["iteration_time_s"]) * 1e6
    out: dict[int, RankSummary] = {}
    for rank in ranks:
        stage = rank // ranks_per_stage
        ops = ops_by_stage.get(stage, ops_by_stage.get(None, _empty_ops()))
        totals = ops.groupby("primitive", as_index=False).agg(time_us=("time_us", "sum"), count=("count", "sum"))
        out[rank] = RankSummary(rank, stage, [0], [iteration_us], [], ops, totals, totals, None)
    groups = {}
    for desc, degree in GROUP_DEGREES.items():
        value = config.get(_CONFIG_KEYS[degree])
        if value:
            groups[desc] = int(value)
    side = Side("predicted", "prediction", config.get("world_size"), prediction.get("hardware"), out, groups,
                set(), [iteration_us], [])
    breakdown = prediction.get("breakdown")
    if isinstance(breakdown, dict):
        side.breakdown_override = {k: float(v) for k, v in breakdown.items() if isinstance(v, (int, float))}
        side.breakdown_source = "prediction"
    return side


_CONFIG_KEYS = {"tp": "tensor_model_parallel_size", "dp": "data_parallel_size", "pp": "pipeline_model_parallel_size",
                "cp": "context_parallel_size"}


def _empty_ops() -> pd.DataFrame:
    return pd.DataFrame({"pass": [], "primitive": [], "layer": [], "time_us": [], "count": []})


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


# -- configuration checks ---------------------------------------------------------------------------------------
def check_same_configuration(predicted: Side, real: Side, config: dict[str, Any] | None = None) -> None:
    """Raise ConfigError when the two sides cannot be the same job (world size, parallel group sizes)."""
    if predicted.world_size and real.world_size and int(predicted.world_size) != int(real.world_size):
        raise ConfigError(
            f"configurations differ: the prediction is for {predicted.world_size} ranks, the real run has "
            f"{real.world_size}"
        )
    differ = [
        f"the prediction has {GROUP_DEGREES[desc].upper()}={size}, the real run's {desc} has {real.groups[desc]} "
        f"rank{'s' if real.groups[desc] != 1 else ''}"
        for desc, size in sorted(predicted.groups.items(), key=lambda kv: list(GROUP_DEGREES).index(kv[0])
                                 if kv[0] in GROUP_DEGREES else 99)
        if desc in GROUP_DEGREES and desc in real.groups and real.groups[desc] != size
    ]
    if differ:
        raise ConfigError("configurations differ: " + "; ".join(differ))
    if config and not real.groups:
        allowed = _allowed_group_sizes(config)
        odd = sorted(s for s in real.group_sizes if s not in allowed)
        if odd:
            raise ConfigError(
                f"configurations differ: the real run communicates in groups of {odd} ranks, which the predicted "
                f"configuration (tp={config.get('tensor_model_parallel_size')}, "
                f"pp={config.get('pipeline_model_parallel_size')}, dp={config.get('data_parallel_size')}) has not"
            )


def check_same_split(predicted: dict[str, Any], run: dict[str, Any]) -> None:
    """Raise ConfigError when a prediction's configuration splits the job differently from the run's (both
    TrainingConfig dicts)."""
    names = (("TP", "tensor_model_parallel_size"), ("PP", "pipeline_model_parallel_size"),
             ("CP", "context_parallel_size"), ("DP", "data_parallel_size"), ("world size", "world_size"))
    differ = [(label, predicted.get(key), run.get(key)) for label, key in names
              if predicted.get(key) is not None and run.get(key) is not None
              and int(predicted[key]) != int(run[key])]
    if differ:
        ours = ", ".join(f"{label}={a}" for label, a, _ in differ)
        theirs = ", ".join(f"{label}={b}" for label, _, b in differ)
        raise ConfigError(f"configurations differ: the prediction has {ours}, the real run {theirs}")


def _allowed_group_sizes(config: dict[str, Any]) -> set[int]:
    tp = int(config.get("tensor_model_parallel_size") or 1)
    pp = int(config.get("pipeline_model_parallel_size") or 1)
    cp = int(config.get("context_parallel_size") or 1)
    dp = int(config.get("data_parallel_size") or 1)
    sizes = {1, tp, cp, dp, tp * cp, dp * cp, tp * cp * dp * pp}
    if pp > 1:
        sizes |= {2, pp}
    return sizes


# -- the report -------------------------------------------------------------------------------------------------
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

    real_ops = _mean_over_ranks([real.ranks[r].ops for r in ranks])
    pred_ops = _mean_over_ranks([predicted.ranks[r].ops for r in ranks])
    iteration = _iteration_time(predicted, real)
    stage_cells = _stage_cells(predicted, real, ranks)
    report = DiffReport(
        iteration_time_s=iteration,
        by_primitive=_compare(real_ops, pred_ops, ["primitive"], real, ranks),
        by_pass=_compare(real_ops, pred_ops, ["pass"]),
        by_layer=_compare(real_ops[real_ops["layer"] != ""], pred_ops[pred_ops["layer"] != ""], ["layer"])
        if (real_ops["layer"] != "").any() else [],
        by_stage=_by_stage(stage_cells, predicted, real, ranks),
        breakdown=_breakdowns(predicted, real, ranks),
        largest_contributors=_contributors(stage_cells, iteration.get("error")),
        unmatched=_unmatched(real_ops, pred_ops),
        alignment=_alignment(predicted, real, ranks),
        totals=totals,
        inputs={"predicted": predicted.source, "real": real.source},
        rank=chosen,
        warnings=warnings,
        timelines={"rank": chosen, "real": real.ranks[chosen].timeline,
                   "predicted": predicted.ranks[chosen].timeline},
    )
    return report


def _trace_totals(side: Side) -> dict[str, dict[str, float]]:
    frame = pd.concat([r.trace_totals for r in side.ranks.values()]).groupby("primitive").sum()
    return {str(k): {"count": float(v["count"]), "time_us": float(v["time_us"])} for k, v in frame.iterrows()}


def _known(hardware: str | None) -> bool:
    return bool(hardware) and "unknown" not in hardware.lower()


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


def _mean_over_ranks(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frame = pd.concat(frames) if frames else _empty_ops()
    out = frame.groupby(["pass", "primitive", "layer"], as_index=False).agg(time_us=("time_us", "sum"),
                                                                            count=("count", "sum"))
    out[["time_us", "count"]] = out[["time_us", "count"]] / max(len(frames), 1)
    return out


def _iteration_time(predicted: Side, real: Side) -> dict[str, Any]:
    real_mean = float(np.mean(real.iteration_us)) / 1e6 if real.iteration_us else None
    pred_mean = float(np.mean(predicted.iteration_us)) / 1e6 if predicted.iteration_us else None
    error = None if real_mean is None or pred_mean is None else pred_mean - real_mean
    spread = {
        "std": float(np.std(real.iteration_us)) / 1e6 if real.iteration_us else None,
        "min": float(np.min(real.iteration_us)) / 1e6 if real.iteration_us else None,
        "max": float(np.max(real.iteration_us)) / 1e6 if real.iteration_us else None,
        "steps": len(real.iteration_us),
        "dropped_warmup_steps": real.dropped_steps,
    }
    return {"real": real_mean, "predicted": pred_mean, "error": error,
            "rel_error": error / real_mean if error is not None and real_mean else None, "real_spread": spread}


def _row(real_us: float, pred_us: float) -> dict[str, Any]:
    error = (pred_us - real_us) / 1e6
    return {"real_s": real_us / 1e6, "predicted_s": pred_us / 1e6, "error_s": error,
            "rel_error": error / (real_us / 1e6) if real_us > 0 else None}


def _compare(real_ops: pd.DataFrame, pred_ops: pd.DataFrame, keys: list[str], real: Side | None = None,
             ranks: list[int] | None = None) -> list[dict[str, Any]]:
    r = real_ops.groupby(keys).agg(time_us=("time_us", "sum"), count=("count", "sum"))
    p = pred_ops.groupby(keys).agg(time_us=("time_us", "sum"), count=("count", "sum"))
    index = r.index.union(p.index)
    r, p = r.reindex(index, fill_value=0.0), p.reindex(index, fill_value=0.0)
    totals = None
    if real is not None and keys == ["primitive"]:
        totals = pd.concat([real.ranks[k].totals for k in ranks]).groupby("primitive").sum()
    rows = []
    for key in index:
        row = {keys[0]: key if not isinstance(key, (np.integer,)) else int(key),
               **_row(float(r.loc[key, "time_us"]), float(p.loc[key, "time_us"])),
               "real_count": float(r.loc[key, "count"]), "predicted_count": float(p.loc[key, "count"])}
        if totals is not None:
            row["real_total_s"] = float(totals["time_us"].get(key, 0.0)) / 1e6
            row["real_events"] = int(totals["count"].get(key, 0))
        rows.append(row)
    rows.sort(key=lambda x: -max(x["real_s"], x["predicted_s"]))
    return rows


def _stage_cells(predicted: Side, real: Side, ranks: list[int]) -> pd.DataFrame:
    """(stage, pass, primitive) → real and predicted time per iteration, mean over the stage's ranks."""
    frames = []
    for side, name in ((real, "real"), (predicted, "predicted")):
        for rank in ranks:
            ops = side.ranks[rank].ops.groupby(["pass", "primitive"], as_index=False)["time_us"].sum()
            frames.append(ops.assign(stage=real.ranks[rank].stage, side=name, rank=rank))
    frame = pd.concat(frames)
    per_stage = frame.groupby(["stage", "side", "pass", "primitive"], as_index=False)["time_us"].sum()
    n_ranks = {s: sum(1 for r in ranks if real.ranks[r].stage == s) for s in per_stage["stage"].unique()}
    per_stage["time_us"] = per_stage["time_us"] / per_stage["stage"].map(n_ranks)
    wide = per_stage.pivot_table(index=["stage", "pass", "primitive"], columns="side", values="time_us",
                                 fill_value=0.0).reset_index()
    for name in ("real", "predicted"):
        if name not in wide:
            wide[name] = 0.0
    wide["error_us"] = wide["predicted"] - wide["real"]
    return wide


def _by_stage(cells: pd.DataFrame, predicted: Side, real: Side, ranks: list[int]) -> list[dict[str, Any]]:
    rows = []
    for stage, group in cells.groupby("stage"):
        stage_ranks = [r for r in ranks if real.ranks[r].stage == stage]
        row = {"stage": int(stage), "ranks": stage_ranks,
               **_row(float(group["real"].sum()), float(group["predicted"].sum()))}
        real_it = np.mean([np.mean(real.ranks[r].iteration_us) for r in stage_ranks]) / 1e6
        pred_it = np.mean([np.mean(predicted.ranks[r].iteration_us) for r in stage_ranks]) / 1e6
        row["real_iteration_s"], row["predicted_iteration_s"] = float(real_it), float(pred_it)
        rows.append(row)
    return rows


def _contributors(cells: pd.DataFrame, e2e_error_s: float | None) -> list[dict[str, Any]]:
    """The (stage, pass, primitive) cells with the largest absolute error, each with its share of the end-to-end
    error (negative when it works against it)."""
    ranked = cells.assign(size=cells["error_us"].abs()).sort_values("size", ascending=False)
    out = []
    for cell in ranked.head(MAX_CONTRIBUTORS).to_dict("records"):
        if cell["size"] <= 0:
            break
        error_s = float(cell["error_us"]) / 1e6
        share = error_s / e2e_error_s if e2e_error_s else None
        what = f"{PASS_WORDS.get(cell['pass'], cell['pass'])} {cell['primitive']} on stage {int(cell['stage'])}"
        text = f"{what}: {_signed_ms(error_s)}" + (f", {_percent(share)} of the error" if share is not None else "")
        out.append({"stage": int(cell["stage"]), "pass": cell["pass"], "primitive": cell["primitive"],
                    "real_s": float(cell["real"]) / 1e6, "predicted_s": float(cell["predicted"]) / 1e6,
                    "error_s": error_s, "share_of_error": share, "text": text})
    return out


def _percent(share: float) -> str:
    return "<1%" if abs(share) < 0.005 else f"{share * 100:.0f}%"


def _signed_ms(seconds: float) -> str:
    return f"{'+' if seconds >= 0 else '−'}{abs(seconds) * 1e3:.3g} ms"


def _unmatched(real_ops: pd.DataFrame, pred_ops: pd.DataFrame) -> dict[str, list[dict[str, Any]]]:
    r = real_ops.groupby(["pass", "primitive"]).agg(time_us=("time_us", "sum"), count=("count", "sum"))
    p = pred_ops.groupby(["pass", "primitive"]).agg(time_us=("time_us", "sum"), count=("count", "sum"))
    r, p = r[r["count"] > 0], p[p["count"] > 0]

    def rows(only: pd.DataFrame) -> list[dict[str, Any]]:
        return [{"pass": k[0], "primitive": k[1], "time_s": float(v["time_us"]) / 1e6, "count": float(v["count"])}
                for k, v in only.sort_values("time_us", ascending=False).iterrows()]

    return {"real_only": rows(r.loc[r.index.difference(p.index)]),
            "predicted_only": rows(p.loc[p.index.difference(r.index)])}


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


def side_breakdown(side: Side, ranks: list[int]) -> dict[str, float] | None:
    if side.breakdown_override is not None:
        return side.breakdown_override
    items = [side.ranks[r].breakdown for r in ranks if side.ranks[r].breakdown is not None]
    mean = mean_breakdown(items)
    if mean is None:
        return None
    parts = mean.parts_s()
    parts["overlap_ratio"] = mean.overlap_ratio
    return parts


def _breakdowns(predicted: Side, real: Side, ranks: list[int]) -> dict[str, Any]:
    out = {"real": side_breakdown(real, ranks), "predicted": side_breakdown(predicted, ranks),
           "real_source": real.breakdown_source, "predicted_source": predicted.breakdown_source}
    if real.hta is not None:
        out["hta"] = real.hta
    return out
