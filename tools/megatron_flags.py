"""Regenerate `tracekit/data/megatron_flags.json`: every command-line flag Megatron-LM's `pretrain_gpt.py` accepts.

tracekit refuses a Megatron flag it has never heard of (a typo would otherwise be ignored and the prediction
silently wrong), so it needs the list Megatron's own argparse checks against. The list is built here by running
Megatron's `add_megatron_arguments` on an empty parser — many flags are generated from Megatron's config
dataclasses, so reading the source for `add_argument` calls would miss them — and only the flag names, their
argparse destinations and whether they take a value are written out. No Megatron code goes into tracekit.

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

OUT = Path(__file__).resolve().parent.parent / "tracekit" / "data" / "megatron_flags.json"


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--source", required=True, help="Which Megatron-LM this list comes from (repo@commit).")
    cli.add_argument("--out", type=Path, default=OUT)
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
                flags[option] = {"dest": action.dest, "takes_value": action.nargs != 0}
    document = {
        "source": args.source,
        "what": "Flags of Megatron-LM's add_megatron_arguments (pretrain_gpt.py's parser), regenerated with "
                "tools/megatron_flags.py; flag -> argparse dest and whether it takes a value.",
        "flags": dict(sorted(flags.items())),
    }
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"{len(flags)} flags from {args.source} -> {args.out}")


if __name__ == "__main__":
    main()
