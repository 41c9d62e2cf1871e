"""The `tracekit` command. Each subcommand lives in its own module and registers itself on `app`.

Command modules keep heavy imports (pandas, xgboost, torch) inside the command functions so that
`tracekit --help` and cold `tracekit predict` start fast.
"""
from importlib import import_module

from .app import app

COMMAND_MODULES = (
    "ingest", "import_samples", "train", "evaluate", "models", "predict", "diff", "validate",
    "megatron_args", "capture", "sample", "calibrate", "search",
)

for _name in COMMAND_MODULES:
    import_module(f"{__name__}.{_name}")


def main() -> None:
    app()
