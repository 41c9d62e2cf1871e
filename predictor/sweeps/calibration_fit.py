"""Fit a Calibration (`tracekit.core.calibration`) to measured iteration times: Gauss–Newton on the relative error of
predicted vs measured iteration times over a chosen subset of the constants, the others staying at identity, with
an optional pull toward identity; `select_params` chooses the subset by leave-one-out over the runs.

Inputs: TrainingConfigs, their Clusters, measured iteration times (s) and a ModelSet (`fit_calibration`), or graphs
already prepared by `predictor.predict.prepare_many` (`fit_prepared`, `held_out_times_s`, `iteration_times_s`).
Output: a Calibration whose `fit` records how it was obtained. Raises ConfigError for unknown constants, too few
runs, non-positive times or a configuration that cannot be predicted.
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Sequence

import numpy as np

from predictor.predict import prepare_many
from predictor.schedule.stage_work import simulate_graph
from tracekit.core.calibration import CONSTANTS, NONE, Calibration, host_scaled
from tracekit.core.errors import ConfigError

#: Lower bounds (scales stay positive, overheads non-negative) and finite-difference steps of each constant.
LOWER = {"compute_scale": 0.2, "memory_scale": 0.2, "comm_scale": 0.2, "attention_scale": 0.2,
         "microbatch_overhead_us": 0.0, "host_op_us": 0.0, "op_overhead_us": 0.0, "iteration_overhead_us": 0.0,
         "tensor_op_us": 0.0}
STEP = {"compute_scale": 0.05, "memory_scale": 0.05, "comm_scale": 0.05, "attention_scale": 0.05,
        "microbatch_overhead_us": 50.0, "host_op_us": 5.0, "op_overhead_us": 5.0, "iteration_overhead_us": 500.0,
        "tensor_op_us": 2.0}
#: Starting host costs per op (µs): the host floor is a max(), its derivative is zero until it binds.
HOST_STARTS = (0.0, 40.0, 80.0, 120.0)
#: Coarse values per constant for `search=True` (few constants): the best grid points start Gauss–Newton. GPU
#: launch costs are tens of µs per op; a framework's per-op cost on a busy CPU reaches hundreds.
GRID = {"compute_scale": (0.5, 1.0, 2.0, 4.0), "memory_scale": (0.5, 1.0, 2.0, 4.0), "comm_scale": (0.5, 1.0, 2.0, 4.0),
        "attention_scale": (0.5, 1.0, 2.0, 4.0),
        "microbatch_overhead_us": (0.0, 500.0, 2000.0, 5000.0), "host_op_us": (0.0, 40.0, 120.0, 300.0, 600.0),
        "op_overhead_us": (0.0, 20.0, 60.0, 150.0, 400.0), "iteration_overhead_us": (0.0, 2000.0, 10000.0, 50000.0),
        "tensor_op_us": (0.0, 10.0, 30.0, 100.0)}
GRID_STARTS = 3
#: Step halvings tried per Gauss–Newton round before taking the smallest step anyway (the best round is kept).
HALVINGS = 6
#: Few runs (a handful of captures): per-op host floor, communication scale, per-micro-batch overhead.
DEFAULT_PARAMS = ("host_op_us", "comm_scale", "microbatch_overhead_us")
#: The sets `params="auto"` chooses from by leave-one-out over the runs: none (the models as they are: a few noisy
#: runs must show that a constant predicts the run left out better), or each a physical account of why a stack
#: differs from its samples (slower or quicker kernels, collectives, framework costs per op, per micro-batch,
#: per iteration).
CANDIDATE_PARAMS = (
    (), ("comm_scale",), ("host_op_us",), ("op_overhead_us",), ("microbatch_overhead_us",), ("iteration_overhead_us",),
    ("compute_scale", "memory_scale"), ("host_op_us", "comm_scale"), ("op_overhead_us", "comm_scale"),
    ("comm_scale", "microbatch_overhead_us"),
    ("memory_scale", "comm_scale"), ("compute_scale", "memory_scale", "comm_scale"),
    ("host_op_us", "comm_scale", "microbatch_overhead_us"), ("comm_scale", "microbatch_overhead_us",
                                                             "iteration_overhead_us"),
)


def iteration_times_s(prepared: Sequence, cal: Calibration) -> np.ndarray:
    """Simulated iteration time (s) of each prepared graph (`predictor.predict.prepare_many` items) under `cal`."""
    return np.array([simulate_graph(g, est, cal)[3].iteration_us / 1e6 for g, est, _, _ in prepared])


def _mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - measured) / measured))


def fit_prepared(prepared: Sequence, measured_s: Sequence[float] | np.ndarray, params: Sequence[str] = tuple(CONSTANTS),
                 rounds: int = 5, regularization: float = 0.0, base: Calibration = NONE, loss: str = "squared",
                 search: bool = False) -> tuple[Calibration, list[float]]:
    """Fit `params` (the other constants keep `base`'s values) to measured iteration times (s) of prepared graphs.
    Gauss–Newton on relative error — squared (`loss="squared"`) or absolute (`loss="mape"`, by reweighting each
    round's rows with 1/|error|), each step halved while it raises the MAPE — from each of
    HOST_STARTS when `host_op_us` is fitted, or with `search` (≤ 3 constants) from the GRID_STARTS best points of
    the coarse GRID; the round with the lowest MAPE wins. `regularization` λ pulls toward identity: each
    constant's departure costs λ × (the mean relative change of the predictions it causes)², so constants the data
    does not pin stay near identity. Returns (calibration, MAPE by round of the winning start)."""
    unknown = [p for p in params if p not in CONSTANTS]
    if unknown or not params:
        raise ConfigError(f"unknown calibration constants {unknown} (known: {', '.join(CONSTANTS)})")
    if loss not in ("squared", "mape"):
        raise ConfigError(f"loss must be 'squared' or 'mape', not {loss!r}")
    measured = np.asarray(measured_s, dtype=float)
    if search and len(params) <= 3:
        points = [np.array(v, dtype=float) for v in itertools.product(*(GRID[p] for p in params))]
        scores = [_mape(iteration_times_s(prepared, base.with_values(**dict(zip(params, v)))), measured)
                  for v in points]
        starts = [points[i] for i in np.argsort(scores)[:GRID_STARTS]]
    else:
        starts = [np.array([host if p == "host_op_us" else getattr(base, p) for p in params], dtype=float)
                  for host in (HOST_STARTS if "host_op_us" in params else (base.host_op_us,))]

    def at(values: np.ndarray) -> Calibration:
        return base.with_values(**dict(zip(params, map(float, values))))

    def times(values: np.ndarray) -> np.ndarray:
        return iteration_times_s(prepared, at(values))

    identity = np.array([getattr(NONE, p) for p in params])
    fits = [_gauss_newton(times, measured, theta, identity, _bounds(params), rounds, regularization, loss)
            for theta in starts]
    best, history = min(fits, key=lambda fitted: min(fitted[1]))  # the first of the lowest
    return at(best), history


def _bounds(params: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(lower bounds, finite-difference steps) of `params`."""
    return np.array([LOWER[p] for p in params]), np.array([STEP[p] for p in params])


def _gauss_newton(times: Callable[[np.ndarray], np.ndarray], measured: np.ndarray, theta: np.ndarray,
                  identity: np.ndarray, bounds: tuple[np.ndarray, np.ndarray], rounds: int, regularization: float,
                  loss: str) -> tuple[np.ndarray, list[float]]:
    """Gauss–Newton on relative error of `times(theta)` (the simulated time is piecewise linear in every constant).
    Returns the parameters of the round with the lowest MAPE and the MAPE of every round."""
    lower, steps = bounds
    history: list[float] = []
    best_mape: float | None = None
    best_theta = theta.copy()
    for _ in range(rounds + 1):
        now = times(theta)
        history.append(_mape(now, measured))
        if best_mape is None or history[-1] < best_mape:
            best_mape, best_theta = history[-1], theta.copy()
        if len(history) > rounds:
            break
        jac = np.empty((len(measured), len(theta)))
        for j in range(len(theta)):
            bumped = theta.copy()
            bumped[j] += steps[j]
            jac[:, j] = (times(bumped) - now) / steps[j] / measured
        resid = (measured - now) / measured
        weight = 1 / np.sqrt(np.maximum(np.abs(resid), 0.01)) if loss == "mape" else np.ones_like(resid)
        lhs, rhs = jac * weight[:, None], resid * weight
        if regularization > 0:
            pull = math.sqrt(regularization) * np.mean(np.abs(jac), axis=0)
            lhs = np.vstack([lhs, np.diag(pull)])
            rhs = np.concatenate([rhs, -pull * (theta - identity)])
        delta, *_ = np.linalg.lstsq(lhs, rhs, rcond=None)
        for _ in range(HALVINGS):  # damped: halve a step that makes the error worse
            trial = np.maximum(theta + delta, lower)
            if _mape(times(trial), measured) <= history[-1]:
                break
            delta = delta / 2
        theta = trial
    return best_theta, history


#: Bounds and step of a host class's scale.
HOST_SCALE_LOWER, HOST_SCALE_STEP = 0.2, 0.02


def fit_with_hosts(prepared: Sequence, measured_s: Sequence[float] | np.ndarray, hosts: Sequence[str],
                   params: Sequence[str], reference: str, rounds: int = 5, loss: str = "mape"
                   ) -> tuple[Calibration, dict[str, float], list[float]]:
    """Fit `params` (on the `reference` host CPU) and one scale of the host constants per other host CPU of the runs
    (`hosts[i]`: run i's host class) to measured iteration times, as `fit_prepared` does from each of HOST_STARTS.
    Returns (calibration on the reference host, {host class: scale} with the reference at 1, MAPE by round)."""
    unknown = [p for p in params if p not in CONSTANTS]
    if unknown or not params:
        raise ConfigError(f"unknown calibration constants {unknown} (known: {', '.join(CONSTANTS)})")
    measured = np.asarray(measured_s, dtype=float)
    hosts = list(hosts)
    others = sorted({h for h in hosts if h != reference})
    row_host = np.array([0 if h == reference else 1 + others.index(h) for h in hosts])
    n = len(params)

    def times(values: np.ndarray) -> np.ndarray:
        base = NONE.with_values(**dict(zip(params, map(float, values[:n]))))
        scales = np.concatenate([[1.0], values[n:]])
        cals = [host_scaled(base, float(v)) for v in scales]
        return np.array([simulate_graph(g, est, cals[row_host[i]])[3].iteration_us / 1e6
                         for i, (g, est, _, _) in enumerate(prepared)])

    lower, steps = _bounds(params)
    bounds = (np.concatenate([lower, np.full(len(others), HOST_SCALE_LOWER)]),
              np.concatenate([steps, np.full(len(others), HOST_SCALE_STEP)]))
    identity = np.concatenate([[getattr(NONE, p) for p in params], np.ones(len(others))])
    starts = [np.concatenate([[host if p == "host_op_us" else getattr(NONE, p) for p in params], np.ones(len(others))])
              for host in (HOST_STARTS if "host_op_us" in params else (0.0,))]
    fits = [_gauss_newton(times, measured, theta, identity, bounds, rounds, 0.0, loss) for theta in starts]
    best, history = min(fits, key=lambda fitted: min(fitted[1]))
    cal = NONE.with_values(**dict(zip(params, map(float, best[:n]))))
    return cal, {reference: 1.0, **{h: float(v) for h, v in zip(others, best[n:])}}, history


def held_out_times_s(prepared: Sequence, measured: np.ndarray, folds: np.ndarray,
                     fit: Callable[[list, np.ndarray], Calibration]) -> np.ndarray:
    """Cross-validated iteration times (s): the runs of each fold (`folds[i]` is run i's fold) predicted under the
    calibration `fit(prepared, measured)` returns for the runs of the other folds."""
    out = np.empty(len(measured))
    for k in np.unique(folds):
        train, test = np.flatnonzero(folds != k), np.flatnonzero(folds == k)
        out[test] = iteration_times_s([prepared[int(i)] for i in test],
                                      fit([prepared[int(i)] for i in train], measured[train]))
    return out


def _enough_runs_to_choose(n: int) -> None:
    if n < 3:
        raise ConfigError(f"choosing the constants needs at least 3 measured runs (have {n}): name them with --params")


def select_params(prepared: Sequence, measured_s: Sequence[float] | np.ndarray, regularization: float = 0.01,
                  candidates: Sequence[Sequence[str]] = CANDIDATE_PARAMS, rounds: int = 8
                  ) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
    """Choose the constants to fit by leave-one-out: for each candidate set small enough to fit on all runs but one,
    fit it on every such subset and predict the run left out. One-standard-error rule: the set with the lowest
    held-out MAPE sets the bar (that MAPE plus the standard error of its runs' held-out errors), and the set with
    the fewest constants under the bar wins (the lower MAPE among equals): a few noisy runs must show more than noise
    before a constant is fitted. Returns (chosen set, [{params, loo_mape, loo_se}] of every candidate tried)."""
    measured = np.asarray(measured_s, dtype=float)
    n = len(measured)
    _enough_runs_to_choose(n)
    scores: list[dict[str, Any]] = []
    for params in candidates:
        if len(params) > n - 1:
            continue
        held_out = held_out_times_s(prepared, measured, np.arange(n), lambda p, m: fit_prepared(
            p, m, params, rounds=rounds, regularization=regularization, loss="mape", search=True)[0]
        ) if params else iteration_times_s(prepared, NONE)
        errors = np.abs(held_out - measured) / measured
        scores.append({"params": list(params), "loo_mape": float(errors.mean()),
                       "loo_se": float(errors.std(ddof=1) / math.sqrt(n))})
    best = min(scores, key=lambda row: row["loo_mape"])
    bar = best["loo_mape"] + best["loo_se"]
    chosen = min((row for row in scores if row["loo_mape"] <= bar),
                 key=lambda row: (len(row["params"]), row["loo_mape"]))
    return tuple(chosen["params"]), scores


def fit_calibration(configs: Sequence, clusters, measured_s: Sequence[float], models,
                    params: Sequence[str] | str = DEFAULT_PARAMS, regularization: float = 0.01, name: str = "fitted",
                    labels: Sequence[str] | None = None, rounds: int = 8) -> Calibration:
    """Fit a few global constants so that predicted iteration times of `configs` (TrainingConfig) on `clusters`
    (one Cluster or one per config) match `measured_s` (seconds), minimizing their mean absolute relative error.

    `params="auto"` chooses the constants by leave-one-out over the runs (`select_params`; needs ≥ 3 runs). The
    result's `fit` records the rows (label, measured, predicted before and after), the fitted constants, the
    regularization, MAPE uncalibrated / in sample, and with "auto" every candidate's held-out MAPE. Raises
    ConfigError when a configuration cannot be predicted or there are fewer runs than constants."""
    measured = np.asarray(measured_s, dtype=float)
    if len(configs) != len(measured):
        raise ValueError("give one measured time per configuration")
    if params == "auto":
        _enough_runs_to_choose(len(configs))  # before the (slow) predictions
    elif len(configs) < len(params):
        raise ConfigError(f"{len(configs)} measured run(s) cannot determine {len(params)} constants "
                          f"({', '.join(params)}): give at least as many runs as constants, or fewer --params")
    if not np.all(np.isfinite(measured) & (measured > 0)):
        raise ConfigError("measured iteration times must be positive")
    labels = list(labels) if labels is not None else [f"run {i + 1}" for i in range(len(configs))]
    if len(labels) != len(configs):
        raise ValueError("give one label per configuration")
    prepared = []
    for label, item in zip(labels, prepare_many(configs, clusters, models)):
        if isinstance(item, Exception):
            raise ConfigError(f"{label}: cannot be predicted ({item})")
        prepared.append(item)
    selection = None
    if params == "auto":
        params, selection = select_params(prepared, measured, regularization, rounds=rounds)
    cal, history = fit_prepared(prepared, measured, params, rounds=rounds, regularization=regularization,
                                loss="mape", search=True) if params else (NONE, [])
    before, after = iteration_times_s(prepared, NONE), iteration_times_s(prepared, cal)
    fit = {
        "params": list(params),
        "constants": {p: getattr(cal, p) for p in params},
        "regularization": regularization,
        "loss": "mape",
        "rows": [{"label": lab, "measured_s": float(m), "predicted_before_s": float(b), "predicted_after_s": float(a)}
                 for lab, m, b, a in zip(labels, measured, before, after)],
        "mape_uncalibrated": _mape(before, measured),
        "mape_in_sample": _mape(after, measured),
        "mape_by_round": history,
        "hardware": sorted({g.hardware for g, _, _, _ in prepared}),
    }
    if selection is not None:
        fit["selection"] = {"method": "leave-one-out over the runs", "candidates": selection}
    index = getattr(models, "index", None)
    if isinstance(index, dict) and index.get("created"):
        fit["models_created"] = index["created"]
    return cal.with_values(name=name, fit=fit)
