"""`tracekit import`: published operator samples (the seed paper's CSVs, nccl-tests tables, XLA's GEMM and collective
performance tables, ROCm aiter's tuning results) → the sample store. Rows a table reader refuses (a failed integrity
check, faster than the part's peak, an implausible low-precision table, a part without a datasheet entry) are
counted and listed by name in the report, never dropped silently."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from .app import app
from .choices import IMPORT_FORMATS, choice
from .output import (
    EXIT_FAILED,
    EXIT_PARTIAL,
    console,
    err_console,
    print_json,
    progress,
    user_errors,
)

FORMATS = ("ett", "nccl-tests", "xla-gemm", "xla-collectives", "aiter-gemm", "aiter-fmoe")
#: Formats read by a table reader (`extractors.tables.TableRead`: samples, rows refused by name, provenance facts).
TABLE_FORMATS = {"xla-gemm": "xla_gemm", "xla-collectives": "xla_collectives", "aiter-gemm": "aiter_gemm",
                 "aiter-fmoe": "aiter_fmoe"}
#: Refused rows named per (file, reason) in the table (--json lists every one).
SHOWN_REFUSED = 5

if TYPE_CHECKING:  # rich is imported where a table is printed
    from rich.console import JustifyMethod


@dataclass
class SourceFile:
    """One file of an import: its samples (every row validated) or the error that rejected it."""

    path: Path
    digest: str
    samples: object = None  # pandas DataFrame
    error: str | None = None
    refused: list[dict] = field(default_factory=list)  # {"line", "row", "reason"} of rows a table reader refused
    facts: dict = field(default_factory=dict)  # what the file says about its provenance (and cannot say)


@dataclass
class ImportReport:
    files: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    skipped_summaries: list[str] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)  # {"path", "line", "row", "reason"}


def list_sources(paths: list[str], fmt: str) -> tuple[list[Path], list[str]]:
    """Files to read for each PATH (folders are walked) and the seed paper's fit summaries skipped."""
    from importlib import import_module

    from extractors import ett, nccl_tests

    if fmt not in FORMATS:
        from tracekit.core.errors import InputError, did_you_mean

        raise InputError(fmt, f"unknown format (choose from {', '.join(FORMATS)}){did_you_mean(fmt, FORMATS)}")
    files, summaries = [], []
    for raw in paths:
        root = Path(raw)
        if fmt == "ett":
            files += ett.list_files(root)
            if root.is_dir():
                summaries += sorted(str(p) for p in root.rglob("*.csv") if ett.is_fit_summary(p))
        elif fmt in TABLE_FORMATS:
            files += import_module(f"extractors.{TABLE_FORMATS[fmt]}").list_files(root)
        else:
            files += nccl_tests.list_files(root)
    return files, summaries


def read_sources(files: list[Path], fmt: str, hardware: str | None = None, gpus_per_node: int | None = None,
                 nodes: int | None = None, collective: str | None = None):
    """Read and validate each file completely; yields SourceFile (samples or error), one per file."""
    from importlib import import_module

    from extractors import ett, nccl_tests
    from tracekit.core.errors import InputError
    from tracekit.core.hardware import normalize_hardware
    from tracekit.core.hashing import file_digest

    for path in files:
        try:
            digest = file_digest(path)
        except OSError as exc:
            yield SourceFile(path, "", error=f"{path}: unreadable ({exc.strerror or exc})")
            continue
        try:
            if fmt in TABLE_FORMATS:
                read = import_module(f"extractors.{TABLE_FORMATS[fmt]}").read_file(path, hardware=hardware,
                                                                                   source=digest)
                if read.samples.empty:
                    reasons = sorted({r["reason"] for r in read.refused})
                    yield SourceFile(path, digest, error=f"{path}: every row refused ({'; '.join(reasons)})",
                                     refused=read.refused, facts=read.facts)
                    continue
                yield SourceFile(path, digest, samples=read.samples, refused=read.refused, facts=read.facts)
                continue
            if fmt == "ett":
                frame = ett.read_file(path, source=digest)
                if hardware:
                    frame["hardware"] = normalize_hardware(hardware)
            else:
                frame = nccl_tests.read_file(path, hardware=hardware, gpus_per_node=gpus_per_node, nodes=nodes,
                                             collective=collective, source=digest)
        except InputError as exc:
            yield SourceFile(path, digest, error=str(exc))
            continue
        yield SourceFile(path, digest, samples=frame)


@app.command(
    "import",
    help=(
        "Import published operator samples into the sample store (idempotent: a file already imported adds "
        "nothing; a file with any malformed row is rejected whole, naming the line).\n\n"
        "--format ett: a folder tree of the seed paper's CSVs (estimate-train-time: <GPU>_<op>_fp16[_<nodes>_<gpus>]"
        ".csv); hardware from the file names. --format nccl-tests: nccl-tests output or its CSV tables; topology "
        "from --gpus-per-node/--nodes, the device list or the file name (AR_GPU8_...). --format xla-gemm / "
        "xla-collectives: XLA's GEMM and collective performance tables (one entry per CSV line); part from the "
        "arch key (sm_90 H100, sm_100_B200 B200, gfx942 MI300X). --format aiter-gemm / aiter-fmoe: ROCm aiter's "
        "tuned GEMM and fused-MoE files; part from gfx and cu_num. Rows a table reader refuses (integrity check, "
        "above the part's peak, an implausible low-precision table, no datasheet part) are counted and named in "
        "the report, the rest imported.\n\n"
        "Example: tracekit import corpus/operator-samples/estimate-train-time --format ett --store .tracekit\n\n"
        "Example: tracekit import corpus/operator-samples/xla-matmul --format xla-gemm --json"
    ),
)
def import_command(
    paths: List[str] = typer.Argument(..., metavar="PATH...", help="Sample files or folders."),
    fmt: str = typer.Option(..., "--format", click_type=choice(IMPORT_FORMATS), help="The files' format."),
    store: Optional[Path] = typer.Option(None, "--store",
                                         help="Sample store directory (default $TRACEKIT_HOME or ./.tracekit)."),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="Hardware id (overrides the files' own)."),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", min=1, help="nccl-tests: GPUs per node."),
    nodes: Optional[int] = typer.Option(None, "--nodes", min=1, help="nccl-tests: number of nodes."),
    collective: Optional[str] = typer.Option(
        None, "--collective", help="nccl-tests: all_reduce, all_gather, ... (or nccl-tests' own names: allreduce, "
                                   "reducescatter, ...) when the file does not say."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of a table."),
) -> None:
    from tracekit.core.store import SampleStore

    report = ImportReport()
    with user_errors():
        sample_store = SampleStore(store)
        files, report.skipped_summaries = list_sources(paths, fmt)
        if not files:
            from tracekit.core.errors import InputError

            raise InputError(", ".join(paths), f"no {fmt} sample files found")
        with progress(quiet=as_json) as bar:
            task = bar.add_task("importing", total=len(files))
            for source in read_sources(files, fmt, hardware, gpus_per_node, nodes, collective):
                bar.update(task, advance=1, description=f"importing {source.path.name}")
                report.refused += [{"path": str(source.path), **r} for r in source.refused]
                if source.error:
                    report.errors.append({"path": str(source.path), "error": source.error})
                    continue
                frame = source.samples
                written = sample_store.add(source.digest, frame, {
                    "path": source.path.name, "kind": f"import:{fmt}",
                    "hardware": sorted(frame["hardware"].unique().tolist()),
                    "primitives": sorted(frame["primitive"].unique().tolist()),
                    **({"facts": source.facts} if source.facts else {}),
                    **({"refused": len(source.refused)} if source.refused else {}),
                })
                report.files.append({
                    "path": str(source.path), "source": source.digest, "rows": int(len(frame)),
                    "written": int(written), "refused": len(source.refused),
                    "hardware": ",".join(sorted(frame["hardware"].unique())),
                    "primitive": ",".join(sorted(frame["primitive"].unique())),
                    "dtype": ",".join(sorted(frame["dtype"].dropna().astype(str).unique())),
                    "variant": _listed(sorted(frame["variant"].astype(str).unique())),
                    **({"facts": source.facts} if source.facts else {}),
                })
    for error in report.errors:
        err_console.print(f"error: {error['error']}", markup=False, soft_wrap=True)
    if as_json:
        print_json({"store": str(sample_store.root), "files": report.files, "errors": report.errors,
                    "skipped_fit_summaries": report.skipped_summaries, "refused": report.refused,
                    "refused_by_reason": refused_counts(report.refused)})
    else:
        _print(report, sample_store.root)
    if not report.files:
        raise typer.Exit(EXIT_FAILED)
    if report.errors:
        raise typer.Exit(EXIT_PARTIAL)


def _listed(names: list[str], most: int = 3) -> str:
    """Names joined by commas; past `most`, the first ones and the count."""
    return ",".join(names) if len(names) <= most else f"{','.join(names[:most])},... ({len(names)} variants)"


def refused_counts(refused: list[dict]) -> list[dict]:
    """Refused rows counted per (file, reason), in the order they were met."""
    counts: dict[tuple[str, str], int] = {}
    for r in refused:
        key = (Path(r["path"]).name, r["reason"])
        counts[key] = counts.get(key, 0) + 1
    return [{"file": f, "reason": why, "rows": n} for (f, why), n in counts.items()]


def _print(report: ImportReport, root: Path) -> None:
    from rich.table import Table

    table = Table(title=f"imported into {root}", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("file", "left"), ("hardware", "left"), ("primitive", "left"), ("dtype", "left"), ("variant", "left"),
        ("rows", "right"), ("new", "right"), ("refused", "right"),
    )
    for name, justify in columns:
        table.add_column(name, justify=justify, overflow="fold")
    for f in report.files:
        table.add_row(Path(f["path"]).name, f["hardware"], f["primitive"], f["dtype"], f["variant"], str(f["rows"]),
                      str(f["written"]), str(f["refused"]))
    console.print(table)
    new = sum(f["written"] for f in report.files)
    console.print(f"{len(report.files)} file(s), {new} new samples"
                  + (f"; {len(report.refused)} row(s) refused" if report.refused else "")
                  + (f"; {len(report.skipped_summaries)} fit-summary file(s) skipped (not samples)"
                     if report.skipped_summaries else ""))
    for entry in refused_counts(report.refused):
        rows = [r["row"] for r in report.refused
                if Path(r["path"]).name == entry["file"] and r["reason"] == entry["reason"]]
        more = len(rows) - SHOWN_REFUSED
        console.print(f"refused {entry['rows']} row(s) of {entry['file']}: {entry['reason']}", markup=False)
        for row in rows[:SHOWN_REFUSED]:
            console.print(f"  {row}", markup=False)
        if more > 0:
            console.print(f"  ... and {more} more (--json lists every refused row)", markup=False)
