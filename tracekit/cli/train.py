"""`tracekit train`: per-(hardware, primitive, pass) XGBoost regressors from the sample store."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from tracekit.report.numbers import percent

from .app import app
from .choices import PRIMITIVES, choice
from .output import console, print_json, progress, user_errors

if TYPE_CHECKING:  # rich is imported where a table is printed
    from rich.console import JustifyMethod


@app.command(
    "train",
    help=(
        "Train one regressor per (hardware, primitive, pass) — per variant where variants are different kernels — "
        "on the samples in the store: XGBoost on shape + physics features predicting log(time / roofline), "
        "hyper-parameters by 5-fold cross-validation (≈1–3 min on 2 cores for the ~170k published samples). "
        "Samples that cannot be real (faster than the link allows) or form a separate mode orders of magnitude "
        "away are set aside and reported. Writes XGBoost UBJ + JSON metadata (never pickle) to --models-out.\n\n"
        "Example: tracekit train --store .tracekit --models-out models/ --hardware A100-SXM4-80GB\n\n"
        "Example: tracekit train --store S --hardware H100-80GB-HBM3 --models-out models/ --update"
    ),
)
def train(
    store: Optional[Path] = typer.Option(None, "--store", help="Sample store (default $TRACEKIT_HOME or ./.tracekit)."),
    out: Optional[Path] = typer.Option(None, "--models-out", help="Model directory to write (default <store>/models)."),
    hardware: Optional[List[str]] = typer.Option(None, "--hardware", help="Only these hardware ids (repeatable)."),
    primitive: Optional[List[str]] = typer.Option(None, "--primitive", click_type=choice(PRIMITIVES), metavar="NAME",
                                                  help=f"Only these primitives (repeatable): "
                                                       f"{', '.join(PRIMITIVES)}."),
    folds: int = typer.Option(5, "--folds", min=2, max=10, help="Cross-validation folds."),
    data: Optional[List[str]] = typer.Option(
        None, "--data", help="Provenance note on the training data, kept in the index (repeatable)."),
    cluster: Optional[List[str]] = typer.Option(
        None, "--cluster", help="HW=PRESET: the cluster the collective samples of hardware HW were measured on "
                                "(e.g. A100-SXM4-80GB=perlmutter; repeatable). predict answers collectives with the "
                                "learned models only on that cluster and in the topologies sampled there, elsewhere "
                                "from the algorithm model; without it, GPU collectives always use the latter."),
    update: bool = typer.Option(
        False, "--update", help="Add to the model set at --models-out: replace only the models of the hardware "
                                "trained now, keep every other model (and its provenance) as it is."),
    in_range_only: bool = typer.Option(
        False, "--in-range-only", help="The models answer only inside their trained shape ranges (for published "
                                       "tables of a fixed shape grid); outside, the transfer and roofline paths do."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of a table."),
) -> None:
    import json
    import time

    from predictor import train_models
    from tracekit.core.errors import ModelError
    from tracekit.core.hardware import normalize_hardware
    from tracekit.core.store import SampleStore

    with user_errors():
        clusters = _sampled_clusters(cluster or [])
        sample_store = SampleStore(store)
        wanted = [normalize_hardware(h) for h in hardware or []] or None
        samples = sample_store.read(hardware=wanted, primitive=primitive or None)
        if samples.empty:
            raise ModelError(f"{sample_store.root}: no samples to train on"
                             + (f" for {', '.join(wanted)}" if wanted else "") + " (run tracekit import/ingest first)")
        out = out or sample_store.root / "models"
        sources = sample_store.sources()
        used = samples["source"].value_counts()
        provenance = {
            "data": list(data or []),
            "store": str(sample_store.root),
            "samples": int(len(samples)),
            "hardware": sorted(samples["hardware"].unique().tolist()),
            "clusters": clusters,
            "sources": [{"id": sid, "path": sources.get(sid, {}).get("path"), "rows": int(n),
                         **_origin(sources.get(sid, {}))} for sid, n in sorted(used.items())],
        }
        start = time.perf_counter()
        keys = samples.groupby(["hardware", "primitive", "pass"]).ngroups
        with progress(quiet=as_json) as bar:
            task = bar.add_task("training", total=keys)
            seen: set = set()

            def advance(meta: dict) -> None:
                seen.add((meta["hardware"], meta["primitive"], meta["pass"]))
                bar.update(task, completed=len(seen), description=f"training {meta['id']}")

            summaries = train_models(samples, out, provenance, folds=folds, on_model=advance, update=update,
                                     extrapolate=not in_range_only)
        seconds = time.perf_counter() - start
    skipped = json.loads((out / "index.json").read_text()).get("skipped", [])
    if as_json:
        print_json({"out": str(out), "seconds": round(seconds, 1), "models": [model_row(m) for m in summaries],
                    "skipped": skipped})
    else:
        print_models(summaries, f"{len(summaries)} models written to {out} in {seconds:.0f} s")
        for entry in skipped:
            group = f" {entry['group']}" if entry["group"] else ""
            console.print(f"not trained: {entry['hardware']} {entry['primitive']} {entry['pass']}{group} "
                          f"({entry['rows']} samples): {entry['reason']}", markup=False)


def _origin(meta: dict) -> dict:
    """What the store recorded about where an imported source comes from: its import format, the repository and
    commit it was taken from and what it cannot tell (published tables' facts; {} for other sources)."""
    facts = meta.get("facts") or {}
    out = {"kind": meta["kind"]} if meta.get("kind") else {}
    out.update({k: facts[k] for k in ("origin", "hardware_note", "unknown", "best_of_autotune") if facts.get(k)})
    if meta.get("refused"):
        out["refused_rows"] = meta["refused"]
    return out


def _sampled_clusters(items: list[str]) -> dict[str, str]:
    """`HW=PRESET` pairs → {hardware id: preset name}; ConfigError naming a bad item or an unknown preset."""
    from tracekit.core.cluster import preset
    from tracekit.core.errors import ConfigError
    from tracekit.core.hardware import normalize_hardware

    out = {}
    for item in items:
        hw, eq, name = item.partition("=")
        if not eq or not hw.strip() or not name.strip():
            raise ConfigError(f"--cluster expects HW=PRESET (e.g. A100-SXM4-80GB=perlmutter), got {item!r}")
        out[normalize_hardware(hw.strip())] = preset(name.strip()).name
    return out


def model_row(meta: dict) -> dict:
    """The per-model summary printed by train and models (errors as fractions)."""
    cv = meta.get("cv", {})
    out = meta.get("outliers", {})
    return {
        "id": meta["id"], "hardware": meta["hardware"], "primitive": meta["primitive"], "pass": meta["pass"],
        "group": meta["group"], "samples": meta["samples"], "cv_mape": cv.get("mape"),
        "median_ape": cv.get("median_ape"), "p90_ape": cv.get("p90_ape"),
        "outliers": {"impossible": out.get("impossible", 0), "separate_mode": out.get("separate_mode", 0)},
        "note": outlier_note(meta),
    }


def outlier_note(meta: dict) -> str:
    """Human note on the rows a model set aside (empty when none)."""
    out = meta.get("outliers", {})
    rows = out.get("rows") or 0
    parts = []
    if out.get("impossible"):
        parts.append(f"{out['impossible']}/{rows} faster than the link allows (set aside)")
    if out.get("separate_mode"):
        parts.append(f"{out['separate_mode']}/{rows} in a separate mode >10× away (set aside)")
    return "; ".join(parts)


def print_models(metas: list[dict], caption: str) -> None:
    from rich.table import Table

    table = Table(caption=caption, caption_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("hardware", "left"), ("primitive", "left"), ("pass", "left"), ("group", "left"), ("samples", "right"),
        ("CV MAPE", "right"), ("median", "right"), ("p90", "right"), ("note", "left"),
    )
    for name, justify in columns:
        table.add_column(name, justify=justify, overflow="fold")
    for meta in metas:
        row = model_row(meta)
        table.add_row(row["hardware"], row["primitive"], row["pass"], row["group"], str(row["samples"]),
                      percent(row["cv_mape"], 2), percent(row["median_ape"], 2), percent(row["p90_ape"], 2),
                      row["note"])
    console.print(table)
