"""The comparison tables of two summarized sides (`sides.Side`) over the ranks both have: iteration time, time
per primitive / pass / layer / stage, the (stage, pass, primitive) cells with the largest error, and operators only
one side has. Every error is predicted − real (positive: the prediction is too slow); times are seconds per
iteration, means over ranks. Rows are data only: the sentences people read are `tracekit.report.diff_text`'s.
"""
from __future__ import annotations

from typing import Any, Iterable, cast

import numpy as np
import pandas as pd

from .sides import Side, empty_ops

MAX_CONTRIBUTORS = 10


def mean_over_ranks(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Time and count per (pass, primitive, layer): the mean of the ranks' operator frames."""
    frame = pd.concat(frames) if frames else empty_ops()
    out = frame.groupby(["pass", "primitive", "layer"], as_index=False).agg(time_us=("time_us", "sum"),
                                                                            count=("count", "sum"))
    out[["time_us", "count"]] = out[["time_us", "count"]] / max(len(frames), 1)
    return out


def iteration_time(predicted: Side, real: Side) -> dict[str, Any]:
    """Mean iteration time (s) of each side, the error, and the spread of the real steps."""
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


def compare(real_ops: pd.DataFrame, pred_ops: pd.DataFrame, keys: list[str], real: Side | None = None,
            ranks: list[int] | None = None) -> list[dict[str, Any]]:
    """One row per value of `keys` (largest first): real and predicted time, error, counts; per primitive (with
    `real` and `ranks`) also the real kept steps' totals."""
    r = real_ops.groupby(keys).agg(time_us=("time_us", "sum"), count=("count", "sum"))
    p = pred_ops.groupby(keys).agg(time_us=("time_us", "sum"), count=("count", "sum"))
    index = r.index.union(p.index)
    r, p = r.reindex(index, fill_value=0.0), p.reindex(index, fill_value=0.0)
    totals: pd.DataFrame | None = None
    if real is not None and ranks is not None and keys == ["primitive"]:
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


#: The per-layer table's rows beside the layers' own ranges, so that its rows add up to the operator time of the
#: per-primitive table: a side's collectives (a CPU run's gloo collectives run on gloo's threads, outside any
#: range; a prediction's sit inside the layer that issues them), its optimizer step (the real run's
#: `Optimizer.step#Adam.step` range, the prediction's optimizer pass) and compute outside every range (a CPU run's
#: backward: autograd runs it outside the forward's record_function ranges).
COMMUNICATION, OPTIMIZER, OUTSIDE = "(communication)", "(optimizer step)", "(outside the layer ranges)"


def layer_keys(ops: pd.DataFrame) -> pd.DataFrame:
    """`ops` with each row's `layer` made comparable between a real run and a prediction (the rows above)."""
    layer = ops["layer"].astype(str)
    passes = ops["pass"].astype(str)
    key = layer.where(layer != "", OUTSIDE)
    key = key.where(~((passes == "optimizer") | layer.str.startswith("Optimizer.")), OPTIMIZER)
    key = key.where(passes != "comm", COMMUNICATION)
    return ops.assign(layer=key)


def by_layer(real_ops: pd.DataFrame, pred_ops: pd.DataFrame) -> list[dict[str, Any]]:
    """Time per layer range, like with like: the rows of `layer_keys`, which add up to each side's operator time."""
    return compare(layer_keys(real_ops), layer_keys(pred_ops), ["layer"])


def stage_cells(predicted: Side, real: Side, ranks: list[int]) -> pd.DataFrame:
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


def by_stage(cells: pd.DataFrame, predicted: Side, real: Side, ranks: list[int]) -> list[dict[str, Any]]:
    """One row per pipeline stage: its ranks, operator time of each side, error, and mean iteration times."""
    rows = []
    for stage, group in cells.groupby("stage"):
        stage_ranks = [r for r in ranks if real.ranks[r].stage == stage]
        row = {"stage": int(cast(int, stage)), "ranks": stage_ranks,  # pandas-stubs: a key is any scalar
               **_row(float(group["real"].sum()), float(group["predicted"].sum()))}
        real_it = np.mean([np.mean(real.ranks[r].iteration_us) for r in stage_ranks]) / 1e6
        pred_it = np.mean([np.mean(predicted.ranks[r].iteration_us) for r in stage_ranks]) / 1e6
        row["real_iteration_s"], row["predicted_iteration_s"] = float(real_it), float(pred_it)
        rows.append(row)
    return rows


def contributors(cells: pd.DataFrame, e2e_error_s: float | None) -> list[dict[str, Any]]:
    """The (stage, pass, primitive) cells with the largest absolute error, each with its share of the end-to-end
    error (negative when it works against it)."""
    ranked = cells.assign(size=cells["error_us"].abs()).sort_values("size", ascending=False)
    out = []
    for cell in ranked.head(MAX_CONTRIBUTORS).to_dict("records"):
        if cell["size"] <= 0:
            break
        error_s = float(cell["error_us"]) / 1e6
        share = error_s / e2e_error_s if e2e_error_s else None
        out.append({"stage": int(cell["stage"]), "pass": cell["pass"], "primitive": cell["primitive"],
                    "real_s": float(cell["real"]) / 1e6, "predicted_s": float(cell["predicted"]) / 1e6,
                    "error_s": error_s, "share_of_error": share})
    return out


def unmatched(real_ops: pd.DataFrame, pred_ops: pd.DataFrame) -> dict[str, list[dict[str, Any]]]:
    """(pass, primitive) pairs only one side has: {"real_only": [...], "predicted_only": [...]}, longest first."""
    r = real_ops.groupby(["pass", "primitive"]).agg(time_us=("time_us", "sum"), count=("count", "sum"))
    p = pred_ops.groupby(["pass", "primitive"]).agg(time_us=("time_us", "sum"), count=("count", "sum"))
    r, p = r[r["count"] > 0], p[p["count"] > 0]

    def rows(only: pd.DataFrame) -> list[dict[str, Any]]:
        # pandas-stubs types a row label as Hashable; grouped by two columns, it is (pass, primitive)
        return [{"pass": k[0], "primitive": k[1], "time_s": float(v["time_us"]) / 1e6, "count": float(v["count"])}
                for k, v in cast("Iterable[tuple[tuple[str, str], pd.Series]]",
                                 only.sort_values("time_us", ascending=False).iterrows())]

    return {"real_only": rows(r.loc[r.index.difference(p.index)]),
            "predicted_only": rows(p.loc[p.index.difference(r.index)])}
