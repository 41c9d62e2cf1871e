"""`tracekit evaluate`: run trained models on another sample set and report their error per operator variant."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from tracekit.report.numbers import percent

from .app import app
from .choices import EVALUATE_FORMATS, choice
from .output import console, err_console, print_json, user_errors, working

KEYS = ["hardware", "primitive", "pass", "variant"]

if TYPE_CHECKING:  # rich is imported where a table is printed
    from rich.console import JustifyMethod


def error_table(samples, predictions):
    """Per (hardware, primitive, pass, variant): n, mape, median_ape, p90_ape (fractions, over the rows that got an
    estimate; None when none did: samples without shapes), out_of_range (count), rows per prediction path (`model`,
    `derived`, `transfer`, `roofline`; `no estimate`: rows without shapes) and the source GPUs of transfer answers."""
    import numpy as np
    import pandas as pd

    from predictor import ape_summary

    frame = samples[KEYS].copy()
    frame["variant"] = frame["variant"].astype("string").fillna("")
    frame["ape"] = (predictions["duration_us"].to_numpy() - samples["duration_us"].to_numpy()) \
        / samples["duration_us"].to_numpy()
    frame["ape"] = frame["ape"].abs()
    frame["oor"] = predictions["out_of_range"].to_numpy()
    frame["path"] = predictions["path"].to_numpy()
    frame["sources"] = predictions["sources"].to_numpy() if "sources" in predictions.columns else ""
    rows = []
    for key, group in frame.groupby(KEYS, sort=True):
        answered = np.isfinite(group["ape"].to_numpy())
        ape = group["ape"].to_numpy()[answered]
        paths = {p: int(c) for p, c in group["path"][answered].value_counts().items()}
        if not answered.all():  # a row is counted once: by the path that answered it, or here
            paths["no estimate"] = int((~answered).sum())
        rows.append({
            **dict(zip(KEYS, key)), "n": int(len(group)),
            **ape_summary(ape),
            "out_of_range": int(group["oor"].sum()), "paths": paths,
            "sources": sorted({s for s in group["sources"] if s}),
        })
    return pd.DataFrame(rows)


def load_samples(paths: list[str], fmt: str, store: Path | None, hardware: str | None):
    """Samples to evaluate on: the given files (read like `tracekit import`/`ingest`, nothing stored) or a store;
    unclassified (`other`) samples are left out: no model predicts them."""
    import tempfile

    import pandas as pd

    from tracekit.core.errors import InputError
    from tracekit.core.store import SampleStore

    if not paths:
        frame = SampleStore(store).read(hardware=hardware)
        return frame[frame["primitive"] != "other"]
    if fmt == "kineto":
        from extractors.kineto import ingest_paths

        with tempfile.TemporaryDirectory(prefix="tracekit-eval-") as tmp:
            scratch = SampleStore(tmp)
            result = ingest_paths(paths, scratch)
            for error in result.errors:
                err_console.print(f"error: {error['path']}: {error['error']}", markup=False, soft_wrap=True)
            frame = scratch.read(hardware=hardware)
            return frame[frame["primitive"] != "other"]
    from .import_samples import list_sources, read_sources

    files, _ = list_sources(paths, fmt)
    frames = []
    for source in read_sources(files, fmt):
        if source.error:
            raise InputError(source.path, source.error.split(": ", 1)[-1])
        frames.append(source.samples)
    if not frames:
        raise InputError(", ".join(paths), f"no {fmt} sample files found")
    frame = pd.concat(frames, ignore_index=True)
    return frame if hardware is None else frame[frame["hardware"] == hardware]


@app.command(
    "evaluate",
    help=(
        "Run trained models on another sample set (held-out rows, samples from a new trace) and print MAPE, median "
        "and p90 absolute percentage error and how many samples fell outside the trained ranges, per (hardware, "
        "primitive, pass, variant), with the path that answered them — the one `predict` would use: "
        "`model`, `derived`, `transfer` (a GPU without models, from the models of the GPUs named in `sources`) or "
        "`roofline`.\n\n"
        "Example: tracekit evaluate --models models/ heldout/ --format ett --json\n\n"
        "Example: tracekit evaluate --store .tracekit --hardware H100-80GB-HBM3"
    ),
)
def evaluate(
    paths: Optional[List[str]] = typer.Argument(None, metavar="[PATH...]", help="Sample files/folders (else --store)."),
    models: Optional[Path] = typer.Option(None, "--models", help="Model directory (default: the bundled models)."),
    store: Optional[Path] = typer.Option(None, "--store", help="Sample store to evaluate on (when no PATH)."),
    fmt: str = typer.Option("ett", "--format", click_type=choice(EVALUATE_FORMATS), metavar="FORMAT",
                            help=f"Format of PATH: {', '.join(EVALUATE_FORMATS)}."),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="Only samples of this hardware id."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of a table."),
) -> None:
    from predictor import ModelSet
    from tracekit.core.errors import InputError, did_you_mean
    from tracekit.core.hardware import normalize_hardware

    with user_errors(), working("reading samples", quiet=as_json) as step:
        wanted = normalize_hardware(hardware) if hardware else None
        samples = load_samples(paths or [], fmt, store, wanted)
        samples = samples[samples["duration_us"] > 0].reset_index(drop=True)
        if samples.empty and wanted:
            known = sorted(load_samples(paths or [], fmt, store, None)["hardware"].astype(str).unique())
            raise InputError(", ".join(paths or []) or str(store or "store"),
                             f"no samples of hardware {wanted!r} (present: {', '.join(known) or 'none'})"
                             f"{did_you_mean(wanted, known)}")
        if samples.empty:
            raise InputError(", ".join(paths or []) or str(store or "store"), "no samples to evaluate on")
        model_set = ModelSet.load(models)
        step(f"predicting {len(samples):,} samples")
        table = error_table(samples, model_set.predict(samples))
    if as_json:
        def clean(value):
            return None if isinstance(value, float) and value != value else value

        print_json({"models": [{k: clean(row[k]) for k in (*KEYS, "n", "mape", "median_ape", "p90_ape",
                                                           "out_of_range", "paths", "sources")}
                               for row in table.to_dict("records")]})
        return
    _print(table, model_set.path)


def _print(table, models_path: Path) -> None:
    from rich.table import Table

    out = Table(caption=f"models: {models_path}", caption_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("hardware", "left"), ("primitive", "left"), ("pass", "left"), ("variant", "left"), ("n", "right"),
        ("MAPE", "right"), ("median", "right"), ("p90", "right"), ("out of range", "right"), ("paths", "left"),
        ("sources", "left"),
    )
    for name, justify in columns:
        out.add_column(name, justify=justify)
    for row in table.to_dict("records"):
        out.add_row(row["hardware"], row["primitive"], row["pass"], row["variant"], str(row["n"]),
                    percent(row["mape"], 2), percent(row["median_ape"], 2), percent(row["p90_ape"], 2),
                    str(row["out_of_range"]), ", ".join(f"{k} {v}" for k, v in row["paths"].items()),
                    "; ".join(row["sources"]))
    console.print(out)
