"""Estimates a model set derives for rows that no model of their own hardware answers (the `derived` path of
`predictor.costs.learned.models`): a collective from the models of other collectives on the same group (a
reduce-scatter as an all-gather of the same bytes, an all-reduce as both, ...), a whole GEMM backward from its role
models (dgrad + wgrad + bgrad), a primitive from its sibling hardware's model scaled by the two rooflines."""
from __future__ import annotations

from typing import Protocol, cast

import numpy as np
import pandas as pd

from predictor.costs.learned.model_keys import ROLE_PRIMITIVES, role_rows
from predictor.costs.physics.roofline import estimate_us
from tracekit.core.samples import COLLECTIVE_PRIMITIVES, GEMM_ROLES


class DirectAnswers(Protocol):
    """What derivation asks of a model set (`ModelSet`)."""

    def direct_estimates(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

    def sibling(self, hardware: str, primitive: str, pass_: str) -> str | None: ...


def fill(models: DirectAnswers, frame: pd.DataFrame, rows: np.ndarray, duration: np.ndarray, path: np.ndarray,
         oor: np.ndarray) -> None:
    """Rows no model of their own hardware answers, derived where the set can (in place): collectives from the models
    of other collectives on the same group, whole GEMM backwards from their role models, a primitive from its sibling
    hardware's model scaled by the two rooflines."""
    sub = frame.iloc[rows]
    prim = sub["primitive"].astype(str).to_numpy()
    coll = np.isin(prim, COLLECTIVE_PRIMITIVES)
    if coll.any():
        _collectives(models, sub[coll], rows[coll], duration, path, oor)
    compute = rows[~coll]
    if len(compute):
        compute = _roles(models, frame.iloc[compute], compute, duration, path, oor)
    if len(compute):
        _sibling(models, frame.iloc[compute], compute, duration, path, oor)

def _collectives(models: DirectAnswers, sub: pd.DataFrame, rows: np.ndarray, duration, path, oor) -> None:
    group = pd.to_numeric(sub["group_size"], errors="coerce").fillna(2.0).clip(lower=1.0).to_numpy()
    nbytes = pd.to_numeric(sub["bytes"], errors="coerce").to_numpy(dtype="float64")
    prim = sub["primitive"].astype(str).to_numpy()

    def ask(kind: str, scale_bytes: np.ndarray, mask: np.ndarray, extra: dict | None = None):
        part = sub[mask].assign(primitive=kind, bytes=nbytes[mask] * scale_bytes[mask], **(extra or {}))
        return models.direct_estimates(part)

    # (target, recipe): each recipe is a list of (kind, bytes scale, time factor); all parts must be answered.
    recipes: dict[str, list[list[tuple[str, float | np.ndarray, float | np.ndarray]]]] = {
        "reduce_scatter": [[("all_gather", 1.0, 1.0)], [("all_reduce", group, 0.5)]],
        "all_gather": [[("reduce_scatter", 1.0, 1.0)], [("all_reduce", group, 0.5)]],
        "all_reduce": [[("reduce_scatter", 1.0 / group, 1.0), ("all_gather", 1.0 / group, 1.0)],
                       [("all_gather", 1.0 / group, 2.0)], [("reduce_scatter", 1.0 / group, 2.0)]],
        "all_to_all": [[("all_gather", 1.0 / group, 1.0)], [("reduce_scatter", 1.0 / group, 1.0)]],
        "broadcast": [[("all_reduce", 1.0, group / (2.0 * np.maximum(group - 1.0, 1.0)))]],
        "send_recv": [[("all_gather", 1.0, 1.0)]],
    }
    for target, options in recipes.items():
        todo = prim == target
        for recipe in options:
            if not todo.any():
                break
            total = np.zeros(len(sub))
            any_oor = np.zeros(len(sub), dtype=bool)
            ok = todo.copy()
            for kind, scale, factor in recipe:
                scale = np.broadcast_to(np.asarray(scale, dtype="float64"), (len(sub),))
                factor = np.broadcast_to(np.asarray(factor, dtype="float64"), (len(sub),))
                extra = {"group_size": 2.0} if target == "send_recv" else None
                part_t, part_oor, part_ok = ask(kind, scale, todo, extra)
                idx = np.flatnonzero(todo)
                good = np.zeros(len(sub), dtype=bool)
                good[idx[part_ok]] = True
                ok &= good
                total[idx[part_ok]] += part_t[part_ok] * factor[idx[part_ok]]
                any_oor[idx] |= part_oor
            hit = np.flatnonzero(ok)
            duration[rows[hit]] = total[hit]
            path[rows[hit]] = "derived"
            oor[rows[hit]] = any_oor[hit]
            todo &= ~ok

def _roles(models: DirectAnswers, sub: pd.DataFrame, rows: np.ndarray, duration, path, oor) -> np.ndarray:
    """Whole GEMM backward rows from the role models of their hardware (dgrad + wgrad, + bgrad where held), in
    place; returns the rows still unanswered."""
    whole = (sub["pass"] == "bwd").to_numpy() & sub["primitive"].isin(ROLE_PRIMITIVES).to_numpy() \
        & ~role_rows(sub).to_numpy()
    if not whole.any():
        return rows
    part = sub[whole]
    total = np.zeros(len(part))
    any_oor = np.zeros(len(part), dtype=bool)
    held = np.ones(len(part), dtype=bool)
    for role in GEMM_ROLES:
        t, part_oor, ok = models.direct_estimates(part.assign(role=role))
        if role != "bgrad":
            held &= ok
        total += np.where(ok, t, 0.0)
        any_oor |= ok & part_oor
    hit = rows[whole][held]
    duration[hit] = total[held]
    path[hit] = "derived"
    oor[hit] = any_oor[held]
    return np.setdiff1d(rows, hit)

def _sibling(models: DirectAnswers, sub: pd.DataFrame, rows: np.ndarray, duration, path, oor) -> None:
    keys = sub[["hardware", "primitive", "pass"]].astype(str)
    # pandas-stubs types a group key as Hashable; grouped by three columns, it is (hardware, primitive, pass)
    groups = cast("dict[tuple[str, str, str], pd.Index]", keys.groupby(["hardware", "primitive", "pass"]).groups)
    for (hw, prim, pass_), idx in groups.items():
        other = models.sibling(hw, prim, pass_)
        if other is None:
            continue
        pos = sub.index.get_indexer(idx)
        part = sub.iloc[pos]
        moved = part.assign(hardware=other)
        t, part_oor, ok = models.direct_estimates(moved)
        ratio = estimate_us(part) / estimate_us(moved)
        good = ok & np.isfinite(ratio)
        target = rows[pos[good]]
        duration[target] = t[good] * ratio[good]
        path[target] = "derived"
        oor[target] = part_oor[good]
