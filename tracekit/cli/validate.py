"""`tracekit validate`: check predictions against a captured run or against published end-to-end results."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from .app import app
from .output import EXIT_PARTIAL, console, fail, print_json, progress, user_errors, working
from .where import say_assumed


@app.command("validate")
def validate(
    run_dir: Optional[Path] = typer.Argument(None, help="A `tracekit capture` run folder (traces + manifest.json)."),
    models: Optional[Path] = typer.Option(None, "--models", help="Model folder (default: the current models)."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also write a self-contained HTML report here."),
    trace_out: Optional[Path] = typer.Option(None, "--trace-out", help="Keep the prediction's Kineto traces (one "
                                                                       "per pipeline stage, for Perfetto or "
                                                                       "`tracekit diff`) in this folder (default "
                                                                       "with --html: beside the page, "
                                                                       "<page>-predicted/)."),
    rank: Optional[int] = typer.Option(None, "--rank", help="Rank whose timelines the HTML shows."),
    refit: bool = typer.Option(False, "--refit", help="Ingest the run into the store, retrain on the whole store "
                                                     "into a folder of its own (--refit-out), and report the "
                                                     "error before and after; the --models stay as they are."),
    refit_out: Optional[Path] = typer.Option(None, "--refit-out", help="Where --refit writes its models (default: "
                                                                       "<models>-refit beside --models DIR, else "
                                                                       "<store>/models)."),
    store: Optional[Path] = typer.Option(None, "--store", help="Sample store --refit ingests into (default: "
                                                               "$TRACEKIT_HOME or ./.tracekit)."),
    published: Optional[Path] = typer.Option(None, "--published", help="CSV of measured end-to-end results "
                                                                       "(the e2e column schema) to score."),
    hardware_map: list[str] = typer.Option([], "--hardware-map", help="TEXT=HARDWARE_ID: rows whose hardware_gpu "
                                                                      "contains TEXT run on HARDWARE_ID "
                                                                      "(repeatable)."),
    sets: list[str] = typer.Option([], "--set", help="KEY=VALUE Megatron setting for every --published row "
                                                     "(repeatable), e.g. --set attention=unfused."),
    calibration: Optional[str] = typer.Option(None, "--calibration", help="Calibration name or JSON file used "
                                                                          "instead of each --published row's stack "
                                                                          "profile constants (default: the row's, "
                                                                          "as predict --batch)."),
) -> None:
    """Check predictions against measurements.

    With RUN_DIR: predict the captured run's configuration, diff the prediction with its traces (same report as
    `tracekit diff`); --refit first ingests the run and retrains, and reports the error before and after.
    With --published: predict every row of a measured end-to-end CSV and report the errors, worst rows first.

    \b
    Examples:
      tracekit validate runs/tiny-tp2/ --html report.html
      tracekit validate --published e2e.csv --hardware-map "A100=A100-SXM4-40GB"
          --json
    """
    with user_errors():
        if (run_dir is None) == (published is None):
            fail("give either a RUN_DIR or --published FILE.csv")
        from predictor import ModelSet

        if refit_out is not None and not refit:
            fail("--refit-out is where --refit writes its models: give --refit too")
        model_set = ModelSet.load(models) if models is not None else None
        if published is not None:
            _published(published, hardware_map, sets, calibration, model_set, json_out)
            return
        from tracekit.report.diff_text import diff_document
        from tracekit.report.html import write_html
        from tracekit.validate import validate_run

        assert run_dir is not None  # exactly one of RUN_DIR and --published was given
        if trace_out is None and html is not None:
            trace_out = html.with_name(f"{html.stem}-predicted")
        with working("validating", quiet=json_out) as step:
            result = validate_run(run_dir, models=model_set, models_path=models, refit=refit, store=store, rank=rank,
                                  trace_dir=trace_out, progress=step, refit_out=refit_out)
        say_assumed(result["cluster_note"], quiet=json_out)
        report = result["report"]
        extra = {key: result[key] for key in ("refit", "predicted_traces", "unprofiled") if result.get(key)}
        if html:
            write_html(html, report, title=f"tracekit validate: {run_dir}", extra=extra)
        document = {**diff_document(report), **extra}
        if result["cluster_note"]:
            document["cluster_note"] = result["cluster_note"]
        if json_out:
            print_json(document)
            return
        from .diff import print_report

        print_report(document)
        if result.get("refit"):
            _print_refit(result["refit"])
        if result.get("predicted_traces"):
            console.print(f"predicted traces (Perfetto, `tracekit diff`): {trace_out}/", soft_wrap=True)
        if html:
            console.print(f"HTML report written to {html}")


def _published(path: Path, hardware_map: list[str], sets: list[str], calibration: Optional[str], models: Any,
               json_out: bool) -> None:
    from predictor import load_calibration
    from tracekit.validate import (
        parse_hardware_map,
        parse_sets,
        read_published,
        validate_published,
    )

    mapping, overrides = parse_hardware_map(hardware_map), parse_sets(sets)
    total = len(read_published(path, mapping, overrides))
    with progress(quiet=json_out) as bar:
        task = bar.add_task("predicting", total=total)
        result = validate_published(path, mapping, models, overrides,
                                    load_calibration(calibration) if calibration else None,
                                    on_batch=lambda n: bar.advance(task, n))
    if json_out:
        print_json(result)
    else:
        _published_table(path, result)
    if result["failed"]:
        raise typer.Exit(EXIT_PARTIAL)


def _published_table(path: Path, result: dict[str, Any]) -> None:
    from rich.table import Table

    hardware = sorted({r["hardware"] for r in result["rows"]})
    table = Table(title=f"{path.name} on {', '.join(hardware)}: predicted vs measured iteration time (worst first)")
    for col in ("line", "tp·pp·dp", "mbs/gbs", "L×h", "measured", "predicted", "error"):
        table.add_column(col, justify="right", no_wrap=True)
    for row in result["rows"]:
        table.add_row(str(row["line"]), f"{row['tp']}·{row['pp']}·{row['dp']}",
                      f"{row['micro_batch_size']}/{row['global_batch_size']}",
                      f"{row['num_layers']}×{row['hidden_size']}", f"{row['measured_s']:.4f} s",
                      f"{row['predicted_s']:.4f} s", f"{row['error_s'] / row['measured_s']:+.1%}")
    console.print(table)
    for row in result["failed"]:
        console.print(f"[yellow]line {row['line']} not predicted:[/] {row['error']}")
    console.print(f"MAPE {result['mape']:.1%} · median APE {result['median_ape']:.1%} · "
                  f"p90 APE {result['p90_ape']:.1%} over {len(result['rows'])} rows")


def _print_refit(refit: dict[str, Any]) -> None:
    before, after = refit["before"], refit["after"]
    console.print(
        f"refit on {refit['store_samples']:,} samples ({refit['run_samples']:,} of this run, "
        f"{refit['samples_added']:,} of them new): iteration-time error {before['rel_error']:+.1%} → "
        f"{after['rel_error']:+.1%} (predicted {before['predicted_s']:.4f} s → {after['predicted_s']:.4f} s, "
        f"real {after['real_s']:.4f} s)", soft_wrap=True, markup=False
    )
    console.print(f"refit models written to {refit['models']}/ (the models validate predicted with are unchanged; "
                  f"--models {refit['models']} predicts with the new ones)", soft_wrap=True, markup=False)
