"""Operator accuracy: tracekit's regressors vs the seed paper's own fits, per (GPU, op, pass[, topology]).

5-fold cross-validation on the seed paper's published samples (estimate-train-time, A100-SXM4-80GB and GH200),
exactly as `tracekit train` runs it: one model per hardware, primitive, pass and variant group; each row is predicted
by the model of the fold that did not see it, and the hyper-parameters (depth, rounds) are the ones with the lowest
out-of-fold error on a small grid — the same "best of a grid" selection the paper's `Best_error%` reports. Rows the
training rules set aside as outliers are still scored (predicted by the model trained without them), so the error
is comparable with the paper's `Best_error%` (MAPE as a fraction, from its fit-summary files); the `plausible`
column leaves them out. Exact duplicate rows (a sweep's combined NCCL file repeats rows of its per-topology files)
are counted once, so no row is in both train and test.

Usage: python benchmarks/operator_accuracy.py [CORPUS/operator-samples/estimate-train-time] [--json out.json]
Prints one table (ours, paper, ratio per entry) and the summary: median error, share of entries where ours is lower.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from extractors import ett  # noqa: E402
from predictor.models import deduplicate, groups_of  # noqa: E402
from predictor.regressor import fit, predict  # noqa: E402

DEFAULT = ROOT.parent / "shared" / "corpus" / "operator-samples" / "estimate-train-time"


def cross_validate(samples: pd.DataFrame, folds: int = 5, seed: int = 0) -> tuple[pd.Series, pd.Series]:
    """Out-of-fold predicted duration for every row (index of `samples`) and the outlier flags of training."""
    oof = pd.Series(np.nan, index=samples.index)
    outlier = pd.Series(False, index=samples.index)
    keys = samples.groupby(["hardware", "primitive", "pass", "group"], sort=True).groups
    for n, ((hardware, primitive, pass_, group), index) in enumerate(keys.items(), 1):
        frame = samples.loc[index]
        start = time.perf_counter()
        result = fit(frame, primitive, folds=folds, seed=seed)
        oof.loc[index] = result.oof
        aside = result.oof.isna()
        outlier.loc[index] = aside
        if aside.any():  # set aside by the outlier rules: never trained on, predicted by the final model
            oof.loc[aside[aside].index], _ = predict(result.booster, result.features, primitive, frame[aside],
                                                          result.params["target"])
        print(f"[{n}/{len(keys)}] {hardware} {primitive} {pass_} {group}: {len(frame)} rows, {'log' if 'roofline' not in result.params['target'] else 'ratio'} "
              f"depth {result.params['max_depth']} × {result.params['rounds']} rounds, {time.perf_counter() - start:.1f} s",
              file=sys.stderr, flush=True)
    return oof, outlier


def entries(samples: pd.DataFrame, oof: pd.Series, paper: pd.DataFrame) -> pd.DataFrame:
    """One row per paper entry: our MAPE on its rows next to the paper's Best_error%."""
    ape = (oof - samples["duration_us"]).abs() / samples["duration_us"]
    rows = []
    for entry in paper.itertuples(index=False):
        mask = (samples["hardware"] == entry.hardware) & (samples["variant"] == entry.op) \
            & (samples["pass"] == entry.pass_)
        if entry.nodes:
            mask &= (samples["nodes"] == entry.nodes) & (samples["ranks_per_node"] == entry.gpus_per_node)
        if not mask.any():
            continue
        err = ape[mask]
        plausible = err[~samples.loc[mask, "outlier"]]
        rows.append({
            "hardware": entry.hardware, "op": entry.op, "pass": entry.pass_,
            "topology": f"{entry.nodes}x{entry.gpus_per_node}" if entry.nodes else ("all" if entry.pass_ == "comm" else ""),
            "n": int(mask.sum()), "outliers": int(samples.loc[mask, "outlier"].sum()),
            "ours": float(err.mean()), "ours_median_ape": float(err.median()),
            "ours_plausible": float(plausible.mean()) if len(plausible) else None,
            "paper": float(entry.best_error), "paper_model": entry.model,
        })
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", default=str(DEFAULT), help="estimate-train-time folder")
    parser.add_argument("--json", help="also write the table and summary as JSON here")
    parser.add_argument("--folds", type=int, default=5)
    args = parser.parse_args()

    start = time.perf_counter()
    samples = pd.concat([ett.read_file(p) for p in ett.list_files(args.root)], ignore_index=True)
    samples = deduplicate(samples).reset_index(drop=True)
    samples["group"] = groups_of(samples)
    paper = ett.fit_summaries(args.root).rename(columns={"pass": "pass_"})
    oof, samples["outlier"] = cross_validate(samples, folds=args.folds)
    table = entries(samples, oof, paper)
    table["ratio"] = table["ours"] / table["paper"]
    table["lower"] = table["ours"] < table["paper"]

    pd.set_option("display.width", 200)
    shown = table.assign(**{c: (100 * table[c]).round(2) for c in ("ours", "ours_plausible", "paper")},
                         ratio=table["ratio"].round(2))
    print(shown[["hardware", "op", "pass", "topology", "n", "outliers", "ours", "ours_plausible", "paper", "ratio",
                 "lower"]].to_string(index=False))
    summary = {
        "entries": int(len(table)),
        "median_error_ours": float(table["ours"].median()),
        "median_error_paper": float(table["paper"].median()),
        "share_lower": float(table["lower"].mean()),
        "median_ratio": float(table["ratio"].median()),
        "seconds": round(time.perf_counter() - start, 1),
    }
    print(f"\nentries {summary['entries']} · median error ours {100 * summary['median_error_ours']:.2f}% vs paper "
          f"{100 * summary['median_error_paper']:.2f}% · ours lower on {100 * summary['share_lower']:.0f}% of entries"
          f" · median ratio ours/paper {summary['median_ratio']:.2f} · {summary['seconds']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "entries": table.to_dict("records")}, indent=2))


if __name__ == "__main__":
    main()
