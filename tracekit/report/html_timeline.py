"""The diff page's timelines (`tracekit.report.html`): one rank's iteration, real and predicted on one time
scale, one row per stream or thread named by the rank and what runs on it, each event an SVG rectangle with its
name and duration on hover."""
from __future__ import annotations

from collections import Counter
from html import escape
from typing import Any

from .numbers import seconds
from .palette import COLORS

MAX_TIMELINE_EVENTS = 6000  # per side: beyond this the page gets slow; the longest events are kept


def timelines_html(timelines: dict) -> str:
    """Both timelines of a diff (`timelines`: its rank and the real and predicted events) under a legend."""
    real, pred = timelines.get("real") or [], timelines.get("predicted") or []
    span = max([e["ts"] + e["dur"] for e in real + pred] or [1.0]) or 1.0
    legend = "".join(
        f"<span><i class='sw' style='background:{COLORS[c]}'></i>{c}</span>"
        for c in ("computation", "communication", "memory", "other")
    )
    return (
        f"<h2>Timelines of rank {escape(str(timelines.get('rank')))} (one iteration, same time scale)</h2>"
        f"<div class='legend'>{legend}</div>"
        f"<h3>real</h3>{_timeline_svg('timeline-real', real, span, timelines.get('rank'))}"
        f"<h3>predicted</h3>{_timeline_svg('timeline-predicted', pred, span, timelines.get('rank'))}"
    )


def _timeline_svg(svg_id: str, events: list[dict], span: float, rank: Any = None) -> str:
    if len(events) > MAX_TIMELINE_EVENTS:
        events = sorted(events, key=lambda e: -e["dur"])[:MAX_TIMELINE_EVENTS]
    names = _lane_names(events, rank)
    lanes = list(names)
    width, left, lane_h = 1100, 180, 18
    height = 24 + lane_h * max(len(lanes), 1)
    scale = (width - left - 10) / span
    out = [f"<svg id='{svg_id}' width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
           f"xmlns='http://www.w3.org/2000/svg'>"]
    for i, lane in enumerate(lanes):  # the row's name; the trace's own id of the stream or thread on hover
        out.append(f"<text x='4' y='{14 + i * lane_h + 12}'>{escape(names[lane][:30])}"
                   f"<title>stream or thread {escape(lane)} in the trace</title></text>")
    lane_index = {lane: i for i, lane in enumerate(lanes)}
    for e in events:
        x = left + e["ts"] * scale
        w = max(e["dur"] * scale, 0.5)
        y = 14 + lane_index[str(e["lane"])] * lane_h
        color = COLORS.get(str(e.get("category")), COLORS["other"])
        out.append(
            f"<rect class='ev' x='{x:.2f}' y='{y}' width='{w:.2f}' height='{lane_h - 3}' fill='{color}'>"
            f"<title>{escape(str(e.get('name', '')))[:200]} — {e['dur']:.1f} µs</title></rect>"
        )
    for frac in (0, 0.25, 0.5, 0.75, 1.0):
        x = left + frac * span * scale
        anchor = "end" if frac == 1.0 else "start" if frac == 0 else "middle"
        out.append(f"<text x='{x:.1f}' y='10' text-anchor='{anchor}'>{seconds(frac * span / 1e6)}</text>")
    out.append("</svg>")
    return "".join(out)


def _lane_key(lane: str) -> tuple:
    return (0, int(lane)) if lane.lstrip("-").isdigit() else (1, lane)


#: The order of a timeline's rows by what runs on them.
LANE_KINDS = ("compute", "communication", "memory", "other")


def _lane_names(events: list[dict], rank: Any = None) -> dict[str, str]:
    """Each timeline lane (a GPU stream or a CPU thread, by the trace's id) named by the rank and what mostly runs on
    it, numbered where a rank has several of a kind: `rank 0 · compute`, `rank 0 · communication 1`,
    `rank 0 · communication 2`; in row order (compute, communication, memory, then the rest). A lane the trace named
    itself keeps its name."""
    kinds: dict[str, Counter] = {}
    for e in events:
        kinds.setdefault(str(e["lane"]), Counter())[e.get("category") or "other"] += e["dur"]
    kind_of = {}
    for lane, seen in kinds.items():
        kind = seen.most_common(1)[0][0]
        kind_of[lane] = "compute" if kind == "computation" else kind if kind in LANE_KINDS else "other"
    order = sorted(kind_of, key=lambda lane: (LANE_KINDS.index(kind_of[lane]), _lane_key(lane)))
    who = f"rank {rank} · " if rank is not None else ""
    names = {}
    for lane in order:
        same = [other for other in order if kind_of[other] == kind_of[lane]]
        number = f" {same.index(lane) + 1}" if len(same) > 1 else ""
        names[lane] = f"{who}{kind_of[lane]}{number}" if lane.lstrip("-").isdigit() else lane
    return names
