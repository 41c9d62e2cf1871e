"""`--executor` and `--ray-address`, the options of the commands that can run their work as Ray tasks (ingest,
search): one definition of the two, their help and the rule between them."""
from __future__ import annotations

from enum import Enum
from typing import Any, Optional

import typer

from .output import fail


class Executor(str, Enum):
    """Where a command's work runs; typer lists the values in --help and refuses any other."""

    local = "local"
    ray = "ray"


def executor_option() -> Any:
    return typer.Option(Executor.local, "--executor",
                        help="local (this machine) | ray (Ray tasks: a local Ray started on demand, or the cluster "
                             "of --ray-address; needs `tracekit[ray]`)")


def ray_address_option(note: str = "") -> Any:
    """`note`: what the command adds about a cluster (e.g. ingest's workers open the traces themselves)."""
    return typer.Option(None, "--ray-address",
                        help="An existing Ray cluster for --executor ray (e.g. auto, ray://head:10001)"
                             + (f"; {note}" if note else "") + ".")


def check_ray_address(executor: Executor, ray_address: Optional[str]) -> None:
    """A Ray cluster named for local work is a mistake, not something to ignore: one error line, exit 2."""
    if ray_address is not None and executor is not Executor.ray:
        fail("--ray-address needs --executor ray")
