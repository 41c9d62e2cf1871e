"""Sentences people read about a diff: the largest contributors to the error in words.

`tracekit.compare` returns data (stage, pass, primitive, error in s, share of the end-to-end error); this module
says it — "backward gemm on stage 0: +12.35 ms, 41% of the error" — with the number formats of `numbers.py`.
`diff_document` is the `--json` document of `tracekit diff` / `tracekit validate` (and what the CLI tables and the
HTML page show): `DiffReport.to_dict()` with each contributor's sentence under "text".
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .numbers import percent, seconds, signed_seconds

if TYPE_CHECKING:
    from tracekit.compare import DiffReport

PASS_WORDS = {"fwd": "forward", "bwd": "backward", "optimizer": "optimizer", "comm": "communication"}
#: Below this share of the end-to-end error a contributor's share reads "<1%", not "0%".
SMALL_SHARE = 0.005
#: Two different things are called "other": operators ingest could not classify (a primitive, in the per-primitive
#: table) and the iteration's time outside compute, communication and the optimizer (a part of the breakdown). The
#: tables people read name them apart.
PRIMITIVE_LABELS = {"other": "other operators (unclassified)"}
PART_LABELS = {"other": "other (host time, idle, memory copies)"}
#: Under the per-primitive and per-layer tables: what their totals are, and are not.
OPERATOR_TIME = ("operator time is the sum of the operators' durations, mean over ranks: operators overlap and the "
                 "iteration also holds host and idle time, so it is not the iteration time (the breakdown splits that)")


def named_first(rows: list[dict[str, Any]], key: str = "primitive") -> list[dict[str, Any]]:
    """Rows of named operators first (in their order), then the unclassified ones (`other`): the largest named
    operators lead, not the buckets of what ingest could not name."""
    return [r for r in rows if r.get(key) != "other"] + [r for r in rows if r.get(key) == "other"]


def unclassified_line(rows: list[dict[str, Any]]) -> str | None:
    """The largest contributors that are unclassified operators (`other` cells), summed in one sentence; None when
    there are none."""
    other = [r for r in rows if r.get("primitive") == "other"]
    if not other:
        return None
    total = sum(float(r.get("error_s") or 0.0) for r in other)
    where = ", ".join(f"{PASS_WORDS.get(r['pass'], r['pass'])} on stage {int(r['stage'])} "
                      f"{signed_seconds(r['error_s'])}" for r in other)
    return f"unclassified operators (other: what ingest could not name): {signed_seconds(total)} of the error ({where})"


def primitive_label(primitive: str) -> str:
    return PRIMITIVE_LABELS.get(primitive, primitive)


def part_label(part: str) -> str:
    return PART_LABELS.get(part, part)


def iteration_lines(report: dict[str, Any]) -> list[str]:
    """The iteration time, the figure to read first. A validate report of a run whose log has iterations without
    the profiler (`unprofiled`) leads with those, which compare like with like: the profiled steps the tables compare
    carry the profiler's own overhead (large on a CPU run). The profiled steps' line follows, said to be that."""
    it = report["iteration_time_s"]
    spread = it.get("real_spread") or {}
    profiled = (f"real {seconds(it['real'])} (± {seconds(spread.get('std'))}, {spread.get('steps')} steps"
                + (f", warm-up step {spread['dropped_warmup_steps']} ignored"
                   if spread.get("dropped_warmup_steps") else "")
                + f"), predicted {seconds(it['predicted'])}, error {signed_seconds(it['error'])} "
                  f"({percent(it.get('rel_error'), signed=True)})")
    measured = report.get("unprofiled")
    if not measured:
        return [f"iteration time: {profiled}"]
    after = (f"; after the refit: predicted {seconds(measured['after_predicted_s'])}, "
             f"{percent(measured['after_rel_error'], signed=True)}" if "after_rel_error" in measured else "")
    return [f"iteration time without the profiler: real {seconds(measured['real_s'])} (median of "
            f"{measured['iterations']} iterations in the run's log), predicted {seconds(measured['predicted_s'])}, "
            f"error {signed_seconds(measured['predicted_s'] - measured['real_s'])} "
            f"({percent(measured['rel_error'], signed=True)}){after}",
            f"profiled steps (the tables below; they carry the profiler's overhead): {profiled}"]


def contributor_sentence(row: dict[str, Any]) -> str:
    """`{pass} {primitive} on stage {stage}: {signed error}[, {share} of the error]` for one largest-contributor row
    (keys stage, pass, primitive, error_s, share_of_error)."""
    what = f"{PASS_WORDS.get(row['pass'], row['pass'])} {row['primitive']} on stage {int(row['stage'])}"
    share = row.get("share_of_error")
    if share is None:
        return f"{what}: {signed_seconds(row['error_s'])}"
    shown = "<1%" if abs(share) < SMALL_SHARE else percent(share, digits=0)
    return f"{what}: {signed_seconds(row['error_s'])}, {shown} of the error"


def diff_document(report: DiffReport) -> dict[str, Any]:
    """The report as a JSON-ready dict, each largest contributor with its sentence ("text")."""
    document = report.to_dict()
    document["largest_contributors"] = [{**row, "text": contributor_sentence(row)}
                                        for row in document["largest_contributors"]]
    return document
