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
    """Rich tables of a diff document (`tracekit.report.diff_text.diff_document`) for people."""
    from rich.markup import escape
    from rich.table import Table

    it = report["iteration_time_s"]
    spread = it.get("real_spread") or {}
    console.print(
        f"iteration time: real {seconds(it['real'])} (± {seconds(spread.get('std'))}, {spread.get('steps')} steps"
        + (f", warm-up step {spread['dropped_warmup_steps']} ignored" if spread.get("dropped_warmup_steps") else "")
        + f"), predicted {seconds(it['predicted'])}, error {signed_seconds(it['error'])} "
          f"({percent(it.get('rel_error'), signed=True)})"
    )
    for warning in report.get("warnings", []):  # one line each, however wide the terminal
        err_console.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    for title, rows, key in (("per primitive", report["by_primitive"], "primitive"),
                             ("per pass", report.get("by_pass", []), "pass"),
                             ("per stage", report["by_stage"], "stage")):
        table = Table(title=f"{title} (time per iteration)")
        for col in (key, "real", "predicted", "error", "rel. error"):
            table.add_column(col, justify="left" if col == key else "right")
        for row in rows:
            table.add_row(str(row[key]), seconds(row["real_s"]), seconds(row["predicted_s"]),
                          signed_seconds(row["error_s"]), percent(row["rel_error"], signed=True))
        console.print(table)
    breakdown = report.get("breakdown") or {}
    if breakdown.get("real") and breakdown.get("predicted"):
        table = Table(title=f"breakdown (real measured by {breakdown.get('real_source')})")
        for col in ("part", "real", "predicted"):
            table.add_column(col, justify="left" if col == "part" else "right")
        for part in ("compute", "exposed_communication", "pipeline_bubble", "optimizer", "other"):
            table.add_row(part, seconds(breakdown["real"].get(part)), seconds(breakdown["predicted"].get(part)))
        console.print(table)
    if report["largest_contributors"]:
        console.print("largest contributors to the error:")
        for row in report["largest_contributors"][:5]:
            console.print(f"  {row['text']}")
    for side, label in (("real_only", "only in the real trace"), ("predicted_only", "only in the prediction")):
        rows = report["unmatched"].get(side) or []
        if rows:
            console.print(f"{label}: " + ", ".join(f"{r['pass']} {r['primitive']} ({seconds(r['time_s'])})"
                                                  for r in rows))

