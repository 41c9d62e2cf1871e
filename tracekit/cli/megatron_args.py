"""`tracekit megatron-args`: the Megatron flags that profile a step range into a directory."""
from __future__ import annotations

import shlex
from pathlib import Path

import typer

from .app import app
from .choices import LAYOUTS, choice
from .output import print_json, user_errors


@app.command("megatron-args")
def megatron_args(
    steps: str = typer.Option("10-13", "--steps", help="Steps START-END to profile (END excluded; ≥ 3 steps)."),
    ranks: str = typer.Option("all", "--ranks", help="Ranks to profile: 'all' (needs --world-size) or '0,1,...'."),
    out: Path = typer.Option(Path("tracekit-capture"), "--out", help="Directory the traces should land under."),
    shapes: bool = typer.Option(True, "--shapes/--no-shapes", help="Record operator shapes (needed to learn from)."),
    layout: str = typer.Option(
        "tensorboard", "--layout", click_type=choice(LAYOUTS),
        help="Megatron core ≤ 0.16 'tensorboard' (OUT/tensorboard/{host}_{pid}.{ns}.pt.trace.json) or ≥ 0.17 "
        "'torch_profile' (OUT/torch_profile/rank-N.json.gz; shapes need --pytorch-profiler-collect-shapes).",
    ),
    world_size: int = typer.Option(None, "--world-size", help="Number of ranks (for --ranks all)."),
    as_json: bool = typer.Option(False, "--json", help="Print {flags, trace_globs} as JSON."),
) -> None:
    """Print the Megatron arguments that profile steps START-END into OUT; append them to pretrain_gpt.py's.

    \b
    Example:
      tracekit megatron-args --steps 10-13 --ranks all --world-size 8 --out runs/a
    """
    from tracekit.capture.megatron_flags import (
        StepRange,
        expected_trace_globs,
        parse_ranks,
        profiling_flags,
    )

    with user_errors():
        flags = profiling_flags(out, StepRange.parse(steps), parse_ranks(ranks, world_size), layout, shapes)
        globs = [str(out / g) for g in expected_trace_globs(layout)]
    if as_json:
        print_json({"flags": flags, "trace_globs": globs})
    else:
        typer.echo(shlex.join(flags))
