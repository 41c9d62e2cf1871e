"""One self-contained HTML page for a diff report: inline SVG charts and tables, no scripts, no network
(`write_html(path, report)` writes it; `render_html(document)` is the page of a `diff_document`).

Charts (each an `<svg>` with a stable id, so tests and users can find them):
`timeline-real` / `timeline-predicted` (one rank's iteration, one lane per stream or thread, named by the rank and
what runs on it, same time scale),
`chart-primitives` (per-primitive bars, `rect.bar-real` / `rect.bar-predicted`), `chart-stages` (per-stage relative
error, `rect.bar-stage`), `chart-breakdown` (stacked iteration breakdown of each side, `rect.bar-part`). A validate
report adds `#refit` (the error before and after retraining) and `#predicted-traces` (the prediction's Kineto
traces, linked relative to the page, for Perfetto). Tables name their time unit in the header and hold plain numbers
of it; unclassified operators (`other`) come after the named ones.
"""
from __future__ import annotations

from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracekit.core.atomic import atomic_write_text

from .diff_text import OPERATOR_TIME, diff_document, named_first, part_label, primitive_label, unclassified_line
from .html_timeline import timelines_html
from .numbers import count, in_unit, percent, seconds, signed_seconds, time_unit
from .palette import COLORS

if TYPE_CHECKING:
    from tracekit.compare import DiffReport

PARTS = ("compute", "exposed_communication", "pipeline_bubble", "optimizer", "other")

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.summary span{display:inline-block;margin-right:24px}.pos{color:#b22}.neg{color:#26a}.zero{color:#222}
.legend span{margin-right:14px}.sw{display:inline-block;width:10px;height:10px;margin-right:4px}
svg text{font:11px system-ui,sans-serif}.warn{color:#a60}
"""


def write_html(path: str | Path, report: DiffReport, title: str = "tracekit diff",
               extra: dict[str, Any] | None = None) -> None:
    """Write the self-contained page of a DiffReport to `path` (atomically: all of it or nothing). `extra`: what
    validate adds to the document ("refit": the refit's result, "predicted_traces": paths of the prediction's
    traces), shown in sections of their own."""
    document = {**diff_document(report), **(extra or {})}
    if document.get("predicted_traces"):
        document["predicted_traces"] = [_relative(p, Path(path).parent) for p in document["predicted_traces"]]
    atomic_write_text(path, render_html(document, report.timelines, title=title))


def _relative(target: str, folder: Path) -> str:
    """`target` relative to `folder` where it lies below it (a link that survives moving both), else absolute."""
    try:
        return Path(target).resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return Path(target).resolve().as_posix()


def render_html(report: dict[str, Any], timelines: dict[str, Any] | None = None, title: str = "tracekit diff") -> str:
    """The page for `report` (DiffReport.to_dict(), with validate's "refit" and "predicted_traces" where given);
    `timelines` = {"rank", "real": [...], "predicted": [...]} with events {"ts", "dur", "lane", "name",
    "category"} (µs from the iteration start)."""
    it = report.get("iteration_time_s", {})
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        *([_unprofiled(report["unprofiled"])] if report.get("unprofiled") else []),
        _summary(report, it),
    ]
    for warning in report.get("warnings", []):
        parts.append(f"<p class='warn'>⚠ {escape(str(warning))}</p>")
    if report.get("refit"):
        parts.append(_refit(report["refit"]))
    if report.get("predicted_traces"):
        parts.append(_predicted_traces(report["predicted_traces"]))
    if timelines:
        parts.append(timelines_html(timelines))
    parts += [
        "<h2>Time per primitive (per iteration, mean over ranks)</h2>",
        _primitive_chart(named_first(report.get("by_primitive", []))),
        _table(_labelled(named_first(report.get("by_primitive", []))), ["primitive", "real_s", "predicted_s", "error_s",
                                                           "rel_error", "real_count", "predicted_count"],
               total="all operators"),
        f"<p>{escape(OPERATOR_TIME[0].upper() + OPERATOR_TIME[1:])}.</p>",
        "<h2>Error per pipeline stage</h2>",
        _stage_chart(report.get("by_stage", [])),
        _table(report.get("by_stage", []), ["stage", "ranks", "real_iteration_s", "predicted_iteration_s", "real_s",
                                            "predicted_s", "error_s", "rel_error"],
               headers={"real_s": "operators real", "predicted_s": "operators predicted", "error_s": "operators error",
                        "rel_error": "operators rel. error (%)"}),
        "<h2>Iteration breakdown</h2>",
        _breakdown_chart(report.get("breakdown", {})),
        "<h2>Largest contributors to the error</h2>",
        _contributors(report.get("largest_contributors", [])),
        "<h2>Per pass</h2>",
        _table(report.get("by_pass", []), ["pass", "real_s", "predicted_s", "error_s", "rel_error"],
               total="all operators"),
    ]
    if report.get("by_layer"):
        parts += ["<h2>Per layer</h2>",
                  _table(report["by_layer"], ["layer", "real_s", "predicted_s", "error_s", "rel_error"],
                         total="all operators")]
    parts += ["<h2>Unmatched operators</h2>", _unmatched(report.get("unmatched", {})), "</body></html>"]
    return "\n".join(parts)


# -- pieces ----------------------------------------------------------------------------------------------------
def _summary(report: dict, it: dict) -> str:
    real, pred = it.get("real"), it.get("predicted")
    rel = it.get("rel_error")
    spread = it.get("real_spread") or {}
    label = ("<span>profiled steps (the tables below compare them; they carry the profiler's overhead):</span>"
             if report.get("unprofiled") else "")
    items = [
        label,
        f"<span>real: <b>{seconds(real)}</b>"
        + (f" ± {seconds(spread.get('std'))} over {spread.get('steps')} steps" if spread.get("steps") else "")
        + "</span>",
        f"<span>predicted: <b>{seconds(pred)}</b></span>",
        f"<span>error: <b class='{_sign_class(it.get('error'))}'>{signed_seconds(it.get('error'))}"
        f" ({_fmt_pct(rel)})</b></span>",
    ]
    inputs = report.get("inputs", {})
    src = "".join(f"<br>{escape(k)}: <code>{escape(str(v))}</code>" for k, v in inputs.items())
    return f"<p class='summary'>{''.join(items)}{src}</p>"


def _refit(refit: dict) -> str:
    """The refit's result: the store it trained on, the models it wrote, the iteration time before and after."""
    rows = [{"prediction": label, "predicted_s": refit[key]["predicted_s"], "real_s": refit[key]["real_s"],
             "error_s": refit[key]["error_s"], "rel_error": refit[key]["rel_error"]}
            for key, label in (("before", "before the refit"), ("after", "after the refit"))]
    samples = (f"{count(refit.get('store_samples'))} samples in <code>{escape(str(refit.get('store')))}</code>, "
               f"{count(refit.get('run_samples'))} of them this run's ({count(refit.get('samples_added'))} new)"
               if refit.get("store_samples") is not None else f"{count(refit.get('samples_added'))} new samples")
    return (f"<h2 id='refit'>Refit</h2><p>retrained {count(refit.get('models_trained'))} models on {samples}, "
            f"written to <code>{escape(str(refit.get('models')))}</code> (the models validate predicted with are "
            f"unchanged). The tables below are the prediction before the refit.</p>"
            + _table(rows, ["prediction", "predicted_s", "real_s", "error_s", "rel_error"]))


def _unprofiled(measured: dict) -> str:
    """The prediction against the run's iterations without the profiler (its log's times)."""
    after = (f"; after the refit {seconds(measured['after_predicted_s'])} "
             f"({_fmt_pct(measured['after_rel_error'])})" if "after_rel_error" in measured else "")
    return (f"<p id='unprofiled' class='summary'>Iteration time without the profiler: real "
            f"<b>{seconds(measured['real_s'])}</b> (median of {count(measured['iterations'])} iterations in the run's "
            f"log), predicted <b>{seconds(measured['predicted_s'])}</b>, error "
            f"<b>{_fmt_pct(measured['rel_error'])}</b>{after}.</p>")


def _predicted_traces(paths: list[str]) -> str:
    """Links to the prediction's Kineto traces (relative to the page), and how to open them."""
    items = "".join(f"<li><a href='{escape(p)}'>{escape(p)}</a></li>" for p in paths)
    return (f"<h2 id='predicted-traces'>Predicted traces</h2><p>Kineto traces of the predicted timeline, one per "
            f"pipeline stage: open them in Perfetto (ui.perfetto.dev, “Open trace file”), HTA, or "
            f"<code>tracekit diff</code>.</p><ul>{items}</ul>")


def _primitive_chart(rows: list[dict]) -> str:
    rows = [r for r in rows if (r.get("real_s") or 0) > 0 or (r.get("predicted_s") or 0) > 0]
    top = max([max(r.get("real_s") or 0, r.get("predicted_s") or 0) for r in rows] or [1.0]) or 1.0
    left, width, row_h = 130, 900, 26
    height = 30 + row_h * len(rows)
    out = [f"<svg id='chart-primitives' width='{width + 120}' height='{height}' xmlns='http://www.w3.org/2000/svg'>",
           _legend_svg(width - 150)]
    for i, r in enumerate(rows):
        y = 26 + i * row_h
        out.append(f"<text x='4' y='{y + 14}'>{escape(str(r['primitive']))[:22]}</text>")
        for j, side in enumerate(("real", "predicted")):
            value = r.get(f"{side}_s") or 0.0
            w = value / top * (width - left)
            out.append(
                f"<rect class='bar-{side}' data-primitive='{escape(str(r['primitive']))}' x='{left}' "
                f"y='{y + j * 11}' width='{w:.2f}' height='10' fill='{COLORS[side]}'>"
                f"<title>{side}: {seconds(value)}</title></rect>"
            )
        out.append(f"<text x='{left + 4 + max(r.get('real_s') or 0, r.get('predicted_s') or 0) / top * (width - left)}'"
                   f" y='{y + 14}'>{_fmt_pct(r.get('rel_error'))}</text>")
    out.append("</svg>")
    return "".join(out)


def _stage_chart(rows: list[dict]) -> str:
    values = [r.get("rel_error") or 0.0 for r in rows]
    top = max([abs(v) for v in values] or [0.01]) or 0.01
    mid, half, row_h = 560, 400, 24
    height = 20 + row_h * max(len(rows), 1)
    out = [f"<svg id='chart-stages' width='1100' height='{height}' xmlns='http://www.w3.org/2000/svg'>",
           f"<line x1='{mid}' x2='{mid}' y1='0' y2='{height}' stroke='#888'/>"]
    for i, (r, v) in enumerate(zip(rows, values)):
        y = 10 + i * row_h
        w = abs(v) / top * half
        x = mid if v >= 0 else mid - w
        color = "#e15759" if v > 0 else "#4e79a7" if v < 0 else COLORS["other"]
        out.append(f"<text x='4' y='{y + 14}'>stage {escape(str(r.get('stage')))}</text>")
        out.append(f"<rect class='bar-stage' data-stage='{escape(str(r.get('stage')))}' x='{x:.2f}' y='{y}' "
                   f"width='{w:.2f}' height='16' fill='{color}'><title>{_fmt_pct(v)}</title></rect>")
        out.append(f"<text x='{mid + (w + 6 if v >= 0 else -w - 50):.1f}' y='{y + 13}'>{_fmt_pct(v)}</text>")
    out.append("</svg>")
    return "".join(out)


def _breakdown_chart(breakdown: dict) -> str:
    sides = [s for s in ("real", "predicted") if isinstance(breakdown.get(s), dict)]
    total = max([sum(breakdown[s].get(p) or 0 for p in PARTS) for s in sides] or [1.0]) or 1.0
    left, width = 100, 1000
    out = [f"<svg id='chart-breakdown' width='1100' height='{30 + 30 * len(sides)}' "
           f"xmlns='http://www.w3.org/2000/svg'>"]
    for i, side in enumerate(sides):
        y, x = 8 + i * 30, float(left)
        out.append(f"<text x='4' y='{y + 15}'>{side}</text>")
        for part in PARTS:
            value = breakdown[side].get(part) or 0.0
            w = value / total * (width - left)
            out.append(f"<rect class='bar-part' data-part='{part}' x='{x:.2f}' y='{y}' width='{w:.2f}' height='22' "
                       f"fill='{COLORS.get(part, COLORS['other'])}'><title>{part}: {seconds(value)}</title></rect>")
            x += w
    y = 12 + 30 * len(sides)
    for j, part in enumerate(PARTS):
        out.append(f"<rect x='{left + j * 170}' y='{y}' width='10' height='10' fill='{COLORS.get(part, '#9c9c9c')}'/>"
                   f"<text x='{left + j * 170 + 14}' y='{y + 9}'>{part}</text>")
    out.append("</svg>")
    source = breakdown.get("real_source")
    note = f"<p>real side measured by {escape(str(source))}</p>" if source else ""
    rows = [{"part": part_label(p), **{s: breakdown[s].get(p) for s in sides}} for p in PARTS]
    return "".join(out) + note + _table(rows, ["part", *sides], total="iteration")


def _contributors(rows: list[dict]) -> str:
    """The cells with the largest error, named operators first; the unclassified operators' cells (`other`: what
    ingest could not name) after them, summed in one line."""
    if not rows:
        return "<p>none</p>"
    named = [r for r in rows if r.get("primitive") != "other"]
    out = "<ol>" + "".join(f"<li>{escape(str(r.get('text', '')))}</li>" for r in named) + "</ol>" if named else ""
    other = unclassified_line(rows)
    if other:
        out += f"<p id='unclassified-error'>{escape(other[0].upper() + other[1:])}.</p>"
    return out


def _unmatched(unmatched: dict) -> str:
    out = []
    for side, label in (("real_only", "in the real trace, not in the prediction"),
                        ("predicted_only", "in the prediction, not in the real trace")):
        rows = unmatched.get(side) or []
        out.append(f"<h3>{label} ({len(rows)})</h3>")
        out.append(_table(rows, ["pass", "primitive", "time_s", "count"]) if rows else "<p>none</p>")
    return "".join(out)


def _legend_svg(x: int) -> str:
    return "".join(
        f"<rect x='{x + i * 90}' y='4' width='10' height='10' fill='{COLORS[s]}'/>"
        f"<text x='{x + i * 90 + 14}' y='13'>{s}</text>"
        for i, s in enumerate(("real", "predicted"))
    )


#: Column headers: what a column holds, its unit added by `_table` (the cells are plain numbers of it).
HEADERS = {"real_s": "real", "predicted_s": "predicted", "error_s": "error", "rel_error": "rel. error (%)",
           "real_count": "real count", "predicted_count": "predicted count", "real_iteration_s": "iteration real",
           "predicted_iteration_s": "iteration predicted", "time_s": "time", "real": "real", "predicted": "predicted"}
TIME_COLUMNS = {"real_s", "predicted_s", "error_s", "real_iteration_s", "predicted_iteration_s", "time_s", "real",
                "predicted"}


def _table(rows: list[dict], columns: list[str], total: str | None = None,
           headers: dict[str, str] | None = None) -> str:
    """A table of `rows`, its durations in one unit the headers name (`real (ms)`); with `total`, a last row of that
    name holding the sums of its time columns (the rows add up to it)."""
    if not rows:
        return "<p>none</p>"
    sums: dict[str, Any] = {}
    if total is not None:
        sums = {columns[0]: total}
        for c in columns[1:]:
            if c in ("real_s", "predicted_s", "error_s", "real", "predicted"):
                sums[c] = sum(float(r.get(c) or 0.0) for r in rows)
        if "rel_error" in columns and sums.get("real_s"):
            sums["rel_error"] = (sums["predicted_s"] - sums["real_s"]) / sums["real_s"]
    unit = time_unit([r.get(c) for r in [*rows, sums] for c in columns if c in TIME_COLUMNS])

    def header(c: str) -> str:
        return {**HEADERS, **(headers or {})}.get(c, c) + (f" ({unit[0]})" if c in TIME_COLUMNS else "")

    def cell(c: str, value: Any) -> str:
        if c in TIME_COLUMNS and isinstance(value, (int, float)):
            return in_unit(value, unit, signed=c == "error_s")
        return _cell(c, value)

    head = "".join(f"<th>{escape(header(c))}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(cell(c, r.get(c)))}</td>" for c in columns) + "</tr>" for r in rows
    )
    if total is not None:
        body += "<tr class='total'>" + "".join(f"<th>{escape(cell(c, sums.get(c)) if c in sums else '')}</th>"
                                               for c in columns) + "</tr>"
    return f"<table><tr>{head}</tr>{body}</table>"


def _labelled(rows: list[dict]) -> list[dict]:
    """Per-primitive rows with the primitive named for people (`other` → unclassified operators)."""
    return [{**r, "primitive": primitive_label(str(r.get("primitive")))} for r in rows]


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "—"
    if column == "rel_error":  # the header says %
        return _fmt_pct(value).removesuffix("%")
    if column.endswith("_count"):  # a mean over ranks: whole operators
        return count(value)
    if column.endswith("_s") or column in ("real", "predicted"):
        return signed_seconds(value) if column == "error_s" else seconds(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def _fmt_pct(value: Any) -> str:
    return percent(value, signed=True)


def _sign_class(value: Any) -> str:
    """Red for a prediction above the measurement, blue below, neutral for none (a zero error is not a miss)."""
    if value is None:
        return ""
    return "pos" if float(value) > 0 else "neg" if float(value) < 0 else "zero"
