"""The command-line flags Megatron-LM accepts, so a misspelt or invented flag is refused as Megatron's argparse would.

`tracekit/data/megatron_flags.json` lists every flag of `pretrain_gpt.py`'s parser in one pinned Megatron-LM snapshot
(regenerated with `tools/megatron_flags.py`): the flag, its argparse destination and whether it takes a value.
A setting is known when it is one of those (flag or destination form; `--no-x` read as `x`) or a name tracekit reads
itself. Flags of newer Megatron versions are not in the list: a user passes them with `--allow-unknown`, which turns
the refusal into a warning.

Every flag has a class for the iteration time (`tracekit/data/megatron_flag_classes.json`, kept by people across
regenerations): `modelled` (tracekit reads the setting), `no_effect` (optimiser values, data, checkpointing, logging
at intervals, other model families) or `time_unmodelled` (it changes the time and tracekit does not model it);
`unmodelled_flags` names the flags of the last class a configuration sets to other than Megatron's default, for the
one warning line `predict` prints.
"""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from tracekit.core.errors import ConfigError, did_you_mean

CLASSES = ("modelled", "no_effect", "time_unmodelled")


@lru_cache(maxsize=1)
def _table() -> tuple[str, dict[str, dict]]:
    document = json.loads(resources.files("tracekit").joinpath("data/megatron_flags.json").read_text())
    return document["source"], document["flags"]


@lru_cache(maxsize=1)
def flag_classes() -> dict[str, str]:
    """Each flag's class for the iteration time (module docstring)."""
    document = json.loads(resources.files("tracekit").joinpath("data/megatron_flag_classes.json").read_text())
    return dict(document["classes"])


@lru_cache(maxsize=1)
def _flags_of_setting() -> dict[str, list[str]]:
    """Setting name (dest form) → the flags that set it (`--x`, `--no-x`, the flag of an argparse dest)."""
    out: dict[str, list[str]] = {}
    for flag, entry in _table()[1].items():
        names = {dest_form(flag), str(entry["dest"]).lower()}
        if flag.startswith("--no-"):
            names.add(dest_form(flag[5:]))
        for name in names:
            out.setdefault(name, []).append(flag)
    return out


def list_words(value: Any) -> tuple[str, ...] | None:
    """A list setting's items, from a flag's values, a CSV cell (`[attn, moe_router]`, `['core_attn']`,
    `attn,mlp`) or a YAML list; None stays None."""
    if value is None:
        return None
    items = value if isinstance(value, (list, tuple)) else str(value).strip("[]").replace(",", " ").split()
    return tuple(str(v).strip().strip("'\"") for v in items if str(v).strip().strip("'\""))


def _same(value: Any, default: Any) -> bool:
    """Whether a setting's value (a parsed cell, flag value or YAML value) is Megatron's default."""
    if isinstance(default, bool) or isinstance(value, bool):
        text = str(value).strip().lower()
        return str(default).lower() == ("true" if text in ("true", "1", "yes") else "false")
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        try:
            return float(value) == float(default)
        except (TypeError, ValueError):
            return False
    if isinstance(default, list):
        return list(list_words(value) or ()) == [str(v) for v in default]
    return str(value) == str(default)


def unmodelled_flags(settings: dict[str, Any]) -> list[str]:
    """The `time_unmodelled` flags that `settings` (setting name → value: a configuration's `extra`) set to other
    than Megatron's default, as a person writes them (`--no-bias-gelu-fusion`), in order."""
    classes, table = flag_classes(), _table()[1]
    out: list[str] = []
    for key, value in settings.items():
        flags = _flags_of_setting().get(dest_form(key), [])
        if not flags:
            continue
        negative = [f for f in flags if f.startswith("--no-") and dest_form(f[5:]) == dest_form(key)]
        flag = negative[0] if negative and value is False else flags[0]
        if "default" in table[flag] and _same(value, table[flag]["default"]):
            continue
        if classes.get(flag) == "time_unmodelled" and flag not in out:
            out.append(flag)
    return out


def unmodelled_warning(settings: dict[str, Any]) -> str | None:
    """The one warning line naming the `time_unmodelled` flags `settings` set (`unmodelled_flags`), or None."""
    flags = unmodelled_flags(settings)
    if not flags:
        return None
    return (f"{len(flags)} flag(s) change the iteration time but are not modelled (the prediction runs as without "
            f"them): {' '.join(flags)}")


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
