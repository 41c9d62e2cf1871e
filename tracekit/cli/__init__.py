"""The `tracekit` command. Each subcommand lives in its own module and registers itself on `app`.

Command modules keep heavy imports (pandas, xgboost, torch) inside the command functions so that
`tracekit --help` and cold `tracekit predict` start fast.
"""
import gc
import sys
from importlib import import_module

from .app import app

COMMAND_MODULES = (
    "ingest", "import_samples", "train", "evaluate", "models", "predict", "diff", "validate",
    "megatron_args", "capture", "sample", "calibrate", "search",
)

for _name in COMMAND_MODULES:
    import_module(f"{__name__}.{_name}")


def main() -> None:
    # The command's process: a collection every 50,000 new objects instead of every 700. Start-up's imports and a
    # trace's parsing make many objects and few cycles; the default threshold spends ~10% of a short command's CPU
    # walking them (benchmarks/ingest.py, whole command).
    gc.set_threshold(50_000, 20, 100)
    import click

    try:
        code = app(standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:  # `tracekit` alone: the help
        exc.show()
        sys.exit(exc.exit_code)
    except click.UsageError as exc:  # a wrong command, option or value: one line, as every error of tracekit's
        where = f" (see `{exc.ctx.command_path} -h`)" if exc.ctx is not None else ""
        click.echo(f"error: {exc.format_message()}{where}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
