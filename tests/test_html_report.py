"""The HTML report of a diff over real GPU traces (the 8-rank DLRM set), rendered by headless Chromium: the charts are
on the page with as many bars and timeline events as the inputs hold (counted straight from the trace JSON)."""
from __future__ import annotations

import gzip
import json
import re

import pytest
from typer.testing import CliRunner

from tests.conftest import KINETO, dump_dom
from tracekit.cli import app

DLRM = KINETO / "param" / "dlrm_8rank"
RANK = 3


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    base = tmp_path_factory.mktemp("html")
    page = base / "report.html"
    out = CliRunner().invoke(app, ["diff", str(DLRM), str(DLRM), "--rank", str(RANK), "--html", str(page), "--json"])
    assert out.exit_code == 0, out.stderr
    return json.loads(out.stdout), page.read_text(), dump_dom(page, base / "profile")


def tables(dom: str) -> list[list[list[str]]]:
    """Every table of the page: its rows, each a list of cell texts (header row first)."""
    return [[re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)]
            for table in re.findall(r"<table>(.*?)</table>", dom, re.S)]


def test_charts_and_tables_are_on_the_rendered_page(rendered):
    report, _, dom = rendered
    for svg in ("timeline-real", "timeline-predicted", "chart-primitives", "chart-stages", "chart-breakdown"):
        assert re.search(rf'<svg[^>]*id="{svg}"', dom), svg
    # largest first, the unclassified operators (`other`) after the named ones
    primitives = [r["primitive"] for r in report["by_primitive"] if r["primitive"] != "other"] + \
        [r["primitive"] for r in report["by_primitive"] if r["primitive"] == "other"]
    assert re.findall(r'<rect class="bar-real" data-primitive="([^"]+)"', dom) == primitives
    assert re.findall(r'<rect class="bar-predicted" data-primitive="([^"]+)"', dom) == primitives
    assert len(re.findall(r'<rect class="bar-part"', dom)) == 2 * 5  # two sides × five parts
    assert "Timelines of rank 3" in dom


def test_timeline_holds_every_device_event_of_the_rank(rendered):
    _, _, dom = rendered
    trace = next(json.loads(gzip.decompress(p.read_bytes())) for p in sorted(DLRM.glob("*.json.gz"))
                 if json.loads(gzip.decompress(p.read_bytes()))["distributedInfo"]["rank"] == RANK)
    device = [e for e in trace["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    streams = sorted({str(e["tid"]) for e in device}, key=int)
    for svg_id in ("timeline-real", "timeline-predicted"):
        svg = re.search(rf'<svg[^>]*id="{svg_id}".*?</svg>', dom, re.S).group(0)
        assert svg.count('<rect class="ev"') == len(device)  # the one profiled step holds all of them
        lanes = re.findall(r'<text x="4" y="\d+">([^<]+)<title>stream or thread (\d+) in the trace</title></text>',
                           svg)
        # each row named by the rank and what runs on it (raw stream ids before), compute first, numbered per kind
        kinds = {stream: _kind(device, stream) for stream in streams}
        order = sorted(streams, key=lambda s: (["compute", "communication", "memory"].index(kinds[s]), int(s)))
        expected = []
        for stream in order:
            same = [s for s in order if kinds[s] == kinds[stream]]
            expected.append((f"rank {RANK} · {kinds[stream]}" + (f" {same.index(stream) + 1}" if len(same) > 1
                                                                  else ""), stream))
        assert lanes == expected


def _kind(device: list[dict], stream: str) -> str:
    """What mostly runs on a stream, by time, read straight from the trace: NCCL kernels, copies/sets, the rest."""
    busy = {"communication": 0.0, "memory": 0.0, "compute": 0.0}
    for e in device:
        if str(e["tid"]) == stream:
            kind = ("memory" if e["cat"] != "kernel" else
                    "communication" if "nccl" in e["name"].lower() else "compute")
            busy[kind] += e["dur"]
    return max(busy, key=busy.get)


def test_a_diff_of_a_run_with_itself_reads_as_no_error(rendered):
    """The DLRM set against itself: a zero error is drawn neutral, not as a miss, and counts are whole operators."""
    report, _, dom = rendered
    assert report["iteration_time_s"]["error"] == 0
    assert re.search(r'error: <b class="zero">\+0 s \(\+0\.0%\)</b>', dom)
    (primitives,) = [t for t in tables(dom) if t[0][0] == "primitive"]
    columns = [primitives[0].index(name) for name in ("real count", "predicted count")]
    counts = [row[c] for row in primitives[1:-1] for c in columns]
    assert counts and all(re.fullmatch(r"[\d,]+", c) for c in counts), counts  # no 288.5 operators


def test_tables_name_their_unit_in_the_header(rendered):
    """Values in ms and µs sat under `real_s` / `predicted_s` headers: now a table's header names its one unit and
    its time cells are plain numbers of it, which agree with the report's seconds."""
    report, _, dom = rendered
    shown = tables(dom)
    assert not any(h.endswith("_s") for t in shown for h in t[0])
    for table in shown:
        for c, head in enumerate(table[0]):
            unit = re.search(r"\((s|ms|µs)\)$", head)
            if unit:
                assert all(re.fullmatch(r"[+−]?\d+\.\d+|—", row[c]) for row in table[1:]), (head, table)
    (primitives,) = [t for t in shown if t[0][0] == "primitive"]
    unit = re.search(r"\((s|ms|µs)\)$", primitives[0][1]).group(1)
    scale = {"s": 1.0, "ms": 1e3, "µs": 1e6}[unit]
    by_name = {r["primitive"]: r["real_s"] for r in report["by_primitive"]}
    for row in primitives[1:-1]:
        name = "other" if row[0].startswith("other") else row[0]
        assert float(row[1]) == pytest.approx(by_name[name] * scale, abs=10 ** -3 if unit != "µs" else 0.1)


def test_the_breakdown_parts_have_distinct_colours(rendered):
    """pipeline_bubble (#bab0ac) and other (#9c9c9c) were two greys side by side."""
    _, _, dom = rendered
    svg = re.search(r'<svg[^>]*id="chart-breakdown".*?</svg>', dom, re.S).group(0)
    fills = dict(re.findall(r'<rect class="bar-part" data-part="(\w+)"[^>]*fill="(#[0-9a-f]{6})"', svg))
    assert set(fills) == {"compute", "exposed_communication", "pipeline_bubble", "optimizer", "other"}
    rgb = {part: [int(colour[i:i + 2], 16) for i in (1, 3, 5)] for part, colour in fills.items()}
    for a in rgb:
        for b in rgb:
            if a < b:
                assert sum((x - y) ** 2 for x, y in zip(rgb[a], rgb[b])) ** 0.5 > 60, (a, b, fills)


def test_page_is_self_contained(rendered):
    _, html, _ = rendered
    assert "<script" not in html
    assert not re.search(r"(src|href)\s*=\s*['\"]?(https?:)?//", html)
    assert not re.search(r"url\(\s*['\"]?https?:", html)
