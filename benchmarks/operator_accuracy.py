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
Beside it, in the same run, a random forest (scikit-learn's RandomForestRegressor, 100 trees, its defaults) on the
same rows, features, target and folds as each XGBoost fit: per (GPU, primitive), the median absolute percentage error
of the held-out rows (the rows training sets aside as outliers left out of both) and the ratio XGBoost / forest.

`--transfer` measures instead the transfer path (`predictor.costs.physics.transfer`: estimates for a GPU without
models), per primitive, median absolute percentage error, side by side in one run with the plain roofline and with the
models of the most similar GPU used as they are (what one gets by predicting an H100 as a GH200):
(a) leave-one-GPU-out on the seed paper's compute samples: the bundled models without GH200's score GH200's
    samples from A100's models, and back (each set of bundled models was trained on its own GPU's samples only);
(b) the corpus's real kernels from ingest (TraceLens H100, B200, MI300X traces; kernels with shapes), which no
    bundled model was trained on, with the set without the published tables' GPUs (their own models: `--tables`);
(c) GPUs held out with every measurement of them (benchmarks/held_out_gpu.py, issue #35): H200's sample store and
    matmul table, H100's XLA matmul table, per primitive and pass, median and p90.
Usage: python benchmarks/operator_accuracy.py --transfer [--corpus ../shared/corpus] [--json out.json]  (~20 s)
`--breakdown bmm,softmax` adds, per trace and shape, the H100 kernels of those primitives: measured and predicted
median, the path that answered and whether `predictor.costs.physics.kernel_paths` took the shape as unaligned (#24).
Which primitives take the transfer path (tracekit/data/transfer.json) is chosen from (a) alone, by `make profiles`
(tools/transfer_selection.py).

`--tables` scores the models trained on published performance tables (XLA's H100, B200 and MI300X GEMM tables,
aiter's MI355X files, XLA's 8×H100 collectives): leave one measurement out on H100, cross-validation per table, the
TraceLens kernels, leave one GPU out and the H100 rows of the Megatron-Bridge end-to-end table, before and after, in
one table (benchmarks/table_accuracy.py says what each row scores).
Usage: python benchmarks/operator_accuracy.py --tables [--json out.json]  (~5 min)
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

from operator_rows import CORPUS, DEFAULT, TABLE_GPUS, corpus_rows  # noqa: E402

from extractors import ett  # noqa: E402
from predictor.costs.learned.model_keys import deduplicate, groups_of  # noqa: E402
from predictor.costs.learned.models import ModelSet  # noqa: E402
from predictor.costs.learned.regressor import RATIO_TARGET, cv_splits, design, fit, predict  # noqa: E402
from predictor.costs.physics.roofline import estimate_us  # noqa: E402
from predictor.costs.physics.transfer import source_weights, transfer_candidates  # noqa: E402
from tools.transfer_selection import GPUS, seed_rows  # noqa: E402
from tracekit.core.samples import COMPUTE_PRIMITIVES  # noqa: E402

#: Goals of issue #12 on the H100 kernels of the corpus: median error per primitive.
GOALS = {"gemm": 0.08, "bmm": 0.15, "norm": 0.15, "softmax": 0.15, "activation": 0.15}


def cross_validate(samples: pd.DataFrame, folds: int = 5, seed: int = 0
                   ) -> tuple[pd.Series, pd.Series, pd.Series]:
    """Out-of-fold predicted duration for every row (index of `samples`), the outlier flags of training, and the
    random forest's out-of-fold duration (`forest_oof`; NaN on outliers)."""
    oof = pd.Series(np.nan, index=samples.index)
    outlier = pd.Series(False, index=samples.index)
    forest = pd.Series(np.nan, index=samples.index)
    keys = samples.groupby(["hardware", "primitive", "pass", "group"], sort=True).groups
    for n, ((hardware, primitive, pass_, group), index) in enumerate(keys.items(), 1):
        frame = samples.loc[index]
        start = time.perf_counter()
        result = fit(frame, primitive, folds=folds, seed=seed)
        oof.loc[index] = result.oof
        forest.loc[index] = forest_oof(frame, primitive, result, folds, seed)
        aside = result.oof.isna()
        outlier.loc[index] = aside
        if aside.any():  # set aside by the outlier rules: never trained on, predicted by the final model
            oof.loc[aside[aside].index], _ = predict(result.booster, result.features, primitive, frame[aside],
                                                          result.params["target"])
        target = "log" if "roofline" not in result.params["target"] else "ratio"
        print(f"[{n}/{len(keys)}] {hardware} {primitive} {pass_} {group}: {len(frame)} rows, {target} "
              f"depth {result.params['max_depth']} × {result.params['rounds']} rounds, "
              f"{time.perf_counter() - start:.1f} s",
              file=sys.stderr, flush=True)
    return oof, outlier, forest


def forest_oof(frame: pd.DataFrame, primitive: str, result, folds: int, seed: int) -> pd.Series:
    """Out-of-fold duration (µs) of a random forest on what the XGBoost fit `result` used: the rows it kept (not
    set aside as outliers), its features, its target (ratio to the roofline or plain time, log10) and its folds
    (`cv_splits` over the kept rows, same seed). NaN where XGBoost has no out-of-fold prediction either."""
    from sklearn.ensemble import RandomForestRegressor

    out = pd.Series(np.nan, index=frame.index)
    kept = frame[result.oof.notna()]
    splits = cv_splits(len(kept), folds, seed)
    if not splits:
        return out
    matrix, roof = design(kept, primitive, result.features)
    base = np.log10(np.where(np.isfinite(roof) & (roof > 0), roof, 1.0)) if result.params["target"] == RATIO_TARGET \
        else np.zeros(len(kept))
    x, y = matrix.to_numpy(), np.log10(kept["duration_us"].to_numpy("float64")) - base
    pred = np.empty(len(kept))
    for train, test in splits:
        model = RandomForestRegressor(n_estimators=100, random_state=seed, n_jobs=1).fit(x[train], y[train])
        pred[test] = model.predict(x[test])
    out[kept.index] = 10 ** (pred + base)
    return out


def forest_table(samples: pd.DataFrame, oof: pd.Series, forest: pd.Series) -> pd.DataFrame:
    """Per (hardware, primitive): held-out rows, median APE of XGBoost and of the random forest on the same rows,
    ratio XGBoost / forest (< 1: XGBoost is closer)."""
    held = forest.notna() & oof.notna()
    true = samples.loc[held, "duration_us"]
    ape = pd.DataFrame({"hardware": samples.loc[held, "hardware"], "primitive": samples.loc[held, "primitive"],
                        "xgboost": (oof[held] - true).abs() / true, "forest": (forest[held] - true).abs() / true})
    table = ape.groupby(["hardware", "primitive"]).agg(n=("xgboost", "size"), xgboost=("xgboost", "median"),
                                                         forest=("forest", "median")).reset_index()
    table["ratio"] = table["xgboost"] / table["forest"]
    return table


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
            "topology": (f"{entry.nodes}x{entry.gpus_per_node}" if entry.nodes
                         else ("all" if entry.pass_ == "comm" else "")),
            "n": int(mask.sum()), "outliers": int(samples.loc[mask, "outlier"].sum()),
            "ours": float(err.mean()), "ours_median_ape": float(err.median()),
            "ours_plausible": float(plausible.mean()) if len(plausible) else None,
            "paper": float(entry.best_error), "paper_model": entry.model,
        })
    return pd.DataFrame(rows)


def compare(rows: pd.DataFrame, models: ModelSet, label: str, selected: bool = True) -> pd.DataFrame:
    """Per (hardware, primitive): rows, median APE of transfer on every compute primitive (`transfer_all`), of what
    `predict` answers (`selected`: transfer where the leave-one-GPU-out selection chose it, else roofline), of the
    roofline and of the most similar source GPU's models as they are; ratio = transfer_all / roofline. `models` must
    hold no model of the rows' hardware. `selected=False`: no selection yet (`selected` repeats transfer_all)."""
    rows = rows.reset_index(drop=True)
    every = models.predict(rows, transfer_primitives=frozenset(COMPUTE_PRIMITIVES))
    chosen = models.predict(rows) if selected else every
    assert (every["path"] != "model").all(), "the scored GPU has models of its own: not a transfer measurement"
    true = rows["duration_us"].to_numpy()
    ape = pd.DataFrame({"transfer_all": (every["duration_us"].to_numpy() - true) / true,
                        "selected": (chosen["duration_us"].to_numpy() - true) / true,
                        "roofline": (estimate_us(rows) - true) / true}).abs()
    ape["as_is"] = np.nan
    for (hw, primitive, pass_), index in rows.groupby(["hardware", "primitive", "pass"]).groups.items():
        held = transfer_candidates(models, str(primitive), str(pass_))
        weights = source_weights(str(hw), held)
        if not weights:
            continue
        t, _, ok = models.direct_estimates(rows.loc[index].assign(hardware=weights[0][0]))
        ape.loc[index, "as_is"] = np.where(ok, np.abs(t - true[index]) / true[index], np.nan)
    ape[["hardware", "primitive"]] = rows[["hardware", "primitive"]]
    ape["path"] = chosen["path"].to_numpy()
    table = ape.groupby(["hardware", "primitive"]).agg(
        n=("roofline", "size"), path=("path", lambda p: p.mode().iat[0]), transfer_all=("transfer_all", "median"),
        selected=("selected", "median"), roofline=("roofline", "median"), as_is=("as_is", "median")).reset_index()
    table["ratio"] = table["transfer_all"] / table["roofline"]
    table.insert(0, "set", label)
    table["sources"] = [", ".join(sorted(set(every.loc[rows["hardware"] == hw, "sources"]) - {""}))
                        for hw in table["hardware"]]
    return table


def breakdown(rows: pd.DataFrame, models: ModelSet, hardware: str, primitives: tuple[str, ...]) -> pd.DataFrame:
    """Per trace and shape of `hardware`'s kernels of `primitives`: kernels, dtype, measured and predicted median
    (µs), signed error, the path that answered and whether `predictor.costs.physics.kernel_paths` took the shape as
    unaligned."""
    from predictor.costs.physics import kernel_paths

    part = rows[(rows["hardware"] == hardware) & rows["primitive"].isin(primitives)].reset_index(drop=True)
    answer = models.predict(part)
    shape = ["m", "n", "k", "batch", "rows", "width"]
    part = part.assign(trace=part["source"].str.split("__").str[1], predicted=answer["duration_us"].to_numpy(),
                       path=answer["path"].to_numpy(),
                       unaligned=kernel_paths.unaligned_gemm(part) | kernel_paths.unaligned_softmax(part))
    table = part.groupby(["primitive", "trace", "dtype", *shape, "path", "unaligned"], dropna=False).agg(
        kernels=("duration_us", "size"), measured=("duration_us", "median"), predicted=("predicted", "median"))
    table = table.reset_index()
    table["error_%"] = (100 * (table["predicted"] / table["measured"] - 1)).round(1)
    return table.assign(measured=table["measured"].round(1), predicted=table["predicted"].round(1))


def transfer_main(args) -> None:
    start = time.perf_counter()
    models = ModelSet.load()
    seed = seed_rows(args.root)
    logo = [compare(seed[seed["hardware"] == hw], models.without(hw), f"leave-one-GPU-out: {hw}") for hw in GPUS]
    without_tables = models
    for hw in TABLE_GPUS:  # the published tables' GPUs have models of their own: `--tables` scores those
        without_tables = without_tables.without(hw)
    corpus = corpus_rows(Path(args.corpus))
    table = pd.concat([*logo, compare(corpus, without_tables, "corpus traces")], ignore_index=True)
    pd.set_option("display.width", 220)
    shown = table.assign(**{c: (100 * table[c]).round(1) for c in ("transfer_all", "selected", "roofline", "as_is")},
                         ratio=table["ratio"].round(2))
    print("median absolute percentage error (%) per primitive · transfer_all: transfer on every compute primitive · "
          "selected: what predict answers (path) · as_is: the most similar GPU's models unscaled · "
          "ratio: transfer_all / roofline")
    for label, part in shown.groupby("set", sort=False):
        print(f"\n{label} (sources: {'; '.join(sorted(set(part['sources'])))})")
        print(part.drop(columns=["set", "sources"]).to_string(index=False))
    h100 = table[(table["set"] == "corpus traces") & (table["hardware"] == "H100-80GB-HBM3")].set_index("primitive")
    goals = {p: {"goal": g, **{c: float(h100.loc[p, c]) for c in ("selected", "transfer_all", "roofline")}}
             for p, g in GOALS.items() if p in h100.index}
    print("\ngoals on the H100 kernels (selected): " + ", ".join(
        f"{p} {100 * v['selected']:.1f}% (≤ {100 * v['goal']:.0f}%: "
        f"{'met' if v['selected'] <= v['goal'] else 'not met'})"
        for p, v in goals.items()) + f" · {time.perf_counter() - start:.0f} s")
    if args.breakdown:
        print("\nH100 kernels of the corpus traces per trace and shape (median µs; unaligned: "
              "predictor.costs.physics.kernel_paths)")
        print(breakdown(corpus, without_tables, "H100-80GB-HBM3", tuple(args.breakdown.split(","))).to_string(
            index=False))
    import held_out_gpu

    held = held_out_gpu.run(Path(args.corpus))
    print("\n" + held_out_gpu.show(held))
    if args.json:
        Path(args.json).write_text(json.dumps({"goals": goals, "rows": table.to_dict("records"),
                                               "held_out_gpus": held.to_dict("records")}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", default=str(DEFAULT), help="estimate-train-time folder")
    parser.add_argument("--json", help="also write the table and summary as JSON here")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--transfer", action="store_true", help="measure the transfer path (see above) instead")
    parser.add_argument("--corpus", default=str(CORPUS), help="corpus folder (with kineto/tracelens)")
    parser.add_argument("--breakdown", metavar="PRIMITIVES",
                        help="with --transfer: the H100 kernels of these primitives (comma-separated) per shape")
    parser.add_argument("--tables", action="store_true", help="score the published tables' models (see above)")
    args = parser.parse_args()
    if args.transfer:
        transfer_main(args)
        return
    if args.tables:
        import table_accuracy

        table = table_accuracy.run()
        print("median absolute percentage error (%) · before: the set without the table GPUs' models · after: the "
              "bundled set · reference: see note")
        print(table_accuracy.show(table))
        if args.json:
            Path(args.json).write_text(table.to_json(orient="records", indent=2))
        return

    start = time.perf_counter()
    samples = pd.concat([ett.read_file(p) for p in ett.list_files(args.root)], ignore_index=True)
    samples = deduplicate(samples).reset_index(drop=True)
    samples["group"] = groups_of(samples)
    paper = ett.fit_summaries(args.root).rename(columns={"pass": "pass_"})
    oof, samples["outlier"], forest = cross_validate(samples, folds=args.folds)
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
    forests = forest_table(samples, oof, forest)
    print("\nXGBoost vs random forest, same rows, features, target and folds: median absolute percentage error (%) of "
          "the held-out rows · ratio: XGBoost / forest")
    print(forests.assign(xgboost=(100 * forests["xgboost"]).round(2), forest=(100 * forests["forest"]).round(2),
                         ratio=forests["ratio"].round(2)).to_string(index=False))
    summary["forest"] = {"median_ratio": float(forests["ratio"].median()),
                         "share_xgboost_lower": float((forests["ratio"] < 1).mean())}
    print(f"median ratio XGBoost / forest {summary['forest']['median_ratio']:.2f} · XGBoost lower on "
          f"{100 * summary['forest']['share_xgboost_lower']:.0f}% of (GPU, primitive) pairs")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "entries": table.to_dict("records"),
                                               "forest": forests.to_dict("records")}, indent=2))


if __name__ == "__main__":
    main()
