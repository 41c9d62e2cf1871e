"""`tracekit calibrate`: fit a few global calibration constants to the iteration times captured runs measured."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Optional

import typer

from .app import app
from .output import console, fail, print_json, user_errors, working

HELP = """Fit a calibration from captured runs: predict each `tracekit capture` folder's configuration with the
models, compare with the iteration times its log measured (median of the iterations that ran without the profiler,
the first one left out as warm-up), and fit a few GLOBAL constants that minimize the relative error. Writes the
calibration as JSON for `tracekit predict --calibration FILE`.

Which constants: by default (--params auto, ≥ 3 runs) chosen by leave-one-out among none and a few physical
accounts (kernel/collective scales, host time per operator, overhead per micro-batch or per iteration): each set is
fitted on all runs but one and predicts the one left out, and the fewest constants within one standard error of
the best held-out error win. Name them with --params to fit exactly those (at most one per run).

\b
Examples:
  tracekit calibrate runs/tp2 runs/pp2 runs/dp2 --models models/
      --calibration-out cpu.json
  tracekit predict job.yaml --hardware cpu-amd-epyc-genoa --gpus-per-node 2
      --models models/ --calibration cpu.json
  tracekit calibrate runs/* --params comm_scale,microbatch_overhead_us --json
"""


def measured_run(run_dir: Path):
    """(TrainingConfig, Cluster, median unprofiled iteration time in s) of one capture folder."""
    from tracekit.capture.manifest import MANIFEST_NAME, Manifest
    from tracekit.core.cluster import default_cluster
    from tracekit.core.errors import InputError

    if not (run_dir / MANIFEST_NAME).is_file():
        raise InputError(run_dir, f"not a capture folder (no {MANIFEST_NAME}; make one with `tracekit capture`)")
    manifest = Manifest.load(run_dir)
    if manifest.status != "ok":
        raise InputError(run_dir, f"the captured run failed (exit code {manifest.exit_code}); its times do not "
                                  "measure training")
    config = manifest.config()
    if config is None:
        raise InputError(run_dir, f"no configuration in the manifest ({manifest.configuration_error or 'unknown'})")
    times = manifest.unprofiled_iteration_times_ms()
    if times and manifest.iterations and manifest.iterations[0] not in manifest.profiled_iterations:
        times = times[1:]  # the first iteration is warm-up
    if not times:
        raise InputError(run_dir, "no measured iteration times outside the profiled steps and the first iteration "
                                  "(capture with more --train-iters after the profiled --steps)")
    per_node = manifest.topology.get("ranks_per_node") or manifest.world_size or config.world_size
    return config, default_cluster(manifest.hardware, int(per_node))[0], statistics.median(times) / 1e3


@app.command("calibrate", help=HELP)
def calibrate_command(
    run_dirs: list[Path] = typer.Argument(..., help="`tracekit capture` output folders (one per measured run)."),
    models_dir: Optional[Path] = typer.Option(None, "--models", help="Model directory (default: bundled models)."),
    out: Optional[Path] = typer.Option(None, "--calibration-out", help="Write the calibration JSON here (for predict "
                                                           "--calibration FILE)."),
    params: str = typer.Option("auto", "--params",
                               help="auto (chosen by leave-one-out; ≥ 3 runs), or comma-separated constants: "
                                    "compute_scale, memory_scale, comm_scale, microbatch_overhead_us, host_op_us, "
                                    "op_overhead_us, iteration_overhead_us."),
    regularization: float = typer.Option(0.01, "--regularization", min=0.0,
                                         help="Pull toward no calibration (0 = none)."),
    name: Optional[str] = typer.Option(None, "--name",
                                       help="Calibration name (default: --calibration-out's file name)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    chosen = "auto" if params.strip() == "auto" else tuple(p.strip() for p in params.split(",") if p.strip())
    with user_errors():
        from predictor import CALIBRATION_CONSTANTS as CONSTANTS, ModelSet, fit_calibration
        from tracekit.core.atomic import atomic_write_json

        unknown = [p for p in chosen if p not in CONSTANTS] if chosen != "auto" else []
        if unknown or not chosen:
            fail(f"--params: unknown constant(s) {unknown or params!r} (known: {', '.join(CONSTANTS)})")
        runs = [measured_run(d) for d in run_dirs]
        models = ModelSet.load(models_dir)
        label = name or (out.stem if out is not None else "fitted")
        with working(f"fitting constants on {len(runs)} run(s)", quiet=as_json):
            cal = fit_calibration([r[0] for r in runs], [r[1] for r in runs], [r[2] for r in runs], models,
                                  params=chosen, regularization=regularization, name=label,
                                  labels=[str(d) for d in run_dirs])
        cal = cal.with_values(description=f"Fitted by `tracekit calibrate` on {len(runs)} captured run(s) "
                                          f"({', '.join(sorted({r[1].hardware for r in runs}))}) with models "
                                          f"{models.path}.")
        if out is not None:
            atomic_write_json(out, cal.to_dict())
    if as_json:
        doc = cal.to_dict()
        doc["written"] = str(out) if out is not None else None
        print_json(doc)
        return
    _print(cal, runs, out)


def _print(cal, runs, out: Optional[Path]) -> None:
    from rich.table import Table

    table = Table(title=f"calibration {cal.name}: predicted vs measured iteration time (ms)")
    for col in ("run", "config", "measured", "before", "after"):
        table.add_column(col, justify="left" if col in ("run", "config") else "right")
    for row, (config, _, _) in zip(cal.fit["rows"], runs):
        m = row["measured_s"]
        cells = [f"{1e3 * row[k]:.2f} ({100 * (row[k] - m) / m:+.1f}%)"
                 for k in ("predicted_before_s", "predicted_after_s")]
        shape = (f"L{config.num_layers} h{config.hidden_size} mb{config.micro_batch_size} tp{config.tp} "
                 f"pp{config.pp} dp{config.dp}")
        table.add_row(Path(row["label"]).name, shape, f"{1e3 * m:.2f}", *cells)
    table.add_row("MAPE", "", "", f"{100 * cal.fit['mape_uncalibrated']:.1f}%",
                  f"{100 * cal.fit['mape_in_sample']:.1f}%")
    console.print(table)
    selection = cal.fit.get("selection")
    if selection:
        tried = sorted(selection["candidates"], key=lambda row: row["loo_mape"])
        console.print("constants chosen by leave-one-out (held-out MAPE): " + "; ".join(
            f"{'+'.join(row['params']) or 'none'} {100 * row['loo_mape']:.1f}%" for row in tried[:4]))
    constants = cal.fit["constants"]
    console.print("constants: " + (", ".join(f"{k} = {v:.4g}" for k, v in constants.items())
                                   + " (the others at identity)" if constants else
                                   "none: no constant predicted a run left out better than the models alone"))
    if out is not None:
        console.print(f"wrote {out}  (use: tracekit predict ... --calibration {out})")
