"""Operator graph of a training iteration, regressors, schedule simulation (comparison with real traces is
`tracekit.compare`).

Public API (the application imports these names from `predictor`, never its modules):

- Models: ``ModelSet`` (``ModelSet.load(dir=None)``: the bundled set by default; ``predict(frame)`` answers operator
  rows with ``duration_us``, ``path`` (model | derived | transfer | roofline | lowp: a GEMM in a dtype its GPU has no
  model for, ``predictor.costs.physics.lowp_gemm``), ``out_of_range``, ``sources``; ConfigError for a GEMM dtype the
  part has no tensor cores for),
  ``train_models(samples, out, provenance, ...)``, ``bundled_models_dir()``; ``ape_stats`` / ``ape_summary`` (error
  summaries as `train` and `evaluate` report them).
- Transfer to GPUs without models: ``selected_primitives()`` (where leave-one-GPU-out favours it),
  ``source_weights(target, candidates, same_vendor=True)``.
- Prediction: ``predict_iteration(config, cluster, models, calibration=None) -> Prediction`` (the module
  ``predictor.predict``'s ``predict``; exported under another name because a package attribute named like one of
  its modules is replaced by that module once it is imported) and ``predict_many`` (one batched model call for many
  configurations); the contract is ``predictor.predict``'s docstring.
- Batches: ``predict_rows`` (the one path of `predict --batch` and `validate --published`, over the rows of a
  published table as `extractors.jobs` reads them: ``BatchRow``, ``read_rows``, ``parse_row``), ``output_row``,
  ``write_rows`` (a prediction back as a table row); ``Stack``, ``DEFAULT_STACK``, ``get_stack``,
  ``stack_of_arguments`` (software-stack profiles, `tracekit.core.stacks`).
- Constants: ``Calibration``, ``CALIBRATION_CONSTANTS``, ``load_calibration`` (`tracekit.core.calibration`),
  ``fit_calibration``.
- Search: ``search_configurations(base, gpus, cluster, models, ...) -> SearchResult`` (``predictor.sweeps.search``'s
  ``search``), ``SEARCH_KEYS``, ``split_name``, ``nothing_fits``;
  ``RayExecutor`` (the `ray` extra) runs its shards as Ray tasks.
- Predicted traces: ``write_traces(prediction, out_dir, ...)``, ``default_ranks(graph)``.

Names are resolved on first use (PEP 562), so importing one does not load pandas, XGBoost or Ray for the others:
`tracekit --help` and a cold `tracekit predict` stay fast.
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

#: Public name → (module, attribute); modules of this package are relative, tracekit's shared types absolute.
_EXPORTS = {
    "ModelSet": (".costs.learned.models", "ModelSet"),
    "train_models": (".costs.learned.training", "train_models"),
    "bundled_models_dir": (".costs.learned.models", "bundled_models_dir"),
    "ape_stats": (".costs.learned.regressor", "ape_stats"),
    "ape_summary": (".costs.learned.regressor", "ape_summary"),
    "selected_primitives": (".costs.physics.transfer", "selected_primitives"),
    "source_weights": (".costs.physics.transfer", "source_weights"),
    "Prediction": (".predict", "Prediction"),
    "predict_iteration": (".predict", "predict"),
    "predict_many": (".predict", "predict_many"),
    "predict_rows": (".batch", "predict_rows"),
    "output_row": (".report.batch_csv", "output_row"),
    "write_rows": (".report.batch_csv", "write_rows"),
    "Stack": ("tracekit.core.stacks", "Stack"),
    "DEFAULT_STACK": ("tracekit.core.stacks", "DEFAULT"),
    "get_stack": ("tracekit.core.stacks", "get_stack"),
    "stack_of_arguments": ("tracekit.core.stacks", "stack_of_arguments"),
    "Calibration": ("tracekit.core.calibration", "Calibration"),
    "CALIBRATION_CONSTANTS": ("tracekit.core.calibration", "CONSTANTS"),
    "load_calibration": ("tracekit.core.calibration", "load_calibration"),
    "fit_calibration": (".sweeps.calibration_fit", "fit_calibration"),
    "search_configurations": (".sweeps.search", "search"),
    "SEARCH_KEYS": (".sweeps.search", "SEARCH_KEYS"),
    "SearchResult": (".sweeps.search", "SearchResult"),
    "split_name": (".sweeps.search", "split_name"),
    "nothing_fits": (".sweeps.search", "nothing_fits"),
    "RayExecutor": (".sweeps.ray_executor", "RayExecutor"),
    "write_traces": (".report.trace_out", "write_traces"),
    "default_ranks": (".report.trace_out", "default_ranks"),
}
#: The public names (a literal, so linters and type checkers read it; tests check it against _EXPORTS).
__all__ = [
    "CALIBRATION_CONSTANTS", "Calibration", "DEFAULT_STACK", "ModelSet", "Prediction", "RayExecutor", "SEARCH_KEYS",
    "SearchResult", "Stack", "ape_stats", "ape_summary", "bundled_models_dir", "default_ranks", "fit_calibration",
    "get_stack", "load_calibration", "nothing_fits", "output_row", "predict_iteration", "predict_many",
    "predict_rows", "search_configurations", "selected_primitives", "source_weights", "split_name",
    "stack_of_arguments", "train_models", "write_rows", "write_traces",
]

if TYPE_CHECKING:
    from tracekit.core.calibration import CONSTANTS as CALIBRATION_CONSTANTS, Calibration, load_calibration
    from tracekit.core.stacks import DEFAULT as DEFAULT_STACK, Stack, get_stack, stack_of_arguments

    from .batch import predict_rows
    from .costs.learned.models import ModelSet, bundled_models_dir
    from .costs.learned.regressor import ape_stats, ape_summary
    from .costs.learned.training import train_models
    from .costs.physics.transfer import selected_primitives, source_weights
    from .predict import Prediction, predict as predict_iteration, predict_many
    from .report.batch_csv import output_row, write_rows
    from .report.trace_out import default_ranks, write_traces
    from .sweeps.calibration_fit import fit_calibration
    from .sweeps.ray_executor import RayExecutor
    from .sweeps.search import SEARCH_KEYS, SearchResult, nothing_fits, search as search_configurations, split_name


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'predictor' has no attribute {name!r}") from None
    value = getattr(import_module(module, __name__), attribute)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return __all__
