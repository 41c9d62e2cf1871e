"""A wrong file type or an impossible request is one line naming the file and what it is, and a non-zero exit, in
every command that takes a job; shell completion is typer's."""
from __future__ import annotations

import gzip
import json

import pytest
from typer.testing import CliRunner

from tests.conftest import E2E, KINETO, TRACES
from tracekit.cli import app

runner = CliRunner()
TRACE_GZ = KINETO / "hta" / "nccl_parser_config_nccl_data.json.gz"


def _one_line(result, *words: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert not result.stdout
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture(scope="module")
def plain_trace(tmp_path_factory):
    """The same Kineto trace, uncompressed: a JSON file that parses, but is no configuration."""
    path = tmp_path_factory.mktemp("trace") / "rank-0.json"
    path.write_bytes(gzip.decompress(TRACE_GZ.read_bytes()))
    return path


@pytest.mark.parametrize("command", [["predict"], ["search", "--gpus", "8"]])
def test_traces_tables_folders_and_binaries_given_as_a_job(command, plain_trace, tmp_path):
    where = ["--hardware", "A100-SXM4-80GB"]
    _one_line(runner.invoke(app, [command[0], str(TRACE_GZ), *command[1:], *where]),
              str(TRACE_GZ), "gzip-compressed", "tracekit ingest")
    _one_line(runner.invoke(app, [command[0], str(plain_trace), *command[1:], *where]),
              str(plain_trace), "a Kineto trace, not a job file")
    table = E2E / "narayanan2021_table1_a100_selene.csv"
    _one_line(runner.invoke(app, [command[0], str(table), *command[1:], *where]), str(table), "a CSV table",
              "--batch")
    _one_line(runner.invoke(app, [command[0], str(KINETO), *command[1:], *where]), "a folder, not a job file")
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    _one_line(runner.invoke(app, [command[0], str(binary), *command[1:], *where]), "not a text file")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("num_layers: 2  # café\nhidden_size: 64\n".encode("latin-1"))
    _one_line(runner.invoke(app, [command[0], str(latin), *command[1:], *where]), "not UTF-8 text (byte 0xe9")
    broken = tmp_path / "job.yaml"
    broken.write_text("num_layers: 2\nhidden_size: [64\n")
    _one_line(runner.invoke(app, [command[0], str(broken), *command[1:], *where]), str(broken),
              "not valid YAML/JSON (line 3")
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([{"num_layers": 2}]))
    _one_line(runner.invoke(app, [command[0], str(listed), *command[1:], *where]), "mapping of Megatron argument")


def test_a_text_file_that_is_neither_a_job_nor_a_log(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("todo: run the 7B job on: 16 GPUs\n  see: the wiki\n")
    _one_line(runner.invoke(app, ["predict", str(notes), "--hardware", "A100-SXM4-80GB"]),
              "not valid YAML/JSON", "nor a Megatron log")


def test_the_shipped_job_still_reads(tmp_path):
    done = runner.invoke(app, ["predict", str(TRACES / "configs" / "llemma-7b-a100.yaml"), "--hardware",
                               "A100-SXM4-80GB", "--gpus-per-node", "4", "--json"])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    assert doc["cluster"]["name"] == "perlmutter" and doc["warnings"][0].startswith("cluster perlmutter assumed")


def test_shell_completion_is_typers(monkeypatch):
    # The shell is named, not detected: detection reads the parent process, which is no shell under some runners.
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    shown = runner.invoke(app, ["--show-completion", "bash"], prog_name="tracekit")
    assert shown.exit_code == 0 and "_TRACEKIT_COMPLETE=complete_bash" in shown.stdout, (shown.output, shown.exception)
    assert "--install-completion" in runner.invoke(app, ["--help"], terminal_width=200).stdout
    completed = runner.invoke(app, [], env={"_TRACEKIT_COMPLETE": "complete_bash", "COMP_WORDS": "tracekit pre",
                                            "COMP_CWORD": "1"}, prog_name="tracekit")
    assert completed.stdout.split() == ["predict"]
