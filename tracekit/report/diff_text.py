"""Sentences people read about a diff: the largest contributors to the error in words.

`tracekit.compare` returns data (stage, pass, primitive, error in s, share of the end-to-end error); this module
says it — "backward gemm on stage 0: +12.35 ms, 41% of the error" — with the number formats of `numbers.py`.
`diff_document` is the `--json` document of `tracekit diff` / `tracekit validate` (and what the CLI tables and the
HTML page show): `DiffReport.to_dict()` with each contributor's sentence under "text".
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .numbers import percent, signed_seconds

if TYPE_CHECKING:
    from tracekit.compare import DiffReport

PASS_WORDS = {"fwd": "forward", "bwd": "backward", "optimizer": "optimizer", "comm": "communication"}
#: Below this share of the end-to-end error a contributor's share reads "<1%", not "0%".
SMALL_SHARE = 0.005


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
