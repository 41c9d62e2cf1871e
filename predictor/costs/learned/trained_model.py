"""One trained operator regressor of a model set (its key, metadata and lazily loaded booster), and what decides
whether it may answer a row: a dtype it was not trained on, shape features it was not sized on, shapes above a
table's grid; and the dense-peak bound every GEMM answer keeps (`predictor.costs.learned.models` applies them)."""
from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from predictor.costs.learned.model_keys import ROLE_PRIMITIVES
from predictor.costs.learned.regressor import peak_bound_us
from predictor.costs.physics.lowp_gemm import HIGH, LOW
from tracekit.core.errors import ModelError
from tracekit.core.hardware import hardware_spec


@dataclass
class TrainedModel:
    """One entry of a model set: its key, metadata and (lazily loaded) booster."""

    id: str
    hardware: str
    primitive: str
    pass_: str
    group: str
    meta: dict
    path: Path
    _booster: object = None

    @property
    def booster(self):
        if self._booster is None:
            import xgboost as xgb

            booster = xgb.Booster()
            try:
                booster.load_model(bytearray(gzip.decompress((self.path / f"{self.id}.ubj.gz").read_bytes())))
            except (OSError, ValueError, xgb.core.XGBoostError) as exc:
                raise ModelError(f"{self.path / self.id}.ubj.gz: unreadable model ({exc})") from exc
            booster.set_param({"nthread": 1})
            self._booster = booster
        return self._booster


def other_dtype_rows(frame: pd.DataFrame) -> np.ndarray:
    """GEMM/bmm rows on a datasheet GPU in a dtype other than fp16/bf16 (predictor.costs.physics.lowp_gemm's LOW and
    HIGH)."""
    if "dtype" not in frame.columns or not len(frame):
        return np.zeros(len(frame), dtype=bool)
    rows = (frame["primitive"].isin(ROLE_PRIMITIVES) & frame["dtype"].isin(LOW + HIGH)).to_numpy().copy()
    if rows.any():
        gpu = np.array([hardware_spec(str(h)) is not None and not str(h).startswith("cpu-")
                        for h in frame["hardware"].to_numpy()[rows]])
        rows[np.flatnonzero(rows)[~gpu]] = False
    return rows


def unseen_dtype(model: TrainedModel, dtype: object) -> bool:
    """A pooled GEMM model of a GPU asked a row in fp32, a dtype it was not trained on (its `dtypes`; models trained
    before they were recorded count as half precision only): the row takes `predictor.costs.physics.lowp_gemm`'s bound
    instead."""
    if dtype not in HIGH or model.primitive not in ROLE_PRIMITIVES or model.hardware.startswith("cpu-") \
            or hardware_spec(model.hardware) is None:
        return False
    return dtype not in model.meta.get("dtypes", ())


def unsized(model: TrainedModel, rows: pd.DataFrame) -> np.ndarray:
    """Rows missing a shape feature the model was trained on (a missing batch counts as 1): no grid holds them."""
    out = np.zeros(len(rows), dtype=bool)
    for name in model.meta["ranges"]:
        if name != "batch":
            values = pd.to_numeric(rows[name], errors="coerce") if name in rows.columns else None
            out |= True if values is None else values.isna().to_numpy()
    return out


#: The shape features of a table's grid a row may exceed and still be answered at the grid's edge.
GRID_FEATURES = frozenset(("m", "n", "k", "batch"))


def above_grid(model: TrainedModel, rows: pd.DataFrame) -> np.ndarray:
    """Rows of a GEMM-like primitive that lie beyond the model's grid only upwards: every grid feature at least its
    smallest trained value and one above its largest (below the grid, launch floors the table never saw decide)."""
    ranges = {k: v for k, v in model.meta["ranges"].items() if k in GRID_FEATURES}
    if model.primitive not in ROLE_PRIMITIVES or not ranges:
        return np.zeros(len(rows), dtype=bool)
    above = np.zeros(len(rows), dtype=bool)
    inside = np.ones(len(rows), dtype=bool)
    for name, (lo, hi) in ranges.items():
        values = pd.to_numeric(rows[name], errors="coerce").to_numpy(dtype="float64") if name in rows.columns \
            else np.ones(len(rows))
        values = np.nan_to_num(values, nan=1.0)
        tol = 1e-6 * max(abs(lo), abs(hi), 1.0)
        inside &= values >= lo - tol
        above |= values > hi + tol
    return inside & above


def at_most_peak(frame: pd.DataFrame, duration: np.ndarray) -> None:
    """No GEMM/bmm estimate on a datasheet GPU is faster than the fastest its dtype runs (in place): the dtype's dense
    peak, TF32's for fp32 (`predictor.costs.learned.regressor.peak_bound_us`)."""
    rows = np.flatnonzero(frame["primitive"].isin(ROLE_PRIMITIVES).to_numpy())
    if len(rows):
        duration[rows] = np.fmax(duration[rows], peak_bound_us(frame.iloc[rows]))
