"""What every command shares: one-line errors with exit codes, JSON output, progress bars."""
from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, NoReturn

import typer

from tracekit.core.errors import TracekitError

if TYPE_CHECKING:  # rich is imported where something is printed through it: a command run from a script may not
    from rich.console import Console
    from rich.progress import Progress


class LazyConsole:
    """A rich Console made on its first use. Importing rich.console is ~5% of a command's start-up, and a command
    run from a script (`tracekit ingest --json`) may print nothing through it."""

    def __init__(self, make: Callable[[], Console]):
        self._make = make
        self._console: Console | None = None

    def get(self) -> Console:
        """The Console itself (what rich's own classes take)."""
        if self._console is None:
            self._console = self._make()
        return self._console

    def print(self, *objects: Any, **options: Any) -> None:
        self.get().print(*objects, **options)

    @property
    def is_terminal(self) -> bool:
        return self.get().is_terminal


def _stdout_console() -> Console:
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=400, no_color=True, highlight=False)


def _stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


#: Results on stdout. Piped or redirected, rich would wrap tables at 80 columns; there they are drawn at full width
#: (one line per row, for grep and less -S) and without colour.
console = LazyConsole(_stdout_console)
#: Warnings, errors and progress on stderr.
err_console = LazyConsole(_stderr_console)

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


def shows_progress(quiet: bool = False) -> bool:
    """Whether `progress(quiet)` draws anything: not with `quiet` (e.g. under --json) nor when stderr is not a
    terminal."""
    return not quiet and err_console.is_terminal


def progress(quiet: bool = False) -> Progress:
    """A progress bar on stderr; silent with `quiet` (e.g. under --json) or when stderr is not a terminal."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console.get(),
        transient=True,
        disable=not shows_progress(quiet),
    )


@contextmanager
def working(description: str, quiet: bool = False) -> Iterator[Any]:
    """A spinner with the step's description on stderr for work whose size is not known ahead (silent as
    `progress` is); yields `step(description)` to say what it does next."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err_console.get(),
                  transient=True, disable=not shows_progress(quiet)) as bar:
        task = bar.add_task(description, total=None)
        yield lambda text: bar.update(task, description=text)
