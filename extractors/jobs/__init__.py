"""Jobs as people and vendors write them → settings, cluster and stack: the only code that knows a table's columns and
cells, a row's notes, a vendor's recipes and launchers, Megatron's command lines and logs, torchtitan TOML and
Composer YAML. What it hands on is tracekit's own (`TrainingConfig`, `Cluster`, a stack profile's name); nothing
here prices anything (that is `predictor`'s).

Modules, one input each:

- `megatron`: a Megatron command line, the arguments block of its log, the iteration times it reports, a YAML/JSON
  file of Megatron argument names → TrainingConfig.
- `torchtitan`, `composer`, `files`: torchtitan TOML jobs, llm-foundry/Composer YAML jobs, and telling the job files
  apart from Megatron configurations (`read_job`).
- `table`, `rows`: published end-to-end tables (the corpus's e2e CSVs): columns and cells, and a row as a job
  (`parse_row` → `BatchRow`); `notes` what a row's notes and launch line say; `sharding_cells` its FSDP/ZeRO cells.
- `bridge/`: Megatron-Bridge's model providers, recipe presets, precision recipes, performance launchers and the
  Slurm segments its launcher places a job in on NVL72 (`launched_cluster`).

Public API (names resolved on first use, PEP 562, so a command that reads one kind of input loads only its reader):
``BatchRow``, ``read_rows``, ``parse_row``, ``launched_cluster``, ``read_job``, ``config_from_argv``,
``config_from_log``, ``config_from_file``, ``parse_megatron_argv``, ``parse_arguments_block``,
``parse_iteration_times_ms``.
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "BatchRow": ".rows", "parse_row": ".rows", "read_rows": ".table", "launched_cluster": ".bridge.segments",
    "read_job": ".files", "config_from_argv": ".megatron", "config_from_log": ".megatron",
    "config_from_file": ".megatron", "parse_megatron_argv": ".megatron", "parse_arguments_block": ".megatron",
    "parse_iteration_times_ms": ".megatron",
}
__all__ = [
    "BatchRow", "config_from_argv", "config_from_file", "config_from_log", "launched_cluster", "parse_arguments_block",
    "parse_iteration_times_ms", "parse_megatron_argv", "parse_row", "read_job", "read_rows",
]

if TYPE_CHECKING:
    from .bridge.segments import launched_cluster
    from .files import read_job
    from .megatron import (
        config_from_argv,
        config_from_file,
        config_from_log,
        parse_arguments_block,
        parse_iteration_times_ms,
        parse_megatron_argv,
    )
    from .rows import BatchRow, parse_row
    from .table import read_rows


def __getattr__(name: str) -> Any:
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'extractors.jobs' has no attribute {name!r}") from None
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
