"""`tracekit capture`: run a launch command unchanged with profiling added, save traces + manifest, ingest."""
from __future__ import annotations

import statistics
from datetime import datetime
from pathlib import Path

import typer

from .app import app
from .choices import CAPTURE_LAYOUTS, CAPTURE_MODES, choice
from .output import EXIT_PARTIAL, err_console, fail, print_json, user_errors


@app.command(
    "capture",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def capture_command(
    ctx: typer.Context,
    out: Path = typer.Option(None, "--out", help="Capture directory (default: ./tracekit-capture-<time>)."),
    steps: str = typer.Option("10-13", "--steps", help="Steps START-END to profile (END excluded)."),
    ranks: str = typer.Option("all", "--ranks", help="Ranks to profile: 'all' or '0,1,...'."),
    layout: str = typer.Option(
        "auto", "--layout", click_type=choice(CAPTURE_LAYOUTS),
        help="Megatron trace layout: 'tensorboard' (core ≤ 0.16), 'torch_profile' (core ≥ 0.17) or 'auto': the "
        "one the Megatron-core version of the launch writes (megatron/core/package_info.py beside the script, in "
        "the working directory or on PYTHONPATH). Traces are looked for in both; the manifest says where.",
    ),
    shapes: bool = typer.Option(True, "--shapes/--no-shapes", help="Record operator shapes."),
    mode: str = typer.Option(
        "auto", "--mode", click_type=choice(CAPTURE_MODES),
        help="'megatron' appends Megatron's profiling flags; 'hook' profiles optimizer steps of any PyTorch "
        "script through an import hook; 'auto' picks megatron when the command carries --num-layers.",
    ),
    store: Path = typer.Option(None, "--store",
                               help="Sample store to ingest into (default $TRACEKIT_HOME or ./.tracekit)."),
    ingest: bool = typer.Option(True, "--ingest/--no-ingest", help="Ingest the traces after a successful run."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON after the run."),
) -> None:
    """Run a training launch command unchanged (after --) with profiling, saving traces, log and manifest.json.

    The command's output and exit code pass through. A failed run keeps what it captured, marked failed.

    \b
    Example:
      tracekit capture --out runs/tp2 --steps 3-6 -- torchrun --nproc-per-node 2
          pretrain_gpt.py --num-layers 2 ...
    """
    from tracekit.capture.run import capture
    from tracekit.core.store import default_store

    argv = list(ctx.args)
    out_dir = out or Path(f"tracekit-capture-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    with user_errors():
        manifest = capture(out_dir, argv, steps=steps, ranks=ranks, layout=layout, shapes=shapes, mode=mode,
                           store=store or default_store(), ingest=ingest)
    if as_json:
        print_json(manifest.to_dict())
    else:
        _summary(out_dir, manifest)
    if manifest.exit_code != 0:
        raise typer.Exit(manifest.exit_code)
    if not manifest.traces:
        fail(f"{out_dir}: the run wrote no traces ({'; '.join(manifest.notes)})", EXIT_PARTIAL)
    if manifest.ingest and manifest.ingest.get("status") != "ok":
        fail(f"{out_dir}: captured, but ingest {manifest.ingest['status']}: {manifest.ingest.get('error')}",
             EXIT_PARTIAL)


def _summary(out_dir: Path, manifest) -> None:
    from rich.table import Table

    table = Table(title=f"capture {out_dir}", show_header=False)
    times = manifest.iteration_times_ms
    config = manifest.configuration or {}
    rows = [
        ("status", f"{manifest.status} (exit {manifest.exit_code})"),
        ("mode", manifest.mode + (f" ({manifest.layout} layout)" if manifest.layout else "")),
        *([("layout", manifest.layout_source)] if manifest.layout_source else []),
        ("hardware", manifest.hardware),
        ("world size", str(manifest.world_size)),
        ("configuration", f"from {manifest.configuration_source}: layers {config.get('num_layers')}, hidden "
                          f"{config.get('hidden_size')}, tp {config.get('tensor_model_parallel_size')}, pp "
                          f"{config.get('pipeline_model_parallel_size')}, dp {config.get('data_parallel_size')}"
         if config else f"not found ({manifest.configuration_error})"),
        ("iterations", f"{len(times)} logged, median {statistics.median(times):.1f} ms" if times else "none logged"),
        ("traces", f"{len(manifest.traces)} in {out_dir}"),
        ("ingest", _ingest_text(manifest.ingest)),
    ]
    for key, value in rows:
        table.add_row(key, value)
    err_console.print(table)


def _ingest_text(ingest: dict | None) -> str:
    if not ingest:
        return "skipped"
    if ingest.get("status") != "ok":
        return f"{ingest.get('status')}: {ingest.get('error')}"
    return f"ok into {ingest.get('store')}"
