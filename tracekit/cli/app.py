"""The `tracekit` typer application that every command module registers on."""
from typing import Optional

import typer

app = typer.Typer(
    name="tracekit",
    help=(
        "Predict and explain the iteration time of distributed LLM training from profiler traces.\n\n"
        "Typical loop: tracekit capture → tracekit ingest → tracekit train → tracekit predict → "
        "tracekit validate; tracekit search for the best configuration of a job."
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    # click's own help layout: an option's names, then its help wrapped in the rest of the line (at 80 columns too);
    # rich's panels gave six columns their share of 80 and cut option names ("--gpus,--world-s…")
    rich_markup_mode=None,
    # click names the close command itself ("Did you mean 'predict'?"); typer's suggestion said it a second time
    suggest_commands=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"tracekit {version('tracekit')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("tracekit (not installed)")
        raise typer.Exit()


@app.callback()
def main(
    show_version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True,
                                                help="Print tracekit's version and exit."),
) -> None:
    """The options every command shares (the app's help text is the Typer's)."""
