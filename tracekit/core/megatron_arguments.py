"""The command-line flags Megatron-LM accepts, so a misspelt or invented flag is refused as Megatron's argparse would.

`tracekit/data/megatron_flags.json` lists every flag of `pretrain_gpt.py`'s parser in one pinned Megatron-LM snapshot
(regenerated with `tools/megatron_flags.py`): the flag, its argparse destination and whether it takes a value.
A setting is known when it is one of those (flag or destination form; `--no-x` read as `x`) or a name tracekit reads
itself. Flags of newer Megatron versions are not in the list: a user passes them with `--allow-unknown`, which turns
the refusal into a warning.
"""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from .errors import ConfigError, did_you_mean


@lru_cache(maxsize=1)
def _table() -> tuple[str, dict[str, dict]]:
    document = json.loads(resources.files("tracekit").joinpath("data/megatron_flags.json").read_text())
    return document["source"], document["flags"]


def source() -> str:
    """Which Megatron-LM the flag list comes from (repo@commit)."""
    return _table()[0]


def dest_form(name: str) -> str:
    """`--sequence-parallel` / `sequence-parallel` / `Sequence_Parallel` → `sequence_parallel`."""
    return str(name).strip().lstrip("-").replace("-", "_").lower()


@lru_cache(maxsize=1)
def megatron_names() -> frozenset[str]:
    """Every setting name Megatron accepts, in dest form (flags, argparse destinations, `--no-x` as `x`)."""
    names: set[str] = set()
    for flag, entry in _table()[1].items():
        names.update((dest_form(flag), entry["dest"]))
        if flag.startswith("--no-"):
            names.add(dest_form(flag[5:]))
    return frozenset(names)


def is_switch(flag: str) -> bool:
    """True for a Megatron flag that takes no value (`--bf16`): the word after it is not its value."""
    entry = _table()[1].get("--" + str(flag).strip().lstrip("-"))
    return entry is not None and not entry["takes_value"]


def unknown_settings(keys, own: set[str]) -> list[tuple[str, str]]:
    """(key, " (did you mean ...?)" or "") for each key that is neither Megatron's nor in `own` (tracekit's names)."""
    known = megatron_names() | own
    out = []
    for key in keys:
        dest = dest_form(key)
        if dest not in known:
            out.append((str(key), did_you_mean(dest, own, cutoff=0.75) or did_you_mean(dest, known, cutoff=0.75)))
    return out


def refuse_unknown(keys, own: set[str], collect: list[str] | None = None) -> list[str]:
    """ConfigError for the first unknown key; with `collect` (the user's --allow-unknown), append one warning per
    unknown key to it instead and return those keys (the caller keeps them aside)."""
    accepted = []
    for key, hint in unknown_settings(keys, own):
        reason = f"not a flag of Megatron-LM ({source()}) nor a setting tracekit reads"
        if collect is None:
            raise ConfigError(f"unknown setting {key!r}{hint}: {reason}; --allow-unknown accepts flags of newer "
                              "Megatron versions")
        collect.append(f"{key!r} is {reason}{hint}: kept aside, not used in the prediction")
        accepted.append(key)
    return accepted
