"""Conventions every command keeps: -h, flags shown as flags, one meaning per option name, files made with the
user's umask."""
from __future__ import annotations

import os
import re
import stat
import subprocess
import sys

import click
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


def _help_at(name: str, columns: int) -> str:
    """A command's --help as a terminal `columns` wide shows it (its own process: COLUMNS set as a shell does)."""
    env = {**os.environ, "COLUMNS": str(columns)}
    done = subprocess.run([sys.executable, "-c", "from tracekit.cli import main; main()", name, "--help"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("name", ["predict", "search", "train", "evaluate", "import", "sample", "capture"])
def test_help_at_80_columns_shows_every_option_name_whole(name):
    """At 80 columns rich's help panels gave six columns their share and cut `--gpus,--world-size` to
    `--gpus,--world-s…` (predict: 158 lines); every option's names are now whole and no line is wider than 80."""
    text = _help_at(name, 80)
    names = [opt for p in COMMANDS[name].params if p.param_type_name == "option" for opt in (*p.opts,
                                                                                              *p.secondary_opts)]
    missing = [opt for opt in names if not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text)]
    assert not missing, missing
    assert max(len(line) for line in text.splitlines()) <= 80, [line for line in text.splitlines() if len(line) > 80]


def test_an_option_name_means_one_thing_with_one_default():
    """`--ranks` was a rank list in capture (default all), a rank list in megatron-args (default 0) and a process
    count in sample; now the two rank lists share a default and sample's count is --processes."""
    ranks = [(name, p.type.name, p.default) for name, command in COMMANDS.items() for p in command.params
             if "--ranks" in getattr(p, "opts", ())]
    assert sorted(name for name, _, _ in ranks) == ["capture", "megatron-args"]
    assert len({(kind, default) for _, kind, default in ranks}) == 1, ranks


#: Enumerated options, each with the engine's own list of values (what the code acting on it accepts).
def _engines() -> dict:
    from predictor.sweeps.search import OBJECTIVES
    from tracekit.capture.megatron_flags import LAYOUTS
    from tracekit.capture.run import LAYOUT_CHOICES, MODES
    from tracekit.cli.import_samples import FORMATS
    from tracekit.core.samples import PRIMITIVES
    from tracekit.core.stacks import stacks
    from tracekit.sampling.compute import DTYPES

    return {("capture", "--layout"): LAYOUT_CHOICES, ("megatron-args", "--layout"): LAYOUTS,
            ("capture", "--mode"): MODES,
            ("search", "--objective"): tuple(o.replace("_", "-") for o in OBJECTIVES),
            ("import", "--format"): FORMATS, ("evaluate", "--format"): (*FORMATS, "kineto"),
            ("train", "--primitive"): PRIMITIVES,
            ("sample", "--dtype"): tuple(DTYPES), ("sample", "--device"): ("cpu", "cuda"),
            ("predict", "--stack"): tuple(sorted(stacks())), ("search", "--stack"): tuple(sorted(stacks()))}


def test_enumerated_options_are_choices_that_refuse_other_values():
    """They were TEXT: `--layout`, `--mode`, `--format`, `--objective`, ... list their values in --help, and a value
    outside them is a usage error (exit 2) naming the option and every value, before any work."""
    for (name, option), values in _engines().items():
        (param,) = [p for p in COMMANDS[name].params if option in getattr(p, "opts", ())]
        assert isinstance(param.type, click.Choice), (name, option, param.type)
        assert tuple(param.type.choices) == tuple(values), (name, option)
        done = runner.invoke(app, [name, option, "bogus-value"])
        assert done.exit_code == 2, (name, option, done.output)
        assert option in done.stderr and all(repr(v) in done.stderr for v in values), done.stderr


def test_a_mistyped_command_or_value_is_one_line_naming_it_once():
    """"Did you mean 'predict'? Did you mean 'predict'?" (typer's suggestion after click's); the command says a usage
    error as it says every error: one line, exit 2."""
    for args, said in ((["predit"], "No such command 'predit'. Did you mean 'predict'?"),
                       (["capture", "--layout", "tensorbord", "--", "true"],
                        "'tensorbord' is not one of 'auto', 'tensorboard', 'torch_profile'. "
                        "(did you mean 'tensorboard'?)")):
        done = subprocess.run([sys.executable, "-c", "from tracekit.cli import main; main()", *args],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and not done.stdout, done
        (line,) = done.stderr.splitlines()
        assert line.startswith("error: ") and line.count(said) == 1 and line.count("id you mean") == 1, line
