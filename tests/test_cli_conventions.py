"""Conventions every command keeps: -h, flags shown as flags, one meaning per option name, files made with the
user's umask."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
import typer.main
from typer.testing import CliRunner

from tests.conftest import E2E, KINETO
from tracekit.cli import app

runner = CliRunner()
COMMANDS = typer.main.get_command(app).commands
#: Output options and the one kind of thing each names, whatever the command.
OUTPUTS = {"--out": "a capture folder", "--models-out": "a model folder", "--refit-out": "a model folder",
           "--csv-out": "a CSV file",
           "--calibration-out": "a calibration JSON file", "--trace-out": "a folder of predicted traces",
           "--html": "an HTML report"}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_shows_flags_as_flags(name):
    done = runner.invoke(app, [name, "-h"], terminal_width=200)
    assert done.exit_code == 0, done.output
    assert "<bool>" not in done.stdout
    flags = [opt for p in COMMANDS[name].params if p.param_type_name == "option" and p.is_flag for opt in p.opts]
    assert all(flag in done.stdout for flag in flags)


def test_an_output_option_means_one_kind_of_thing_in_every_command():
    seen: dict[str, set[str]] = {}
    for name, command in COMMANDS.items():
        for param in command.params:
            if param.param_type_name == "option":
                for opt in param.opts:
                    if opt.endswith("-out") or opt in ("--out", "--html"):
                        seen.setdefault(opt, set()).add(name)
    assert set(seen) <= set(OUTPUTS), set(seen) - set(OUTPUTS)
    assert seen["--out"] == {"capture", "megatron-args"}  # both name the capture folder


@pytest.mark.parametrize("name", ["ingest", "search"])
def test_executor_and_ray_address_are_one_option_pair_in_every_command(name, tmp_path):
    """ingest and search take --executor local|ray (listed in --help; anything else is typer's usage error) and
    refuse --ray-address without --executor ray before doing any work. Ray is never reached: no test here needs it."""
    store = tmp_path / "store"
    work = {"ingest": [str(KINETO / "hta" / "nccl_parser_config_nccl_data.json.gz"), "--store", str(store)],
            "search": ["--megatron-args", "--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length "
                       "1024 --global-batch-size 32 --fp16", "--gpus", "8", "--hardware", "A100-SXM4-80GB"]}[name]
    assert "local|ray" in runner.invoke(app, [name, "-h"], terminal_width=200).stdout
    unknown = runner.invoke(app, [name, *work, "--executor", "dask"])
    assert unknown.exit_code == 2 and "--executor" in unknown.stderr and "'dask'" in unknown.stderr
    for executor in ([], ["--executor", "local"]):
        stray = runner.invoke(app, [name, *work, *executor, "--ray-address", "auto"])
        assert stray.exit_code == 2 and stray.stderr == "error: --ray-address needs --executor ray\n"
    assert not store.exists()  # refused before anything was written


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_written_files_and_folders_follow_the_umask(tmp_path, umask, file_mode, dir_mode):
    """mkstemp/mkdtemp make private files (0600/0700): what tracekit publishes must get what the umask gives, no
    more (a user with umask 027 keeps the world out) and no less."""
    script = (
        f"import os, sys; os.umask({umask:#o}); from tracekit.cli import app; sys.argv[0] = 'tracekit'; app()"
    )
    store, models, csv = tmp_path / "store", tmp_path / "models", tmp_path / "pred.csv"
    steps = [
        ["ingest", str(KINETO / "hta" / "nccl_parser_config_nccl_data.json.gz"), "--store", str(store)],
        ["train", "--store", str(store), "--models-out", str(models), "--folds", "2"],
        ["predict", "--batch", str(E2E / "narayanan2021_table1_a100_selene.csv"), "--csv-out", str(csv)],
    ]
    for argv in steps:
        done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True)
        assert done.returncode in (0, 1), done.stderr  # 1: some inputs not predicted; still written
    assert _mode(csv) == file_mode
    assert _mode(models) == dir_mode
    assert {_mode(p) for p in models.iterdir()} == {file_mode}
    assert {_mode(p) for p in store.rglob("*") if p.is_file()} <= {file_mode}


def test_python_dash_m_is_the_same_command():
    done = subprocess.run([sys.executable, "-m", "tracekit", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("tracekit ")
