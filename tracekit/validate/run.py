"""Validate a captured run: predict the configuration of a `tracekit capture` folder on its hardware, diff the
prediction with the run's traces, and optionally refit — ingest the run, retrain on the whole store, predict again
and report the error before and after.

The prediction's own traces (`predictor.report.trace_out`, one per pipeline stage) are written too — into `trace_dir`,
or a temporary folder when none is given — and read back for the report's predicted timeline and per-layer times. A
model set without models of the run's hardware is named in the report's first warning, with the commands that
make them.

Raises InputError for a folder that is not a (successful) capture run, ModelError when retraining fails (the old
models stay), ConfigError from the prediction or the diff.
"""
from __future__ import annotations

import dataclasses
import statistics
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from extractors.kineto import ingest_paths
from predictor import ModelSet, predict_iteration as predict, train_models
from predictor.report.trace_out import write_traces
from tracekit.capture.manifest import MANIFEST_NAME, Manifest
from tracekit.core.cluster import Cluster, default_cluster
from tracekit.core.cpu_id import same_cpu
from tracekit.core.errors import InputError, ModelError
from tracekit.core.hashing import file_digest
from tracekit.core.store import SampleStore

from .diff import diff_inputs
from .traces import read_traces

if TYPE_CHECKING:
    from tracekit.compare import DiffReport
    from tracekit.core.config import TrainingConfig


def validate_run(run_dir: str | Path, models: ModelSet | None = None, models_path: str | Path | None = None,
                 refit: bool = False, store: str | Path | None = None, rank: int | None = None,
                 trace_dir: str | Path | None = None, progress: Callable[[str], None] | None = None,
                 refit_out: str | Path | None = None) -> dict[str, Any]:
    """Predict a `tracekit capture` run's configuration on its hardware and diff it with the run's traces.
    Returns {"report": DiffReport, "prediction": dict, "predicted_traces": [paths] | None, "unprofiled": {...} |
    None, "refit": {...} | None, "cluster_note": what was assumed of the cluster ('' when nothing)}. `trace_dir`:
    where the prediction's traces are kept (Perfetto, `tracekit diff`); without it they are read back from a
    temporary folder and not kept. With `refit`, the run is ingested into `store`, models are retrained from the
    whole store into a folder of their own, `refit_out` (default: `<models_path>-refit` beside the models given, or
    `<store>/models` when none were; never the folder the models were read from, which stays as it was), and the run
    is predicted again: "refit" has the error before and after and where the new models are. `progress(step)` hears
    of each step as it starts."""
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
    if models is None:
        models = ModelSet.load(models_path)
    out = refit_folder(models, models_path, store, refit_out) if refit else None
    step("predicting and diffing")
    predicted = predict(config, cluster, models)
    prediction = predicted.to_dict()
    with tempfile.TemporaryDirectory(prefix="tracekit-validate-") as scratch:
        written = write_traces(predicted, trace_dir if trace_dir is not None else scratch)
        report = diff_inputs(prediction, traces, rank=rank, config=config, predicted_source=f"{run_dir} (predicted)",
                             predicted_traces=read_traces(written))
    missing = missing_models(models, manifest.hardware, models_path, refit)
    if missing:
        report.warnings.insert(0, missing)
    result: dict[str, Any] = {"report": report, "prediction": prediction, "refit": None, "cluster_note": note,
                              "predicted_traces": [str(p) for p in written] if trace_dir is not None else None,
                              "unprofiled": unprofiled(manifest, predicted.iteration_time_s)}
    if out is not None:
        result["refit"] = _refit(paths, config, cluster, report, store, out, step)
        if result["unprofiled"] is not None:
            after = result["refit"]["after"]["predicted_s"]
            real = result["unprofiled"]["real_s"]
            result["unprofiled"].update(after_predicted_s=after, after_rel_error=(after - real) / real)
    return result


def refit_folder(models: ModelSet, models_path: str | Path | None, store: str | Path | None,
                 refit_out: str | Path | None) -> Path:
    """Where a refit writes its models: `refit_out`, else `<models_path>-refit` beside the models given, else
    `<store>/models`. InputError when that is the folder the models were read from: a refit keeps them (running
    validate again with them predicts what it did)."""
    if refit_out is not None:
        out = Path(refit_out)
    elif models_path is not None:
        given = Path(models_path)
        out = given.with_name(f"{given.name}-refit")
    else:
        out = SampleStore(store).root / "models"
    if out.resolve() == Path(models.path).resolve():
        raise InputError(out, "is the folder of the models validate predicts with; a refit writes its models to "
                              "another (--refit-out DIR) and keeps those")
    return out


def unprofiled(manifest: Manifest, predicted_s: float) -> dict[str, Any] | None:
    """The prediction against the run's iterations that ran without the profiler (its log's times; the first
    iteration, warm-up, left out, as `tracekit calibrate` does): the profiled steps the diff compares carry the
    profiler's own overhead, which on a CPU run is large. None with fewer than 3 such iterations."""
    times = manifest.unprofiled_iteration_times_ms()
    if times and manifest.iterations and manifest.iterations[0] not in manifest.profiled_iterations:
        times = times[1:]
    if len(times) < 3:
        return None
    real = statistics.median(times) / 1e3
    return {"real_s": real, "iterations": len(times), "predicted_s": predicted_s,
            "rel_error": (predicted_s - real) / real}


def missing_models(models: ModelSet, hardware: str, models_path: str | Path | None, refit: bool = False
                   ) -> str | None:
    """One line when `models` holds no model of `hardware`: what the prediction then is, and the commands that make
    the models (or, with `refit`, that the refit makes them); None when it holds some."""
    if hardware in models.hardware_ids() or same_cpu(hardware, list(models.hardware_ids())) is not None:
        return None
    where = models_path if models_path is not None and (Path(models_path) / "index.json").is_file() else \
        "the bundled models"
    device = "cpu" if hardware.startswith("cpu") else "cuda"
    if refit:
        return (f"no models of {hardware} in {where}: the prediction before the refit is a roofline guess, not a "
                f"trained model; the refit trains them on the store (`tracekit sample --device {device} --store S` "
                f"adds micro-benchmarks of this hardware to it)")
    return (f"no models of {hardware} in {where}: the prediction is a roofline guess, not a trained model; make "
            f"them with `tracekit sample --device {device} --store S` then `tracekit train --store S --models-out M` "
            f"and validate with `--models M`, or retrain on this run with `--refit`")


def run_cluster(manifest: Manifest, config: TrainingConfig) -> tuple[Cluster, str]:
    """The Cluster a captured run ran on: its hardware's usual node (`default_cluster`, the rule of predict and
    search) with the run's ranks per node and node count, and the note saying what was assumed."""
    topology = manifest.topology or {}
    per_node = int(topology.get("ranks_per_node") or config.world_size)
    nodes = int(topology.get("nodes") or max(1, -(-config.world_size // per_node)))
    cluster, note = default_cluster(manifest.hardware, per_node)
    return dataclasses.replace(cluster, nodes=nodes), note


def _refit(paths: list[Path], config: TrainingConfig, cluster: Cluster, before: DiffReport,
           store: str | Path | None, out: Path, step: Callable[[str], None]) -> dict[str, Any]:
    """Ingest the run's traces into `store`, retrain every model on the whole store into `out` (a folder other than
    the models the run was first predicted with), predict the run again: samples added, where the models went, and
    the error before and after."""
    step("ingesting the run for --refit")
    sample_store = SampleStore(store)
    ingested = ingest_paths([str(p) for p in paths], sample_store)
    if ingested.errors:
        first = ingested.errors[0]
        raise InputError(first["path"], f"cannot ingest for --refit: {first['error']}")
    added = sum(int(t["samples_written"]) for t in ingested.traces)
    sources = sample_store.sources()
    run_ids = {file_digest(p) for p in paths}
    run_samples = sum(int(meta.get("rows", 0)) for key, meta in sources.items() if key in run_ids)
    store_samples = sum(int(meta.get("rows", 0)) for meta in sources.values())
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

    return {"samples_added": added, "run_samples": run_samples, "store_samples": store_samples,
            "store": str(sample_store.root), "models": str(out), "models_trained":
            len(trained), "before": errors(before.iteration_time_s["predicted"]),
            "after": errors(float(after_prediction.iteration_time_s))}
