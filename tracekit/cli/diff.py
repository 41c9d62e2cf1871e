"""`tracekit diff`: a prediction against the real traces of the same configuration."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from tracekit.report.numbers import percent, seconds, signed_seconds

from .app import app
from .output import console, err_console, print_json, user_errors, working


@app.command("diff")
def diff(
    predicted: Path = typer.Argument(..., help="Predicted side: a `tracekit predict --trace-out` folder, its trace "
                                               "files, or a `tracekit predict --json` file."),
    real: list[Path] = typer.Argument(..., help="Real side: a run's trace folder or its per-rank trace files."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also write a self-contained HTML report here."),
    rank: Optional[int] = typer.Option(None, "--rank", help="Rank whose timelines the HTML shows (default: lowest)."),
) -> None:
    """Compare a prediction with real traces: iteration time, per primitive / pass / layer / stage, exposed
    communication and pipeline bubble, the largest error contributors, and unmatched operators.

    Example: tracekit diff predicted/ run/traces/ --html report.html
    """
    with user_errors():
        from tracekit.report.diff_text import diff_document
        from tracekit.report.html import write_html
        from tracekit.validate import diff_paths

        with working("reading traces and diffing", quiet=json_out):
            report = diff_paths(predicted, real, rank=rank)
        if html:
            write_html(html, report, title=f"tracekit diff: {predicted} vs {', '.join(map(str, real))}")
        if json_out:
            print_json(diff_document(report))
        else:
            print_report(diff_document(report))
            if html:
                console.print(f"HTML report written to {html}")


def print_report(report: dict[str, Any]) -> None:
    """Rich tables of a diff document (`tracekit.report.diff_text.diff_document`) for people: the iteration time
    first (a validate report's iterations without the profiler before its profiled steps), then tables whose rows
    add up to the totals they show."""
    from rich.markup import escape
    from rich.table import Table

    from tracekit.report.diff_text import (
        OPERATOR_TIME,
        iteration_lines,
        named_first,
        part_label,
        primitive_label,
        unclassified_line,
    )

    for line in iteration_lines(report):
        console.print(line, markup=False, soft_wrap=True)
    for warning in report.get("warnings", []):  # one line each, however wide the terminal
        err_console.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    for title, rows, key in (("per primitive", named_first(report["by_primitive"]), "primitive"),
                             ("per pass", report.get("by_pass", []), "pass")):
        table = Table(title=f"{title} (operator time per iteration)")
        for col in (key, "real", "predicted", "error", "rel. error"):
            table.add_column(col, justify="left" if col == key else "right")
        for row in rows:
            table.add_row(escape(primitive_label(str(row[key]))), seconds(row["real_s"]),
                          seconds(row["predicted_s"]), signed_seconds(row["error_s"]),
                          percent(row["rel_error"], signed=True))
        real, predicted = sum(r["real_s"] for r in rows), sum(r["predicted_s"] for r in rows)
        table.add_section()
        table.add_row("all operators", seconds(real), seconds(predicted), signed_seconds(predicted - real),
                      percent((predicted - real) / real if real else None, signed=True))
        console.print(table)
    table = Table(title="per stage (time per iteration)")
    for col in ("stage", "iteration\nreal", "iteration\npredicted", "operators\nreal", "operators\npredicted",
                "operators\nerror", "rel.\nerror"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for row in report["by_stage"]:
        table.add_row(str(row["stage"]), seconds(row.get("real_iteration_s")),
                      seconds(row.get("predicted_iteration_s")), seconds(row["real_s"]), seconds(row["predicted_s"]),
                      signed_seconds(row["error_s"]), percent(row["rel_error"], signed=True))
    console.print(table)
    console.print(OPERATOR_TIME, markup=False, soft_wrap=True)
    breakdown = report.get("breakdown") or {}
    if breakdown.get("real") and breakdown.get("predicted"):
        table = Table(title=f"breakdown (real measured by {breakdown.get('real_source')})")
        for col in ("part", "real", "predicted"):
            table.add_column(col, justify="left" if col == "part" else "right")
        parts = ("compute", "exposed_communication", "pipeline_bubble", "optimizer", "other")
        for part in parts:
            table.add_row(part_label(part), seconds(breakdown["real"].get(part)),
                          seconds(breakdown["predicted"].get(part)))
        table.add_section()
        table.add_row("iteration", *(seconds(sum(breakdown[side].get(p) or 0.0 for p in parts))
                                     for side in ("real", "predicted")))
        console.print(table)
    named = [r for r in report["largest_contributors"] if r["primitive"] != "other"]
    if named:  # the named operators first: the unclassified ones' cells after them, in one line
        console.print("largest contributors to the error:")
        for row in named[:5]:
            console.print(f"  {row['text']}", markup=False)
    other = unclassified_line(report["largest_contributors"])
    if other:
        console.print(other, markup=False, soft_wrap=True)
    for side, label in (("real_only", "only in the real trace"), ("predicted_only", "only in the prediction")):
        rows = report["unmatched"].get(side) or []
        if rows:
            console.print(f"{label}: " + ", ".join(f"{r['pass']} {r['primitive']} ({seconds(r['time_s'])})"
                                                  for r in rows))

