"""Megatron's own forms of a training job: a launch command line (`--num-layers 24 --bf16 ...`, or a whole
`torchrun ... pretrain_gpt.py --num-layers ...` line), the arguments block Megatron prints at start-up and the
iteration times its log reports, and YAML/JSON files of Megatron argument names (or a Megatron log) — each as a
TrainingConfig (tracekit.core.config)."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any, Iterable

from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError, InputError
from tracekit.core.megatron_arguments import dest_form, is_switch

ARGS_BEGIN = re.compile(r"-{3,}\s*arguments\s*-{3,}")
ARGS_END = re.compile(r"-{3,}\s*end of arguments\s*-{3,}")
ARG_LINE = re.compile(r"^\s*(?:\[[^\]]*\]\s*)*([A-Za-z_][A-Za-z0-9_]*)\s+\.{2,}\s*(.*?)\s*$")
ITER_TIME = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.]+)")


def parse_megatron_argv(argv: str | Iterable[str]) -> dict[str, Any]:
    """Megatron flags → {dest: value}; a flag with no value is True (`--no-x` sets x False). In a whole launch line
    (`torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 24 ...`) only the flags after the script count."""
    words = shlex.split(argv) if isinstance(argv, str) else list(argv)
    scripts = [i for i, w in enumerate(words) if w.endswith(".py") and not w.startswith("-")]
    if scripts:
        words = words[scripts[-1] + 1:]
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--") and len(word) > 2:
            name, eq, inline = word[2:].partition("=")
            if eq:
                out[dest_form(name)] = inline
            elif i + 1 < len(words) and not _is_flag(words[i + 1]) and not is_switch(name):
                values = []
                while i + 1 < len(words) and not _is_flag(words[i + 1]):
                    values.append(words[i + 1])
                    i += 1
                out[dest_form(name)] = values[0] if len(values) == 1 else values
            elif name.startswith("no-"):
                out[dest_form(name[3:])] = False
            else:
                out[dest_form(name)] = True
        i += 1
    return out


def parse_arguments_block(text: str, path: str = "log") -> dict[str, Any]:
    """The `name ....... value` lines between Megatron's arguments markers."""
    begin = ARGS_BEGIN.search(text)
    if not begin:
        raise InputError(path, "no Megatron arguments block (------ arguments ------) found")
    end = ARGS_END.search(text, begin.end())
    body = text[begin.end(): end.start() if end else len(text)]
    out: dict[str, Any] = {}
    for line in body.splitlines():
        match = ARG_LINE.match(line)
        if match:
            out[match.group(1)] = match.group(2)
    if not out:
        raise InputError(path, "the Megatron arguments block is empty")
    return out


def parse_iteration_times_ms(text: str) -> list[float]:
    """Every `elapsed time per iteration (ms): X` value in a Megatron log, in order."""
    return [float(v) for v in ITER_TIME.findall(text)]


def _is_flag(word: str) -> bool:
    return word.startswith("--") and not re.fullmatch(r"--?\d+(\.\d+)?", word)


def config_from_argv(argv: str | Iterable[str], defaults: dict[str, Any] | None = None,
                       unknown: list[str] | None = None) -> TrainingConfig:
    """Parse a Megatron command line (`--num-layers 24 --bf16 ...`); non-flag words are ignored; a flag Megatron
    does not have (`--sequence-paralel`) is an error with a suggestion (a warning in `unknown`, if given)."""
    return TrainingConfig.from_mapping(parse_megatron_argv(argv), defaults, strict=True, unknown=unknown)

def config_from_log(text: str, path: str = "log", defaults: dict[str, Any] | None = None
                      ) -> TrainingConfig:
    """Parse the arguments block Megatron prints at start-up."""
    return TrainingConfig.from_mapping(parse_arguments_block(text, path), defaults)

def job_settings(data: dict[str, Any]) -> dict[str, Any]:
    """A YAML/JSON job's Megatron settings: the mapping itself, or its `arguments:` mapping."""
    return data["arguments"] if isinstance(data.get("arguments"), dict) else data


def config_from_file(path: str | Path, defaults: dict[str, Any] | None = None,
              unknown: list[str] | None = None) -> TrainingConfig:
    """YAML or JSON mapping of Megatron argument names; a Megatron log file is recognized by its block. Unknown
    keys: as `from_mapping(strict=True, unknown=...)`."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from exc
    if ARGS_BEGIN.search(text):
        return config_from_log(text, str(path), defaults)
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # noqa: BLE001 - any parser error is a bad input file
        raise InputError(path, f"not valid {'JSON' if path.suffix.lower() == '.json' else 'YAML'} ({exc})") from exc
    if not isinstance(data, dict):
        raise InputError(path, "configuration must be a mapping of Megatron argument names to values")
    try:
        return TrainingConfig.from_mapping(job_settings(data), defaults, strict=True, unknown=unknown)
    except ConfigError as exc:
        raise InputError(path, str(exc)) from exc
