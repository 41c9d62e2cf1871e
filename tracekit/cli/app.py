"""The `tracekit` typer application that every command module registers on."""
import typer

app = typer.Typer(
    name="tracekit",
    help=(
        "Predict and explain the iteration time of distributed LLM training from profiler traces.\n\n"
        "Typical loop: tracekit capture → tracekit ingest → tracekit train → tracekit predict → tracekit validate."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
