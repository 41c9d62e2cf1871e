"""Diff a prediction with real traces: read both sides (`traces.py`), summarize them with `tracekit.compare`, let
HTA measure the real side's breakdown where it can (`hta.py`), and compare (`tracekit.compare.diff_sides`).

The predicted side is a `tracekit predict --trace-out` folder or its trace files, or a prediction (`--json` file or
dict); the real side is a run's trace files. Returns a `tracekit.compare.DiffReport`; raises ConfigError when the
two cannot be the same job and InputError for unreadable inputs.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from tracekit.compare import (
    check_same_split,
    diff_sides,
    summarize_prediction,
    summarize_traces,
    trace_groups,
)
from tracekit.core.errors import InputError

from .hta import apply_hta
from .traces import manifest_config, process_groups, read_prediction, read_traces

if TYPE_CHECKING:
    from extractors.kineto import KinetoTrace
    from tracekit.compare import DiffReport
    from tracekit.core.config import TrainingConfig


def diff_paths(predicted: str | Path, real: Iterable[str | Path], rank: int | None = None,
               config: TrainingConfig | None = None, use_hta: bool = True) -> DiffReport:
    """DiffReport of a prediction (predicted-trace folder/files or prediction JSON) against real trace files."""
    predicted = Path(predicted)
    prediction = read_prediction(predicted)
    real_paths = [Path(p) for p in real]
    if config is None:
        config = manifest_config(real_paths)
    return diff_inputs(prediction if prediction is not None else read_traces([predicted]), read_traces(real_paths),
                       rank=rank, config=config, use_hta=use_hta, predicted_source=str(predicted))


def diff_inputs(predicted: dict[str, Any] | list[KinetoTrace], real_traces: list[KinetoTrace],
                rank: int | None = None, config: TrainingConfig | None = None, use_hta: bool = True,
                predicted_source: str = "prediction", predicted_traces: list[KinetoTrace] | None = None
                ) -> DiffReport:
    """DiffReport of a prediction dict or parsed predicted traces against parsed real traces. `config`: the run's
    TrainingConfig when known (validate passes the manifest's); it maps ranks to pipeline stages and is checked
    against both sides (else the prediction's own configuration is used). `predicted_traces`: with a prediction
    dict, the traces written of it (`predictor.report.trace_out`): the report's predicted timeline and per-layer times
    come from them, every other number from the dict."""
    config_dict = config.to_dict() if config is not None else None
    if isinstance(predicted, dict):
        if config_dict is None:
            config_dict = predicted.get("config")
        else:
            check_same_split(predicted.get("config") or {}, config_dict)
    real_groups = process_groups(real_traces)
    world = None
    if config_dict is not None:
        pp = int(config_dict.get("pipeline_model_parallel_size") or 1)
        world = int(config_dict.get("world_size") or 0) or None
    elif isinstance(predicted, dict):  # a prediction JSON states its configuration
        raise InputError(predicted_source, "the prediction states no configuration")
    else:
        pp = pipeline_size([real_traces, predicted], [real_groups, process_groups(predicted)])
    # Megatron's rank order puts pp slowest: a stage is world/pp consecutive ranks. The configuration's world size
    # decides it (traces of a few ranks, or predicted traces of one rank per stage, do not tell the world)
    per_stage = max(world // pp, 1) if world else None
    real_side = summarize_traces(real_traces, "real", pp=pp, ranks_per_stage=per_stage, process_groups=real_groups)
    per_stage = per_stage or max(int(real_side.world_size or len(real_traces)) // pp, 1)
    if isinstance(predicted, dict):
        drawn = None if not predicted_traces else summarize_traces(
            predicted_traces, "predicted", pp=pp, ranks_per_stage=per_stage, drop_warmup=False)
        predicted_side = summarize_prediction(predicted, real_side.ranks, per_stage, drawn)
    else:
        predicted_side = summarize_traces(predicted, "predicted", pp=pp, ranks_per_stage=per_stage,
                                          drop_warmup=False, process_groups=process_groups(predicted))
    predicted_side.source = predicted_source
    if use_hta:
        apply_hta(real_side, real_traces, pp)
    return diff_sides(predicted_side, real_side, rank=rank, config=config_dict)


def pipeline_size(trace_sets: list[list[KinetoTrace]], groups: list[dict[str, int]]) -> int:
    """Pipeline stages of traces without a configuration: a PIPELINE_MODEL_PARALLEL_GROUP's size in either side's
    process groups or collectives, else 1."""
    for traces, named in zip(trace_sets, groups):
        sizes = dict(named)
        sizes.update(trace_groups(traces)[0])
        if sizes.get("PIPELINE_MODEL_PARALLEL_GROUP"):
            return int(sizes["PIPELINE_MODEL_PARALLEL_GROUP"])
    return 1
