"""Ranking quality of `tracekit predict` with the CLI's defaults: does the predicted-fastest split win?

Groups the measured vTrain single-node runs (../shared/corpus/e2e/vtrain_a100_single_node.csv) that share model
(layers, hidden), GPU count and global batch — so they differ only in tp/pp/dp/micro-batch — and reports per group
the top-1 regret (measured time of the predicted-fastest split over the measured-fastest, minus 1) and Kendall's τ
between predicted and measured order, then the median/mean regret, the share of groups whose predicted best is the
measured best, and the mean τ. Predictions are as `predict --batch` gives them, with the stack's host constants
5-fold cross-validated (each row predicted with constants fitted on the other folds), as in e2e_accuracy.py; the
same figures without any stack constants are printed beside. Goals (issue: tracekit search): median regret ≤ 2%,
mean ≤ 4%, τ ≥ 0.85.

Run: .venv/bin/python benchmarks/ranking.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from predictor.costs.learned.models import ModelSet  # noqa: E402
from predictor.sweeps.calibration_fit import iteration_times_s  # noqa: E402
from tools import stack_fits as sf  # noqa: E402
from tracekit.core.calibration import NONE  # noqa: E402


def ranking(rows, predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        c = r.config
        groups.setdefault((c.num_layers, c.hidden_size, c.world_size, c.global_batch_size), []).append(i)
    regrets, taus, hits = [], [], 0
    for idx in groups.values():
        if len(idx) < 2:
            continue
        idx = np.array(idx)
        chosen = idx[np.argmin(predicted[idx])]
        best = measured[idx].min()
        regrets.append(measured[chosen] / best - 1)
        hits += measured[chosen] == best
        if len(idx) >= 3:
            tau = kendalltau(predicted[idx], measured[idx]).statistic
            if np.isfinite(tau):
                taus.append(tau)
    regrets = np.array(regrets)
    return {"groups": len(regrets), "top1": hits / len(regrets), "median_regret": float(np.median(regrets)),
            "mean_regret": float(regrets.mean()), "tau": float(np.mean(taus)), "tau_groups": len(taus)}


def main() -> None:
    models = ModelSet.load()
    data = sf.load_set(models, sf.VTRAIN_SINGLE)  # the rows as `predict --batch` parses them (tools/stack_fits.py)
    rows, measured = data.rows, data.measured
    runs = {"defaults (stack constants 5-fold CV)": sf.deepspeed_held_out(data),
            "no stack constants": iteration_times_s(data.prepared, NONE)}
    print(f"{'predictions':<38} {'groups':>6} {'top-1 hit':>9} {'median regret':>13} {'mean regret':>11} "
          f"{'Kendall τ':>9}")
    for label, predicted in runs.items():
        r = ranking(rows, predicted, measured)
        print(f"{label:<38} {r['groups']:>6} {100 * r['top1']:>8.1f}% {100 * r['median_regret']:>12.2f}% "
              f"{100 * r['mean_regret']:>10.2f}% {r['tau']:>9.3f}")
    print("goals: median regret ≤ 2%, mean ≤ 4%, τ ≥ 0.85 (τ over groups of ≥ 3 splits)")


if __name__ == "__main__":
    main()
