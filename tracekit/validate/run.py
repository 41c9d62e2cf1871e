"""Validate a captured run: predict the configuration of a `tracekit capture` folder on its hardware, diff the
prediction with the run's traces, and optionally refit — ingest the run, retrain on the whole store, predict again
and report the error before and after.

Raises InputError for a folder that is not a (successful) capture run, ModelError when retraining fails (the old
models stay), ConfigError from the prediction or the diff.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from extractors.kineto import ingest_paths
from predictor import ModelSet, predict_iteration as predict, train_models
from tracekit.capture.manifest import MANIFEST_NAME, Manifest
from tracekit.core.cluster import Cluster, default_cluster
from tracekit.core.errors import InputError, ModelError
from tracekit.core.store import SampleStore

from .diff import diff_inputs
from .traces import read_traces

if TYPE_CHECKING:
    from tracekit.compare import DiffReport
    from tracekit.core.config import TrainingConfig


def validate_run(run_dir: str | Path, models: ModelSet | None = None, models_path: str | Path | None = None,
                 refit: bool = False, store: str | Path | None = None, rank: int | None = None,
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Predict a `tracekit capture` run's configuration on its hardware and diff it with the run's traces.
    Returns {"report": DiffReport, "prediction": dict, "refit": {...} | None, "cluster_note": what was assumed of
    the cluster ('' when nothing)}. With `refit`, the run is ingested into `store`, models are retrained from the
    whole store into `models_path` (default `<store>/models`; a folder that holds no models yet is created, and
    "before" is the bundled models'), and the run is predicted again: "refit" has the error before and after.
    `progress(step)` hears of each step as it starts."""
    step = progress or (lambda _: None)
    run_dir = Path(run_dir)
    if not (run_dir / MANIFEST_NAME).is_file():
        raise InputError(run_dir, f"not a capture run folder (no {MANIFEST_NAME}); use `tracekit diff` for "
                                  "bare traces")
    manifest = Manifest.load(run_dir)
    if manifest.status != "ok":
        raise InputError(run_dir, f"the captured run failed (exit {manifest.exit_code}); nothing to validate")
    config = manifest.config()
    if config is None:
        raise InputError(run_dir, f"the manifest has no training configuration ({manifest.configuration_error})")
    paths = [run_dir / p for p in manifest.traces]
    if not paths:
        raise InputError(run_dir, "the run has no traces")
    step("reading the run's traces")
    traces = read_traces(paths)
    cluster, note = run_cluster(manifest, config)
    if models is None:  # a refit into a folder that holds no models yet starts from the bundled ones
        fresh = refit and models_path is not None and not (Path(models_path) / "index.json").is_file()
        models = ModelSet.load(None if fresh else models_path)
    step("predicting and diffing")
    prediction = predict(config, cluster, models).to_dict()
    report = diff_inputs(prediction, traces, rank=rank, config=config, predicted_source=f"{run_dir} (predicted)")
    result: dict[str, Any] = {"report": report, "prediction": prediction, "refit": None, "cluster_note": note}
    if refit:
        result["refit"] = _refit(paths, config, cluster, report, store, models_path, step)
    return result


def run_cluster(manifest: Manifest, config: TrainingConfig) -> tuple[Cluster, str]:
    """The Cluster a captured run ran on: its hardware's usual node (`default_cluster`, the rule of predict and
    search) with the run's ranks per node and node count, and the note saying what was assumed."""
    topology = manifest.topology or {}
    per_node = int(topology.get("ranks_per_node") or config.world_size)
    nodes = int(topology.get("nodes") or max(1, -(-config.world_size // per_node)))
    cluster, note = default_cluster(manifest.hardware, per_node)
    return dataclasses.replace(cluster, nodes=nodes), note


def _refit(paths: list[Path], config: TrainingConfig, cluster: Cluster, before: DiffReport,
           store: str | Path | None, models_path: str | Path | None,
           step: Callable[[str], None]) -> dict[str, Any]:
    """Ingest the run's traces into `store`, retrain every model on the whole store into `models_path`, predict
    the run again: samples added, where the models went, and the error before and after."""
    step("ingesting the run for --refit")
    sample_store = SampleStore(store)
    ingested = ingest_paths([str(p) for p in paths], sample_store)
    if ingested.errors:
        first = ingested.errors[0]
        raise InputError(first["path"], f"cannot ingest for --refit: {first['error']}")
    added = sum(int(t["samples_written"]) for t in ingested.traces)
    out = Path(models_path) if models_path is not None else sample_store.root / "models"
    try:
        step("retraining on the whole store")
        trained = train_models(sample_store.read(), out, provenance={"store": str(sample_store.root),
                                                                     "refit_on": [str(p) for p in paths]},
                               on_model=lambda meta: step(f"retraining: {meta['id']}"))
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - a trainer failure is reported as one line; the old models stay
        raise ModelError(f"{sample_store.root}: retraining failed ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}); the models in {out} are unchanged") from exc
    step("predicting with the new models")
    after_prediction = predict(config, cluster, ModelSet.load(out))
    real_s = before.iteration_time_s["real"]

    def errors(predicted_s: float) -> dict[str, float]:
        return {"predicted_s": predicted_s, "real_s": real_s, "error_s": predicted_s - real_s,
                "rel_error": (predicted_s - real_s) / real_s}

    return {"samples_added": added, "store": str(sample_store.root), "models": str(out), "models_trained":
            len(trained), "before": errors(before.iteration_time_s["predicted"]),
            "after": errors(float(after_prediction.iteration_time_s))}
