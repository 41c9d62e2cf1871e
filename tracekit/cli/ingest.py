"""`tracekit ingest`: Kineto traces → operator samples in the sample store."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

if TYPE_CHECKING:  # rich is imported where a table is printed
    from rich.console import JustifyMethod

from tracekit.report.numbers import count, percent, plural, seconds, size_bytes

from .app import app
from .executor import Executor, check_ray_address, executor_option, ray_address_option
from .output import (
    EXIT_FAILED,
    EXIT_PARTIAL,
    console,
    err_console,
    fail,
    print_json,
    progress,
    shows_progress,
    user_errors,
)


@app.command(
    "ingest",
    help=(
        "Read PyTorch profiler (Kineto) traces and store every GPU operator's timing as classified, shaped samples.\n\n"
        "PATH is a trace file (.json, .json.gz, *.pt.trace.json), a directory (all traces inside = one run, one "
        "file per rank; collectives are matched across ranks) or a glob. Ingesting a file again adds nothing.\n\n"
        "Example: tracekit ingest runs/job42/ --store .tracekit"
    ),
)
def ingest(
    paths: List[str] = typer.Argument(..., metavar="PATH...",
                                      help="Trace files, directories of rank traces, or globs."),
    store: Optional[Path] = typer.Option(None, "--store",
                                         help="Sample store directory (default $TRACEKIT_HOME or ./.tracekit)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Processes that parse the traces, "
                                                                       "this one and N-1 workers, with several "
                                                                       "files (default: every core)."),
    executor: Executor = executor_option(),
    ray_address: Optional[str] = ray_address_option("its nodes must see the traces at the same paths"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="With several traces: each rank's table of "
                                                                 "primitives, not only the run summary."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of tables."),
) -> None:
    from extractors.kineto import ingest_paths
    from tracekit.core.store import SampleStore

    check_ray_address(executor, ray_address)
    if executor is Executor.ray and jobs is not None:
        fail("--jobs sets the local processes; with --executor ray, Ray decides (give one of them)")
    with user_errors():
        sample_store = SampleStore(store)
        if not shows_progress(quiet=as_json):  # no bar to draw (--json, stderr not a terminal): none made
            result = ingest_paths(paths, sample_store, jobs=jobs, executor=executor.value, ray_address=ray_address)
        else:
            bar = progress()
            # redrawn on each file, not by rich's refresh thread: a process running no other thread forks its
            # parsing workers (extractors.kineto.parallel), which start at once with everything imported
            bar.live.auto_refresh = False
            with bar:
                task = bar.add_task("ingesting", total=None)

                def advance(done: int, total: int, path) -> None:
                    bar.update(task, completed=done, total=total, description=f"ingesting {Path(path).name}",
                               refresh=True)

                result = ingest_paths(paths, sample_store, progress=advance, jobs=jobs, executor=executor.value,
                                      ray_address=ray_address)
    for error in result.errors:
        err_console.print(f"error: {error['path']}: {error['error']}", markup=False, soft_wrap=True)
    for skipped in result.skipped:
        err_console.print(f"note: skipped {skipped['path']}: {skipped['reason']}", markup=False, soft_wrap=True)
    if as_json:
        print_json(result.as_json())
    else:
        if len(result.traces) == 1 or verbose:
            for report, comm_bytes in zip(result.traces, result.collective_bytes):
                _print_trace(report, comm_bytes)
        if len(result.traces) > 1:
            _print_run(result.traces)
        _print_unlaunched(result.traces)
        if result.matched_collectives:
            console.print(f"collectives matched across ranks: {count(result.matched_collectives)}")
        written = sum(r["samples_written"] for r in result.traces)
        if result.traces:  # nothing ingested: the error lines say why, and no store was made to name
            console.print(f"{plural(len(result.traces), 'trace')} ingested, {plural(written, 'sample')} written to "
                          f"{sample_store.root}")
    if not result.traces:
        raise typer.Exit(EXIT_FAILED)
    if result.errors:
        raise typer.Exit(EXIT_PARTIAL)


def _print_unlaunched(reports: list[dict]) -> None:
    """One line on the compute kernels whose launch the traces do not hold, when there are any."""
    twins = sum(r["launch_not_recorded"]["from_twins"] for r in reports)
    lost = sum(r["launch_not_recorded"]["without_op"] for r in reports)
    if twins or lost:
        console.print(f"{plural(twins + lost, 'compute kernel')} without a launch call in the trace: {count(twins)} "
                      f"took the op and shapes of their twins (same kernel, grid and block, or the same place in a "
                      f"run that recurs), {count(lost)} have no op and no shapes")


def _rank(report: dict) -> str:
    """`3 of 8`, `3` (world size unknown) or `unknown`."""
    if report["rank"] is None:
        return "unknown"
    return f"{report['rank']}" + ("" if report["world_size"] is None else f" of {report['world_size']}")


def _print_trace(report: dict, comm_bytes: dict) -> None:
    from rich.table import Table

    total = sum(p["time_us"] for p in report["primitives"].values()) or 1.0
    title = (f"{Path(report['path']).name}\nhardware {report['hardware']} · rank {_rank(report)} · "
             f"{plural(report['iterations'], 'iteration')} · {plural(report['kernels'], 'kernel')} · "
             f"busy {seconds(report['gpu_busy_us'] / 1e6)} · unclassified {percent(report['unclassified_share'])} · "
             f"{plural(report['samples_written'], 'sample')} written")
    table = Table(title=title, title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (("primitive", "left"), ("count", "right"), ("time", "right"),
                                                       ("share", "right"), ("bytes", "right"))
    for name, justify in columns:
        table.add_column(name, justify=justify)
    ordered = sorted(report["primitives"].items(), key=lambda kv: -kv[1]["time_us"])
    for name, stats in ordered:
        nbytes = comm_bytes.get(name)
        table.add_row(name, count(stats["count"]), seconds(stats["time_us"] / 1e6), percent(stats["time_us"] / total),
                      size_bytes(nbytes) if nbytes else "")
    console.print(table)


def _print_run(reports: list[dict]) -> None:
    """One line per trace of a multi-rank ingest (their primitive tables with --verbose), and the run's totals."""
    from rich.table import Table

    table = Table(title=f"{plural(len(reports), 'trace')} (per-rank tables: --verbose)", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("trace", "left"), ("rank", "left"), ("hardware", "left"), ("iterations", "right"), ("kernels", "right"),
        ("busy", "right"), ("unclassified", "right"), ("samples", "right"))
    for name, justify in columns:
        table.add_column(name, justify=justify)
    for r in sorted(reports, key=lambda r: (str(Path(r["path"]).parent), r["rank"] is None, r["rank"] or 0,
                                            r["path"])):
        table.add_row(Path(r["path"]).name, _rank(r), r["hardware"], count(r["iterations"]),
                      count(r["kernels"]), seconds(r["gpu_busy_us"] / 1e6), percent(r["unclassified_share"]),
                      count(r["samples_written"]))
    console.print(table)
    busy: dict[str, float] = {}
    for r in reports:
        for name, stats in r["primitives"].items():
            busy[name] = busy.get(name, 0.0) + stats["time_us"]
    total = sum(busy.values()) or 1.0
    top = sorted(busy.items(), key=lambda kv: -kv[1])[:6]
    console.print("where the GPU time went, all ranks: "
                  + ", ".join(f"{name} {percent(us / total)}" for name, us in top))
