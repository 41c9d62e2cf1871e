"""What every command shares: one-line errors with exit codes, JSON output, progress bars."""
from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from typing import Any, Iterator, NoReturn

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from tracekit.core.errors import TracekitError

#: Results on stdout. Piped or redirected, rich would wrap tables at 80 columns; there they are drawn at full width
#: (one line per row, for grep and less -S) and without colour.
console = Console() if sys.stdout.isatty() else Console(width=400, no_color=True, highlight=False)
#: Warnings, errors and progress on stderr.
err_console = Console(stderr=True, highlight=False)

EXIT_FAILED = 2  # nothing could be done
EXIT_PARTIAL = 1  # some inputs failed, the rest were processed

#: `--allow-unknown` of the commands that read a job (predict, search): one wording for one meaning.
ALLOW_UNKNOWN_HELP = ("Accept settings that are not flags of the Megatron-LM tracekit knows (e.g. from a newer "
                      "version): a warning, not an error.")


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print one error line to stderr (a message of several lines, e.g. a parser's, joined into one) and exit."""
    err_console.print(f"error: {' '.join(str(message).split())}", markup=False, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn tracekit's typed errors into one line on stderr and exit code 2."""
    try:
        yield
    except TracekitError as exc:
        fail(str(exc))


def print_json(obj: Any) -> None:
    """One JSON document on stdout (no rich formatting, so scripts can parse it)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=_default) + "\n")
    sys.stdout.flush()


def _default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def progress(quiet: bool = False) -> Progress:
    """A progress bar on stderr; silent with `quiet` (e.g. under --json) or when stderr is not a terminal."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=quiet or not err_console.is_terminal,
    )


@contextmanager
def working(description: str, quiet: bool = False) -> Iterator[Any]:
    """A spinner with the step's description on stderr for work whose size is not known ahead (silent as
    `progress` is); yields `step(description)` to say what it does next."""
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err_console,
                  transient=True, disable=quiet or not err_console.is_terminal) as bar:
        task = bar.add_task(description, total=None)
        yield lambda text: bar.update(task, description=text)
