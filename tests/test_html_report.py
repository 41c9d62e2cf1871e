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


def test_charts_and_tables_are_on_the_rendered_page(rendered):
    report, _, dom = rendered
    for svg in ("timeline-real", "timeline-predicted", "chart-primitives", "chart-stages", "chart-breakdown"):
        assert re.search(rf'<svg[^>]*id="{svg}"', dom), svg
    primitives = [r["primitive"] for r in report["by_primitive"]]
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
        lanes = re.findall(r'<text x="4" y="\d+">([^<]+)</text>', svg)
        assert lanes == [f"{_kind(device, stream)} · {stream}" for stream in streams]


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
    counts = re.findall(r"<td>([^<]*)</td>", dom)
    assert counts and not any(re.fullmatch(r"\d+\.\d+", c) for c in counts)  # no 288.5 operators


def test_page_is_self_contained(rendered):
    _, html, _ = rendered
    assert "<script" not in html
    assert not re.search(r"(src|href)\s*=\s*['\"]?(https?:)?//", html)
    assert not re.search(r"url\(\s*['\"]?https?:", html)
