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


def _without(tmp_path, *columns: str):
    """Narayanan et al.'s table (the corpus's A100 Selene rows) with `columns` cut out of it."""
    import csv

    with open(E2E / "narayanan2021_table1_a100_selene.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    kept = [c for c in rows[0] if c not in columns]
    path = tmp_path / f"without-{'-'.join(columns)}.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, kept, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.mark.parametrize("columns, named", [(("hardware_gpu",), "missing column hardware_gpu"),
                                            (("tp",), "missing column tp"),
                                            (("hardware_gpu", "pp"), "missing columns hardware_gpu")])
def test_a_batch_file_without_a_column_every_row_needs_is_one_line(tmp_path, columns, named):
    """Without hardware_gpu every row failed on its own 600-character line ("unknown hardware '80GB'"); without tp
    (the rows state num_gpus and dp) tp 1 was assumed in silence and 9 of 10 rows failed on tp·pp·dp·cp ≠ num_gpus.
    Nothing could be done: exit 2, one line naming the columns, and no output file."""
    path, out = _without(tmp_path, *columns), tmp_path / "out.csv"
    result = runner.invoke(app, ["predict", "--batch", str(path), "--csv-out", str(out)])
    _one_line(result, str(path), named, *columns)
    assert len(result.stderr) < 300 and not out.exists()


def test_a_batch_file_names_the_hardware_on_the_command_line_instead(tmp_path):
    path, out = _without(tmp_path, "hardware_gpu"), tmp_path / "out.csv"
    result = runner.invoke(app, ["predict", "--batch", str(path), "--csv-out", str(out), "--hardware",
                                 "A100-SXM4-80GB"])
    assert result.exit_code == 0, result.stderr
    assert "10/10 rows predicted" in result.stdout


def test_a_column_a_batch_file_lacks_is_assumed_once_for_the_file(tmp_path):
    """cp and micro_batch_size cut: every row takes what a blank cell takes (Megatron's cp 1; the fastest micro-batch
    that fits, Megatron having no default), said once on stderr (not per row) and in every row's prediction_notes;
    the answer is the table's with those cells blank."""
    import csv

    path, out = _without(tmp_path, "cp", "micro_batch_size"), tmp_path / "out.csv"
    result = runner.invoke(app, ["predict", "--batch", str(path), "--csv-out", str(out)])
    assert result.exit_code == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "cp = 1" in line]
    assert len(said) == 1 and said[0].startswith("note: ")
    assert "micro_batch_size = the fastest of 1, 2, 4, 8, 16 that fits" in said[0]
    with open(out, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert all("cp = 1" in row["prediction_notes"] for row in rows)
    with open(E2E / "narayanan2021_table1_a100_selene.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert {row["cp"] for row in table} == {"1"} and {row["micro_batch_size"] for row in table} == {""}
    full = runner.invoke(app, ["predict", "--batch", str(E2E / "narayanan2021_table1_a100_selene.csv"),
                               "--csv-out", str(tmp_path / "full.csv")])
    with open(tmp_path / "full.csv", newline="") as handle:
        whole = [row["predicted_iteration_time_s"] for row in csv.DictReader(handle)]
    assert full.exit_code == 0 and [row["predicted_iteration_time_s"] for row in rows] == whole


def test_a_job_without_its_micro_batch_says_which_it_took(tmp_path):
    """Megatron has no default micro-batch (`--micro-batch-size` is required): a command line or YAML job that does
    not state one is predicted at 1, and one warning says so; stated on the line, in the file or with --set, none."""
    line = "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --global-batch-size 8 --bf16"
    job = tmp_path / "job.yaml"
    job.write_text("num_layers: 4\nhidden_size: 1024\nnum_attention_heads: 16\nseq_length: 1024\n"
                   "global_batch_size: 8\nbf16: true\n")
    stated = tmp_path / "stated.yaml"
    stated.write_text(job.read_text() + "micro_batch_size: 2\n")
    nested = tmp_path / "nested.yaml"  # the settings under `arguments:`
    nested.write_text("arguments:\n" + "".join(f"  {line}\n" for line in stated.read_text().splitlines()))

    def warned(*args: str) -> tuple[list[str], dict]:
        result = runner.invoke(app, ["predict", *args, "--hardware", "A100-SXM4-80GB", "--json"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        return [w for w in doc["warnings"] if w.startswith("micro_batch_size not given")], doc["config"]
    for args in (("--megatron-args", line), (str(job),)):
        said, config = warned(*args)
        assert len(said) == 1 and "1 taken" in said[0] and config["micro_batch_size"] == 1
    for args in (("--megatron-args", line + " --micro-batch-size 2"), (str(stated),), (str(nested),),
                 ("--megatron-args", line, "--set", "micro_batch_size=2")):
        said, config = warned(*args)
        assert not said and config["micro_batch_size"] == 2
