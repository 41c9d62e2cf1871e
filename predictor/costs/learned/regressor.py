"""Fit one operator regressor: XGBoost on shape + physics features, predicting log10(time / roofline estimate).

Learning the ratio to the roofline estimate (an efficiency) instead of the raw time lets the trees spend their
splits on what physics does not explain, and keeps predictions sensible a little outside the trained ranges.

Before fitting, samples that cannot be real measurements of the same operator are set aside and reported:
- *impossible* (collectives): faster than `IMPOSSIBLE_FACTOR` × the datasheet link bandwidth allows (e.g. a 1 GB
  all-gather "done" in 117 µs, which would need tens of TB/s of network bandwidth);
- *impossible* (tensor-core primitives: GEMM, bmm, attention): faster than their FLOPs at the part's dense peak for
  the dtype allows, by more than `PEAK_SLACK` (datasheet clocks are boost clocks; no cache makes FLOPs cheaper) —
  e.g. the seed paper's GH200 flash-attention backward rows, timed at a ninth of their forward (every other
  measurement of that kernel, the A100's included, takes 2.5–3.5× its forward: the backward does 2.5× the
  forward's FLOPs), which would need 3–13 PFLOP/s of a 989 TFLOP/s part. When most of a set's rows are beyond
  the peak, its timing is broken as a whole and every row is set aside (2,904 of those 3,238 GH200 rows are; the
  other 334, the smallest shapes, are timed the same broken way, just not fast enough to prove it);
- *separate mode*: a minority cluster of the residuals separated from the main one by a gap of more than
  `MODE_GAP` decades (e.g. an optimizer step that took seconds in one stretch of a sweep and milliseconds at
  larger shapes in the rest).
Hyper-parameters (target, tree depth, rounds) are chosen by k-fold cross-validation (`cv_splits`: scikit-learn's
shuffled KFold) on out-of-fold MAPE; among the configurations within 5% of the best, the smallest model is kept.
A collective is learned as its plain time only (never as a ratio to the roofline, which no constraint keeps
monotone), constrained to grow with the message size (a few noisy small-message samples must not make a larger
message look quicker), and between two sampled message sizes it is interpolated log-linearly (trees alone would
answer a 7 MB all-reduce with the 4 MB sample's time).
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from predictor.costs.features import PHYSICS_FEATURES, compute_work, physics_features, shape_features
from predictor.costs.physics.roofline import estimate_us, hardware_rates
from tracekit.core.errors import ModelError
from tracekit.core.hardware import PEAK_KIND, hardware_spec
from tracekit.core.samples import COLLECTIVE_PRIMITIVES

if TYPE_CHECKING:  # XGBoost is imported where a model is trained or run (a cold `tracekit --help` stays fast)
    import xgboost as xgb

IMPOSSIBLE_FACTOR = 4.0
#: How much faster than FLOPs / dense peak a tensor-core sample may be before it is impossible (clocks above the one
#: the datasheet peak is quoted at, rounding of published peaks).
PEAK_SLACK = 1.25
#: Primitives whose FLOPs bound their time from below on any part.
TENSOR_PRIMITIVES = ("gemm", "bmm", "attention")
MODE_GAP = 1.0  # decades
MIN_MODE_ROWS = 20
#: (max_depth, min_child_weight) tried; rounds are picked from ROUND_STEPS on the same fits.
DEPTHS = (4, 6, 8)
ROUND_STEPS = (60, 120, 240)
ETA = 0.15
#: Targets: the ratio to the roofline (default) or the plain time, tried with LOG_TARGET_DEPTHS on compute sets of
#: fewer than LOG_TARGET_MAX_ROWS rows (small sets whose times physics explains badly, e.g. GH200 optimizer steps) and
#: kept only when its CV MAPE is below LOG_TARGET_GAIN × the ratio target's: the plain time does not extrapolate.
RATIO_TARGET = "log10(duration_us / roofline_us)"
LOG_TARGET = "log10(duration_us)"
LOG_TARGET_DEPTHS = (4, 8)
LOG_TARGET_MAX_ROWS = 2000
LOG_TARGET_GAIN = 0.8
#: Parsimony: the smallest model (depth × rounds) whose CV MAPE is within this factor of the best one is kept.
PARSIMONY = 1.05
#: Features a collective's time cannot decrease in (monotone constraint of its plain-time model).
SIZE_FEATURES = ("bytes", "log_bytes", "log_roofline")
#: Most sampled message sizes kept for interpolation (a denser sweep interpolates on a geometric subset).
SIZE_GRID_MAX = 256


@dataclass
class FitResult:
    """A trained booster and what to save beside it."""

    booster: xgb.Booster | None  # None when no row was left to train on
    features: list[str]
    ranges: dict[str, list[float]]
    params: dict
    n_samples: int
    cv: dict
    outliers: dict
    train_hash: str
    seconds: float
    oof: pd.Series = field(repr=False)  # out-of-fold predicted duration (µs), index of the input


def physics_table(frame: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """Physics features and roofline estimate (µs) of every row; computed once per frame, sliced per model."""
    roof = estimate_us(frame)
    sms = hardware_rates(frame["hardware"].astype("string").fillna(""))["sms"]
    return physics_features(frame, sms, roof), roof


def design(frame: pd.DataFrame, primitive: str, features: list[str] | None = None,
           physics: tuple[pd.DataFrame, np.ndarray] | None = None) -> tuple[pd.DataFrame, np.ndarray]:
    """Feature matrix (shape + physics features) and roofline estimate (µs) for rows of one primitive.

    `physics` is `physics_table(frame)` when the caller already has it (rows aligned with `frame`)."""
    phys, roof = physics if physics is not None else physics_table(frame)
    missing = np.full(len(frame), np.nan)
    columns = {
        name: pd.to_numeric(frame[name], errors="coerce").to_numpy("float64", na_value=np.nan)
        if name in frame.columns else missing
        for name in shape_features(primitive)
    }
    columns.update({name: phys[name].to_numpy("float64") for name in PHYSICS_FEATURES})
    names = list(columns) if features is None else features
    return pd.DataFrame({name: columns.get(name, missing) for name in names}, index=frame.index), roof


def peak_bound_us(frame: pd.DataFrame) -> np.ndarray:
    """The least time (µs) each row's FLOPs take at its part's dense peak for its dtype (TF32's for fp32:
    `HardwareSpec.gemm_ceiling_tflops`); NaN for parts without a datasheet entry, CPUs and dtypes without a peak."""
    out = np.full(len(frame), np.nan)
    if not len(frame) or "hardware" not in frame.columns:
        return out
    flops = compute_work(frame)[0]
    dtypes = frame["dtype"].astype("string").fillna("bf16").to_numpy() if "dtype" in frame.columns \
        else np.full(len(frame), "bf16")
    hardware = frame["hardware"].astype(str).to_numpy()
    for hw, dt in {(h, d) for h, d in zip(hardware, dtypes)}:
        spec = hardware_spec(hw)
        if spec is None or hw.startswith("cpu-") or dt not in PEAK_KIND:
            continue
        peak = spec.gemm_ceiling_tflops(str(dt)) * 1e12
        if peak > 0:
            at = (hardware == hw) & (dtypes == dt)
            out[at] = flops[at] / peak * 1e6
    return out


def faster_than_peak(frame: pd.DataFrame, primitive: str) -> np.ndarray:
    """Rows of a tensor-core primitive timed faster than `peak_bound_us` allows (by more than `PEAK_SLACK`); all
    False for other primitives and parts without a datasheet entry."""
    if primitive not in TENSOR_PRIMITIVES:
        return np.zeros(len(frame), dtype=bool)
    bound = np.nan_to_num(peak_bound_us(frame), nan=0.0)
    return bound > PEAK_SLACK * frame["duration_us"].to_numpy(dtype="float64")


def flag_outliers(residual: np.ndarray, check_physics: np.ndarray, beyond_peak: np.ndarray | None = None
                  ) -> tuple[np.ndarray, dict]:
    """Boolean mask of rows to set aside and a report {kind: count, ...} (see module docstring); `beyond_peak`:
    rows `faster_than_peak` found."""
    n = len(residual)
    impossible = check_physics & (residual < -np.log10(IMPOSSIBLE_FACTOR))
    if beyond_peak is not None:
        impossible |= beyond_peak
        if beyond_peak.sum() * 2 > n:  # most rows beyond the peak: the set's timing is broken as a whole
            impossible = np.ones(n, dtype=bool)
    mode = np.zeros(n, dtype=bool)
    rest = np.flatnonzero(~impossible & np.isfinite(residual))
    if len(rest) >= MIN_MODE_ROWS:
        order = rest[np.argsort(residual[rest])]
        gaps = np.diff(residual[order])
        cuts = np.flatnonzero(gaps > MODE_GAP)
        if len(cuts):
            clusters = np.split(order, cuts + 1)
            main = max(clusters, key=len)
            for cluster in clusters:
                if cluster is not main:
                    mode[cluster] = True
    report = {"impossible": int(impossible.sum()), "separate_mode": int(mode.sum())}
    return impossible | mode, report


def predict(booster: xgb.Booster, features: list[str], primitive: str, frame: pd.DataFrame,
            target: str = RATIO_TARGET, physics: tuple[pd.DataFrame, np.ndarray] | None = None,
            size_grid: list[float] | None = None) -> tuple[np.ndarray, pd.DataFrame]:
    """Predicted duration (µs) of each row and the feature matrix it was computed from. With `size_grid` (the
    sampled message sizes of a collective's plain-time model), a message between two of them gets the log-linear
    interpolation of the model's answers at both."""
    matrix, roof = design(frame, primitive, features, physics)
    log_roof = np.log10(np.where(np.isfinite(roof) & (roof > 0), roof, 1.0))
    if target == LOG_TARGET:
        log_roof = np.zeros(len(frame))
    pred = 10 ** (np.asarray(booster.inplace_predict(matrix.to_numpy()), dtype="float64") + log_roof)
    if size_grid and len(size_grid) > 1 and "bytes" in frame.columns:
        grid = np.asarray(size_grid, dtype="float64")
        size = pd.to_numeric(frame["bytes"], errors="coerce").to_numpy("float64")
        between = (size > grid[0]) & (size < grid[-1]) & ~np.isin(size, grid)
        if between.any():
            upper = np.searchsorted(grid, size[between])
            lo, hi = grid[upper - 1], grid[upper]
            rows = frame[between]
            at_lo, _ = predict(booster, features, primitive, rows.assign(bytes=lo), target)
            at_hi, _ = predict(booster, features, primitive, rows.assign(bytes=hi), target)
            w = np.log(size[between] / lo) / np.log(hi / lo)
            pred[between] = at_lo ** (1 - w) * at_hi ** w
    return pred, matrix


def size_grid(frame: pd.DataFrame) -> list[float]:
    """The distinct sampled message sizes of a collective's rows (at most SIZE_GRID_MAX, geometric subset)."""
    sizes = np.unique(pd.to_numeric(frame["bytes"], errors="coerce").dropna().to_numpy("float64"))
    sizes = sizes[sizes > 0]
    if len(sizes) > SIZE_GRID_MAX:
        picks = np.searchsorted(sizes, np.geomspace(sizes[0], sizes[-1], SIZE_GRID_MAX))
        sizes = sizes[np.unique(picks.clip(0, len(sizes) - 1))]
    return sizes.tolist()


def sample_hash(frame: pd.DataFrame, columns: list[str]) -> str:
    """Order-independent hash of the training rows (features and durations)."""
    rows = pd.util.hash_pandas_object(frame[columns], index=False).to_numpy()
    return hashlib.blake2b(np.sort(rows).tobytes(), digest_size=8).hexdigest()


def ape_stats(pred: ArrayLike, true: ArrayLike) -> dict:
    """MAPE, median and p90 absolute percentage error as fractions."""
    return ape_summary(np.abs(np.asarray(pred, float) - np.asarray(true, float)) / np.asarray(true, float))


def ape_summary(ape: np.ndarray) -> dict:
    """Mean (MAPE), median and 90th percentile of absolute percentage errors (fractions); None when empty."""
    if not len(ape):
        return {"mape": None, "median_ape": None, "p90_ape": None}
    return {"mape": float(np.mean(ape)), "median_ape": float(np.median(ape)), "p90_ape": float(np.quantile(ape, 0.9))}


def cv_splits(n: int, folds: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) row positions of each cross-validation fold of `n` rows: scikit-learn's KFold over the rows
    shuffled with `seed`, min(folds, n) folds; none (no cross-validation) for fewer than 4 rows or 2 folds."""
    k = min(folds, n) if n >= 4 else 0
    if k < 2:
        return []
    from sklearn.model_selection import KFold  # scikit-learn (with scipy) takes ~1.5 s to import: only when fitting

    return list(KFold(n_splits=k, shuffle=True, random_state=seed).split(np.empty((n, 0))))


def _train(x: np.ndarray, y: np.ndarray, depth: int, rounds: int, seed: int, threads: int,
           monotone: tuple[int, ...] | None = None) -> xgb.Booster:
    import xgboost as xgb

    params = {
        "objective": "reg:squarederror", "eta": ETA, "max_depth": depth, "min_child_weight": 1,
        "subsample": 0.8, "colsample_bytree": 1.0, "tree_method": "hist", "nthread": threads, "seed": seed,
        "verbosity": 0,
    }
    if monotone:
        params["monotone_constraints"] = "(" + ",".join(map(str, monotone)) + ")"
    return xgb.train(params, xgb.DMatrix(x, label=y), num_boost_round=rounds)


def fit(frame: pd.DataFrame, primitive: str, folds: int = 5, seed: int = 0, threads: int = 1,
        depths: tuple[int, ...] = DEPTHS, round_steps: tuple[int, ...] = ROUND_STEPS) -> FitResult:
    """Fit one model on samples of a single (hardware, primitive, pass, group); `frame` needs duration_us."""
    import xgboost as xgb

    start = time.perf_counter()
    matrix, roof = design(frame, primitive)
    keep = [c for c in matrix.columns if matrix[c].notna().any()]
    if not keep:
        raise ModelError(f"{primitive}: no shape features in {len(frame)} samples, nothing to learn from")
    matrix = matrix[keep]
    has_roof = np.isfinite(roof) & (roof > 0)
    log_roof = np.log10(np.where(has_roof, roof, 1.0))
    duration = frame["duration_us"].to_numpy(dtype="float64")
    residual = np.log10(duration) - log_roof
    drop, outliers = flag_outliers(residual, has_roof & (primitive in COLLECTIVE_PRIMITIVES),
                                   faster_than_peak(frame, primitive))
    outliers["rows"] = int(len(frame))
    x_all = matrix.to_numpy()
    x, y, t = x_all[~drop], residual[~drop], duration[~drop]
    n = len(y)

    base = {RATIO_TARGET: log_roof[~drop], LOG_TARGET: np.zeros(n)}
    labels = {RATIO_TARGET: y, LOG_TARGET: np.log10(t)}
    collective = primitive in COLLECTIVE_PRIMITIVES
    if collective:  # the plain time under monotone constraints: a larger message is never quicker, by construction
        candidates = [(LOG_TARGET, d) for d in LOG_TARGET_DEPTHS]
    else:
        candidates = [(RATIO_TARGET, d) for d in depths]
        if n < LOG_TARGET_MAX_ROWS:
            candidates += [(LOG_TARGET, d) for d in LOG_TARGET_DEPTHS]
    size_rule = tuple(int(c in SIZE_FEATURES) for c in keep) if collective else None
    monotone = {RATIO_TARGET: None, LOG_TARGET: size_rule}
    oof = np.full((len(candidates), len(round_steps), n), np.nan)
    splits = cv_splits(n, folds, seed)
    k = len(splits)
    if k >= 2:
        for train, test in splits:
            dtest = xgb.DMatrix(x[test])
            for i, (target, depth) in enumerate(candidates):
                booster = _train(x[train], labels[target][train], depth, max(round_steps), seed, threads,
                                 monotone[target])
                for j, rounds in enumerate(round_steps):
                    oof[i, j, test] = booster.predict(dtest, iteration_range=(0, rounds)) + base[target][test]
        pred_t = 10 ** oof
        mape = np.nanmean(np.abs(pred_t - t) / t, axis=2)
        is_log = np.array([c[0] == LOG_TARGET for c in candidates])
        if is_log.any() and (~is_log).any() and \
                np.nanmin(mape[is_log]) > LOG_TARGET_GAIN * np.nanmin(mape[~is_log]):
            mape[is_log] = np.nan
        good = np.argwhere(mape <= np.nanmin(mape) * PARSIMONY + 1e-4)
        i, j = min(good, key=lambda ij: (2 ** candidates[ij[0]][1] * round_steps[ij[1]], mape[tuple(ij)]))
        (target, depth), rounds = candidates[i], round_steps[j]
        cv = {"folds": k, **ape_stats(pred_t[i, j], t)}
        oof_series = pd.Series(np.nan, index=frame.index)
        oof_series[~drop] = pred_t[i, j]
    else:
        target, depth = candidates[0][0], min(d for _, d in candidates)
        rounds = min(round_steps)
        cv = {"folds": 0, "mape": None, "median_ape": None, "p90_ape": None}
        oof_series = pd.Series(np.nan, index=frame.index)
    y = labels[target]
    final = _train(x, y, depth, rounds, seed, threads, monotone[target]) if n else None
    ranges = {
        c: [float(np.nanmin(matrix[c][~drop])), float(np.nanmax(matrix[c][~drop]))]
        for c in keep if c in shape_features(primitive) and matrix[c][~drop].notna().any()
    }
    hash_cols = [c for c in shape_features(primitive) if c in frame.columns] + ["duration_us"]
    return FitResult(
        booster=final, features=keep, ranges=ranges,
        params={"max_depth": int(depth), "rounds": int(rounds), "eta": ETA, "objective": "reg:squarederror",
                "target": target, **({"monotone_in": [c for c in keep if c in SIZE_FEATURES],
                                      "size_grid": size_grid(frame[~drop])} if monotone[target] else {})},
        n_samples=n, cv=cv, outliers=outliers, train_hash=sample_hash(frame, hash_cols),
        seconds=time.perf_counter() - start, oof=oof_series,
    )
