"""Regenerate `tracekit/data/megatron_flags.json`: every command-line flag Megatron-LM's `pretrain_gpt.py` accepts.

tracekit refuses a Megatron flag it has never heard of (a typo would otherwise be ignored and the prediction
silently wrong), so it needs the list Megatron's own argparse checks against. The list is built here by running
Megatron's `add_megatron_arguments` on an empty parser — many flags are generated from Megatron's config
dataclasses, so reading the source for `add_argument` calls would miss them — and only the flag names, their
argparse destinations, whether they take a value and their defaults (where JSON can hold them) are written out.
No Megatron code goes into tracekit.

Each flag's class — `modelled`, `no_effect` or `time_unmodelled` (`tracekit.core.megatron_arguments`) — lives in
`tracekit/data/megatron_flag_classes.json`, written by people, and is kept across regenerations: this tool adds a
flag new in the snapshot as `time_unmodelled` (the class that warns; review it) and lists it, and drops the classes
of flags the snapshot no longer has.

Usage (a maintainer's machine, once per Megatron snapshot; Megatron's import chain needs torch and triton):

    pip install --target /tmp/triton triton
    tar -xzf ../shared/vendor/megatron-lm-<commit>.tar.gz -C /tmp/meg
    PYTHONPATH=/tmp/meg/megatron-lm:/tmp/triton .venv/bin/python tools/megatron_flags.py \
        --source "NVIDIA/Megatron-LM@<commit>"
"""
from __future__ import annotations

import argparse
import json
import typing
import warnings
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tracekit" / "data"
OUT = DATA / "megatron_flags.json"
CLASSES = DATA / "megatron_flag_classes.json"
NEW_CLASS = "time_unmodelled"


def json_default(value: object) -> tuple[bool, object]:
    """(representable, value) of an argparse default as JSON: scalars, lists of scalars, enum members by name."""
    import enum

    if value is None or isinstance(value, (bool, int, float, str)):
        return True, value
    if isinstance(value, enum.Enum):
        return True, value.name
    if isinstance(value, (list, tuple)) and all(v is None or isinstance(v, (bool, int, float, str)) for v in value):
        return True, list(value)
    return False, None


def merge_classes(flags: dict[str, dict], path: Path) -> list[str]:
    """Keep the classes of `path` for the flags still present, add new flags as NEW_CLASS; returns the new flags."""
    doc = json.loads(path.read_text()) if path.exists() else {"classes": {}}
    old = doc["classes"]
    new = sorted(f for f in flags if f not in old)
    doc["classes"] = {f: old.get(f, NEW_CLASS) for f in sorted(flags)}
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    return new


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--source", required=True, help="Which Megatron-LM this list comes from (repo@commit).")
    cli.add_argument("--out", type=Path, default=OUT)
    cli.add_argument("--classes", type=Path, default=CLASSES, help="The flags' classes, kept and merged.")
    args = cli.parse_args()
    if not hasattr(typing, "override"):  # the snapshot targets Python ≥ 3.12; 3.11 has it in typing_extensions
        import typing_extensions

        typing.override = typing_extensions.override
    warnings.simplefilter("ignore")
    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    flags = {}
    for action in parser._actions:  # argparse has no public list of its actions
        for option in action.option_strings:
            if option.startswith("--"):
                entry = {"dest": action.dest, "takes_value": action.nargs != 0}
                known, default = json_default(action.default)
                if known and action.default != argparse.SUPPRESS:
                    entry["default"] = default
                flags[option] = entry
    document = {
        "source": args.source,
        "what": "Flags of Megatron-LM's add_megatron_arguments (pretrain_gpt.py's parser), regenerated with "
                "tools/megatron_flags.py; flag -> argparse dest, whether it takes a value, and its default (where "
                "JSON can hold it).",
        "flags": dict(sorted(flags.items())),
    }
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"{len(flags)} flags from {args.source} -> {args.out}")
    new = merge_classes(flags, args.classes)
    if new:
        print(f"{len(new)} new flag(s) classed {NEW_CLASS} in {args.classes}; review: {', '.join(new)}")


if __name__ == "__main__":
    main()
