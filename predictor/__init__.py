"""Operator graph of a training iteration, regressors, schedule simulation (comparison with real traces is
`tracekit.compare`).

Public API (the application imports these names from `predictor`, never its modules):

- Models: ``ModelSet`` (``ModelSet.load(dir=None)``: the bundled set by default; ``predict(frame)`` answers operator
  rows with ``duration_us``, ``path`` (model | derived | transfer | roofline | lowp: a GEMM in a dtype its GPU has no
  model for, ``predictor.lowp_gemm``), ``out_of_range``, ``sources``; ConfigError for a GEMM dtype the part has no
  tensor cores for),
  ``train_models(samples, out, provenance, ...)``, ``bundled_models_dir()``; ``ape_stats`` / ``ape_summary`` (error
  summaries as `train` and `evaluate` report them).
- Transfer to GPUs without models: ``selected_primitives()`` (where leave-one-GPU-out favours it),
  ``source_weights(target, candidates, same_vendor=True)``.
- Prediction: ``predict_iteration(config, cluster, models, calibration=None) -> Prediction`` (the module
  ``predictor.predict``'s ``predict``; exported under another name because a package attribute named like one of
  its modules is replaced by that module once it is imported) and ``predict_many`` (one batched model call for many
  configurations); the contract is ``predictor.predict``'s docstring.
- Inputs: ``BatchRow``, ``read_rows``, ``parse_row``, ``predict_rows`` (the one path of `predict --batch` and
  `validate --published`), ``output_row``, ``write_rows`` (published e2e tables, in and out); ``Stack``,
  ``DEFAULT_STACK``, ``get_stack``, ``stack_of_arguments`` (software-stack profiles); ``launched_cluster`` (the
  cluster as a stack's launcher places the job: Megatron-Bridge's Slurm segments on NVL72, ``predictor.job_segments``).
- Constants: ``Calibration``, ``CALIBRATION_CONSTANTS``, ``load_calibration``, ``fit_calibration``.
- Search: ``search_configurations(base, gpus, cluster, models, ...) -> SearchResult`` (``predictor.search``'s
  ``search``), ``SEARCH_KEYS``, ``split_name``, ``nothing_fits``;
  ``RayExecutor`` (the `ray` extra) runs its shards as Ray tasks.
- Predicted traces: ``write_traces(prediction, out_dir, ...)``, ``default_ranks(graph)``.

Names are resolved on first use (PEP 562), so importing one does not load pandas, XGBoost or Ray for the others:
`tracekit --help` and a cold `tracekit predict` stay fast.
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

#: Public name → (module, attribute).
_EXPORTS = {
    "ModelSet": ("models", "ModelSet"),
    "train_models": ("training", "train_models"),
    "bundled_models_dir": ("models", "bundled_models_dir"),
    "ape_stats": ("regressor", "ape_stats"),
    "ape_summary": ("regressor", "ape_summary"),
    "selected_primitives": ("transfer", "selected_primitives"),
    "source_weights": ("transfer", "source_weights"),
    "Prediction": ("predict", "Prediction"),
    "predict_iteration": ("predict", "predict"),
    "predict_many": ("predict", "predict_many"),
    "BatchRow": ("batch", "BatchRow"),
    "parse_row": ("batch", "parse_row"),
    "predict_rows": ("batch", "predict_rows"),
    "read_rows": ("batch", "read_rows"),
    "output_row": ("batch", "output_row"),
    "write_rows": ("batch", "write_rows"),
    "Stack": ("stack", "Stack"),
    "DEFAULT_STACK": ("stack", "DEFAULT"),
    "get_stack": ("stack", "get_stack"),
    "stack_of_arguments": ("stack", "stack_of_arguments"),
    "Calibration": ("calibration", "Calibration"),
    "CALIBRATION_CONSTANTS": ("calibration", "CONSTANTS"),
    "load_calibration": ("calibration", "load_calibration"),
    "fit_calibration": ("calibration_fit", "fit_calibration"),
    "search_configurations": ("search", "search"),
    "SEARCH_KEYS": ("search", "SEARCH_KEYS"),
    "SearchResult": ("search", "SearchResult"),
    "split_name": ("search", "split_name"),
    "nothing_fits": ("search", "nothing_fits"),
    "RayExecutor": ("ray_executor", "RayExecutor"),
    "write_traces": ("trace_out", "write_traces"),
    "default_ranks": ("trace_out", "default_ranks"),
    "launched_cluster": ("job_segments", "launched_cluster"),
}
#: The public names (a literal, so linters and type checkers read it; tests check it against _EXPORTS).
__all__ = [
    "BatchRow", "CALIBRATION_CONSTANTS", "Calibration", "DEFAULT_STACK", "ModelSet", "Prediction", "RayExecutor",
    "SEARCH_KEYS", "SearchResult", "Stack", "ape_stats", "ape_summary", "bundled_models_dir", "default_ranks",
    "fit_calibration", "get_stack", "launched_cluster", "load_calibration", "nothing_fits", "output_row", "parse_row",
    "predict_iteration", "predict_many", "predict_rows", "read_rows", "search_configurations", "selected_primitives",
    "source_weights", "split_name", "stack_of_arguments", "train_models", "write_rows", "write_traces",
]

if TYPE_CHECKING:
    from .batch import BatchRow, output_row, parse_row, predict_rows, read_rows, write_rows
    from .calibration import CONSTANTS as CALIBRATION_CONSTANTS, Calibration, load_calibration
    from .calibration_fit import fit_calibration
    from .job_segments import launched_cluster
    from .models import ModelSet, bundled_models_dir
    from .predict import Prediction, predict as predict_iteration, predict_many
    from .ray_executor import RayExecutor
    from .regressor import ape_stats, ape_summary
    from .search import SEARCH_KEYS, SearchResult, nothing_fits, search as search_configurations, split_name
    from .stack import DEFAULT as DEFAULT_STACK, Stack, get_stack, stack_of_arguments
    from .trace_out import default_ranks, write_traces
    from .training import train_models
    from .transfer import selected_primitives, source_weights


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'predictor' has no attribute {name!r}") from None
    value = getattr(import_module(f".{module}", __name__), attribute)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return __all__
