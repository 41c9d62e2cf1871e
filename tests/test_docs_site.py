"""The documentation site as `make docs` builds it (`mkdocs build --strict`), with no network: every page it
builds loads scripts and styles from the site itself, and the mermaid diagrams are drawn as SVG in headless
Chromium (with the CDN script Material would otherwise fetch, they stay raw text offline)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    # what `make docs` runs (the test extra holds the docs extra's packages)
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_every_page_loads_only_the_sites_own_scripts_and_styles(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= len(list((ROOT / "docs").glob("*.md")))
    for page in pages:
        html = page.read_text()
        for tag, attr in (("script", "src"), ("link", "href"), ("img", "src")):
            for value in re.findall(rf"<{tag}\b[^>]*\b{attr}=\"?([^\" >]+)", html):
                assert not re.match(r"(https?:)?//", value), f"{page.relative_to(site)}: <{tag} {attr}={value}>"
        assert not re.search(r"@import\s+url\(\s*['\"]?https?:", html), page


def test_mermaid_diagrams_are_drawn_offline(site, tmp_path):
    """docs/architecture.md's three flowcharts: the page holds them as mermaid blocks and the bundled script; headless
    Chromium (no network) turns each into an SVG."""
    sources = re.findall(r"^```mermaid$", (ROOT / "docs" / "architecture.md").read_text(), re.M)
    page = site / "architecture" / "index.html"
    html = page.read_text()
    assert html.count('class="mermaid"') == len(sources) == 3
    assert re.search(r'<script src="\.\./javascripts/mermaid\.min\.js"', html)
    assert (site / "javascripts" / "mermaid.min.js").stat().st_size > 1_000_000
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "headless Chromium is required (Debian package `chromium`; .ci/run installs it)"
    done = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         "--virtual-time-budget=15000", "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    # Material replaces each block with a div whose shadow root holds the SVG: it is drawn when the block's text
    # (flowchart TD ...) is gone from the light DOM and no syntax-error diagram took its place
    blocks = re.findall(r'<div class="mermaid"[^>]*>(.*?)</div>', dom, re.S)
    assert len(blocks) == 3, re.findall(r'<(?:pre|div) class="mermaid[^"]*"[^>]*>.{0,80}', dom, re.S)
    assert not re.search(r"flowchart (TD|BT)", dom)
    assert "Syntax error" not in dom
