"""The getting-started tour (docs/getting-started.md, the README's tour) and docs/predict.md, run as written, and what
the pages say the commands print — counts, file names, column names, the lines quoted — compared with what they
print. Slow steps run in a faithful reduced form: `tracekit sample` with a small budget, and the refit on a store
that holds the captured run alone (the tour's store holds ~6,000 GPU samples too, whose training takes a minute).
"""
from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import E2E, ROOT
from tracekit.core.hardware import cpu_hardware_id

GETTING_STARTED = (ROOT / "docs" / "getting-started.md").read_text()
README = (ROOT / "README.md").read_text()
PREDICT_DOC = (ROOT / "docs" / "predict.md").read_text()
TRACEKIT = [sys.executable, "-c", "from tracekit.cli import main; main()"]


def tracekit(*args, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    """A tracekit command as a user runs it (its own process, in `cwd`)."""
    done = subprocess.run([*TRACEKIT, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=600)
    if check:
        assert done.returncode == 0, (args, done.stderr[-3000:])
    return done


def doc_command(text: str, start: str) -> list[str]:
    """The command of the docs' code block line that begins with `start` (continuation lines joined, the trailing
    comment dropped), with `.venv/bin/` replaced by this interpreter's."""
    lines = text.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith(start))
    command = ""
    while True:
        line = re.sub(r"\s+#.*$", "", lines[i]).rstrip()
        command += line.rstrip("\\") + " "
        if not line.endswith("\\"):
            break
        i += 1
    argv = [sys.executable if a == ".venv/bin/python" else a for a in shlex.split(command)]
    return argv[1:] if argv[0] == ".venv/bin/tracekit" else argv


def quoted(text: str, marker: str) -> str:
    """The comment after the docs' command line that contains `marker`."""
    line = next(line for line in text.splitlines() if marker in line and "#" in line)
    return line.split("#", 1)[1].strip()


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The tour's working folder (the commands' relative paths: traces/, runs/, report.html) with the repository's
    traces/ linked in."""
    base = tmp_path_factory.mktemp("tour")
    (base / "traces").symlink_to(ROOT / "traces")
    return base


def test_the_readme_tour_is_the_getting_started_tour():
    """Every tracekit command of the README's tour is the getting-started page's, word for word, in its order."""
    readme = [" ".join(doc_command(README, line)) for line in
              re.findall(r"^(\.venv/bin/tracekit \w+[^\n]*)$", README, re.M)]
    guide = [" ".join(doc_command(GETTING_STARTED, line)) for line in
             re.findall(r"^(\.venv/bin/tracekit \w+[^\n]*)$", GETTING_STARTED, re.M)]
    assert readme == guide and len(guide) == 8


def test_ingest_prints_the_counts_the_tour_gives(work):
    argv = doc_command(GETTING_STARTED, ".venv/bin/tracekit ingest traces/kineto")
    said = re.search(r'"(\d+) traces ingested, ([\d,]+) samples written to \.tk"', quoted(GETTING_STARTED,
                                                                                          "ingest traces/kineto"))
    out = tracekit(*argv, cwd=work).stdout
    printed = re.search(r"(\d+) traces ingested, ([\d,]+) samples written to \.tk", out)
    assert said and printed and said.groups() == printed.groups(), (said, out[-500:])
    assert len(re.findall(r"│ [\w.]+\.json\.gz\s+│", out)) == int(said.group(1))  # "a line per trace"


def test_sample_prints_a_table_of_samples_per_primitive(tmp_path):
    argv = doc_command(GETTING_STARTED, ".venv/bin/tracekit sample")
    assert argv == ["sample", "--device", "cpu", "--store", ".tk"]
    said = re.search(r'"(\w+) (\d+)"', quoted(GETTING_STARTED, "tracekit sample"))
    out = tracekit(*argv, "--budget", "4", "--primitives", said.group(1), "--processes", "1", cwd=tmp_path).stdout
    # the heading whole on one line (it wrapped inside a long CPU id, `cpu-intel-xeon-processor`, at the table's width)
    assert re.search(rf"^samples on {re.escape(cpu_hardware_id())} \(fp32, [\d.]+ s\)$", out, re.M), out
    assert re.search(r"┃ primitive\s+┃ samples ┃", out)
    assert re.search(rf"│ {said.group(1)}\s+│\s+\d+ │", out)


@pytest.fixture(scope="module")
def captured(work) -> dict:
    """The tour's capture command, as written, into its own store (the refit then trains on this run alone)."""
    argv = doc_command(GETTING_STARTED, ".venv/bin/tracekit capture")
    store = argv.index("--store") + 1
    argv[store] = "run-store"
    done = tracekit(*argv, cwd=work)
    return {"dir": work / "runs" / "tp2", "stdout": done.stdout,
            "hardware": json.loads((work / "runs" / "tp2" / "manifest.json").read_text())["hardware"]}


def test_validate_without_models_prints_the_line_the_tour_quotes(work, captured):
    said = re.search(r"^warning: no models of (\S+) .*$", GETTING_STARTED, re.M)
    done = tracekit("validate", "runs/tp2", cwd=work)
    line = next(line for line in done.stderr.splitlines() if line.startswith("warning: no models of"))
    assert line == said.group(0).replace(said.group(1), captured["hardware"])


def test_validate_leads_with_the_iterations_without_the_profiler(work, captured):
    """The figure that compares like with like comes first: the run's iterations that ran without the profiler
    (its log, 14 of the tour's 20 past the first), then the profiled steps the tables compare, said to carry the
    profiler's overhead (they led before, and the docs said to read the later line instead)."""
    out = tracekit("validate", "runs/tp2", cwd=work).stdout.splitlines()
    assert re.match(r"iteration time without the profiler: real [\d.]+ m?s \(median of 14 iterations in the run's "
                    r"log\), predicted [\d.]+ m?s, error [+−][\d.]+ m?s \([+-][\d.]+%\)$", out[0]), out[:3]
    assert out[1].startswith("profiled steps (the tables below; they carry the profiler's overhead): real "), out[:3]


def test_validate_refit_prints_the_lines_and_files_the_tour_names(work, captured):
    argv = doc_command(GETTING_STARTED, ".venv/bin/tracekit validate runs/tp2")
    assert argv[:2] == ["validate", "runs/tp2"] and "--refit" in argv and argv[argv.index("--html") + 1] == \
        "report.html"
    # reduced: the bundled models before, the refit on the run's own store
    models = argv.index("--models")
    reduced = argv[:models] + argv[models + 2:]
    reduced[reduced.index("--store") + 1] = "run-store"
    out = tracekit(*reduced, cwd=work).stdout
    block = re.search(r"It prints the iteration time.*?```\n(.*?)```", GETTING_STARTED, re.S).group(1)
    for said in block.strip().splitlines():
        holes = {"N": r"[\d,]+", "M": r"[\d,]+", "…": r".+?"}  # the page's placeholders: counts, numbers
        pattern = "".join(holes.get(part, re.escape(part)) for part in re.split(r"(\bN\b|\bM\b|…)", said))
        assert re.search(pattern, out), (said, out[-1500:])
    assert (work / "report.html").is_file()
    assert sorted(p.name for p in (work / "report-predicted").iterdir()) == ["rank-0.json.gz"]
    assert "report-predicted/rank-0.json.gz" in GETTING_STARTED


def test_predict_prints_the_time_and_writes_the_traces_the_tour_names(work):
    argv = doc_command(GETTING_STARTED, ".venv/bin/tracekit predict traces/configs")
    out = tracekit(*argv, cwd=work).stdout
    said = re.search(r"It prints the iteration time \(([\d.]+) s\)", GETTING_STARTED).group(1)
    assert re.search(rf"iteration time {re.escape(said)} s", out), out[:500]
    names = re.search(r"`predicted/rank-\{([\d,]+)\}(\.json(?:\.gz)?)`", GETTING_STARTED)
    expected = sorted(f"rank-{r}{names.group(2)}" for r in names.group(1).split(","))
    assert sorted(p.name for p in (work / "predicted").iterdir()) == expected


def test_predict_batch_writes_the_columns_docs_name(tmp_path):
    argv = doc_command(GETTING_STARTED, ".venv/bin/tracekit predict --batch")
    source = Path(argv[argv.index("--batch") + 1])
    assert source.name and (E2E / source.name).is_file()
    argv[argv.index("--batch") + 1] = str(E2E / source.name)
    tracekit(*argv, cwd=tmp_path)
    header = next(csv.reader((tmp_path / "out.csv").open()))
    paragraph = re.search(r"`--batch FILE\.csv --csv-out FILE\.csv` reads.*?\n\n", PREDICT_DOC, re.S).group(0)
    named = re.findall(r"`([a-z_]+)`", paragraph.split("Every input column is repeated, then", 1)[1])
    assert named and set(named) <= set(header), sorted(set(named) - set(header))
    source_columns = next(csv.reader((E2E / source.name).open()))
    assert header[:len(source_columns)] == source_columns  # "every input column is repeated"


def test_search_of_the_tour_ranks_the_splits(tmp_path, work):
    argv = doc_command(GETTING_STARTED, ".venv/bin/tracekit search")
    top = int(argv[argv.index("--top") + 1])
    doc = json.loads(tracekit(*argv, "--json", cwd=work).stdout)
    assert top <= len(doc["candidates"]) <= top + 1  # the top splits (and the input's own, ranked, where it is not)


def test_predict_doc_lists_every_hardware_id():
    from tracekit.core.hardware import SPECS

    row = next(line for line in PREDICT_DOC.splitlines() if line.startswith("| `--hardware ID`"))
    assert set(re.findall(r"`([A-Z][A-Za-z0-9-]+)`", row)) == set(SPECS)
    assert ".py" not in row


def test_predict_doc_example_prints_what_the_page_shows(work):
    """docs/predict.md's worked example: every line the page shows (up to its "..."), as the command prints it."""
    block = re.search(r"```\n\$ tracekit (predict [^\n]+)\n(.*?)\n\.\.\.", PREDICT_DOC, re.S)
    done = subprocess.run([*TRACEKIT, *shlex.split(block.group(1))], cwd=work, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr[-2000:]
    printed = [line.strip() for line in (done.stderr + done.stdout).splitlines()]  # the note is on stderr
    for line in block.group(2).splitlines():
        assert line.strip() in printed, line


def test_ingest_doc_example_prints_what_the_page_shows(tmp_path):
    """docs/ingest.md's example: every line the page shows (its "..." stands for the ranks left out) is printed."""
    block = re.search(r"```\n\$ tracekit (ingest [^\n]+)\n(.*?)\n```", (ROOT / "docs" / "ingest.md").read_text(),
                      re.S)
    argv = shlex.split(block.group(1))
    argv[argv.index("--store") + 1] = str(tmp_path / ".tracekit-demo")
    done = subprocess.run([*TRACEKIT, *argv], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "160"})
    assert done.returncode == 0, done.stderr[-2000:]
    printed = [line.strip() for line in done.stdout.replace(str(tmp_path / ".tracekit-demo"), ".tracekit-demo")
               .splitlines()]
    for line in block.group(2).splitlines():
        assert line.strip() == "..." or line.strip() in printed, line


TOUR_OUTPUTS = (".tk/samples/part-0.parquet", ".tk/models-refit/index.json", "runs/tp2/manifest.json", "report.html",
                "report-predicted/rank-0.json.gz", "out.csv", "predicted/rank-0.json.gz")


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_the_tours_outputs_are_ignored_by_git_and_the_project_is_not():
    """The tour writes .tk/, runs/, report.html (and its predicted traces), out.csv and predicted/ into the checkout;
    `git status` then listed them all."""
    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode == 0

    assert [p for p in TOUR_OUTPUTS if not ignored(p)] == []
    assert not any(ignored(p) for p in ("traces/kineto", "docs/getting-started.md", "tracekit/report/html.py",
                                        "tests/data/cpu_collectives.csv"))


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_says_what_it_installs_before_pip_works(tmp_path):
    """`make demo` was silent for the 2 minutes of its first install (pip -q): the install now says what it
    installs, and pip names each package as it goes."""
    done = subprocess.run(["make", "-n", "demo", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    first_pip = next(i for i, line in enumerate(lines) if " install " in line and "/pip " in line)
    said = [line for line in lines[:first_pip] if line.startswith("echo ")]
    assert said and all(word in said[0] for word in ("tracekit", "torch", "minutes")), lines[:first_pip]
    package = next(line for line in lines if "pip install" in line and "-e " in line)
    assert " -q " not in package, package
