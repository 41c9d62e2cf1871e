"""Check predictions against measurements: diff a prediction with real traces, validate a captured run
(predict its configuration, diff, optionally refit on it), and score predictions of published end-to-end results.

This is application code: it reads files (traces via `extractors.kineto`, predictions, manifests, CSVs), calls
`predictor.predict` and `tracekit.compare`, and returns plain dicts / DiffReports for the CLI and the HTML page.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from tracekit.core.errors import ConfigError, InputError, ModelError

REQUIRED_COLUMNS = ("hardware_gpu", "iteration_time_s")


# -- published end-to-end results -------------------------------------------------------------------------------
@dataclass
class PublishedRow:
    """One measured end-to-end result: its CSV line, configuration and cluster (or why it cannot be predicted),
    and the measured iteration time."""

    line: int  # line in the CSV file (the header is line 1)
    ref: str
    config: Any  # TrainingConfig | None
    cluster: Any  # Cluster | None
    measured_s: float
    error: str | None
    parsed: Any = None  # the predictor.batch.BatchRow it was read as: its stack (and constants), what was assumed


def parse_hardware_map(items: Iterable[str]) -> dict[str, str]:
    """`TEXT=HARDWARE_ID` pairs: a row whose hardware_gpu contains TEXT (case-insensitive) is predicted on
    HARDWARE_ID."""
    out: dict[str, str] = {}
    for item in items:
        text, eq, hardware = item.partition("=")
        if not eq or not text.strip() or not hardware.strip():
            raise ConfigError(f"--hardware-map expects TEXT=HARDWARE_ID, got {item!r}")
        out[text.strip()] = hardware.strip()
    return out


def parse_sets(items: Iterable[str]) -> dict[str, str]:
    """`KEY=VALUE` Megatron settings (`--set` of predict and validate); a key tracekit does not read is an error
    (with a suggestion), not an override silently without effect."""
    from tracekit.core.config import check_settings

    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    try:
        check_settings(out)
    except ConfigError as exc:
        raise ConfigError(f"--set: {exc}") from exc
    return out


def read_published(path: str | Path, hardware_map: dict[str, str] | None = None,
                   overrides: dict[str, Any] | None = None) -> list[PublishedRow]:
    """Rows of an e2e CSV (the `predictor.batch` schema plus the measured `iteration_time_s`). Configurations and
    clusters are parsed as `tracekit predict --batch` does; `hardware_map` picks the hardware id of rows by a
    substring of their hardware_gpu text (else it is derived from that text)."""
    from predictor.batch import parse_row, read_rows

    path = Path(path)
    header, cells = read_rows(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise InputError(path, f"not an e2e results CSV: lacks column(s) {', '.join(missing)}")
    rows = []
    for i, row in enumerate(cells):
        line = i + 2
        try:
            measured = float(row["iteration_time_s"])
        except ValueError:
            raise InputError(path, f"line {line}: iteration_time_s {row['iteration_time_s']!r} is not a number")
        if not measured > 0:
            raise InputError(path, f"line {line}: iteration_time_s must be positive, got {measured}")
        text = row.get("hardware_gpu", "")
        hardware = next((hw for key, hw in (hardware_map or {}).items() if key.lower() in text.lower()), None)
        parsed = parse_row(row, line, hardware, None, overrides)
        rows.append(PublishedRow(line, row.get("row_ref") or f"line {line}", parsed.config, parsed.cluster,
                                 measured, parsed.error, parsed))
    return rows


def validate_published(path: str | Path, hardware_map: dict[str, str] | None = None, models: Any = None,
                       overrides: dict[str, Any] | None = None, calibration: Any = None,
                       on_batch=None, batch: int = 64) -> dict[str, Any]:
    """Predict every row of a published e2e CSV and score it: {"rows" (worst first), "mape", "median_ape",
    "p90_ape", "failed"}. `models`: a ModelSet (default: the bundled models); `overrides`: Megatron settings for
    every row (like `predict --set`); `calibration`: a predictor Calibration used instead of each row's stack
    profile constants. Rows are predicted in batches with
    `predict_many`; `on_batch(rows_done)` reports progress. A row that cannot be predicted is listed under
    "failed" and left out of the statistics."""
    from predictor.models import ModelSet
    from predictor.predict import predict_many
    from predictor.regressor import ape_stats

    rows = read_published(path, hardware_map, overrides)
    models = models if models is not None else ModelSet.load()
    out_rows: list[dict[str, Any]] = []
    failed = [{"line": r.line, "ref": r.ref, "error": r.error} for r in rows if r.error]
    good = [r for r in rows if not r.error]
    for first in range(0, len(good), batch):
        chunk = good[first:first + batch]
        results = predict_many([r.config for r in chunk], [r.cluster for r in chunk], models,
                               [calibration or r.parsed.calibration for r in chunk])
        for row, prediction in zip(chunk, results):
            if isinstance(prediction, Exception):
                failed.append({"line": row.line, "ref": row.ref, "error": str(prediction)})
                continue
            predicted = float(prediction.iteration_time_s)
            c = row.config
            out_rows.append({
                "line": row.line, "ref": row.ref, "hardware": row.cluster.hardware,
                "hardware_used": prediction.hardware_used, "cluster": prediction.cluster.name,
                "stack": row.parsed.stack.name, "notes": list(row.parsed.notes), "world_size": c.world_size,
                "tp": c.tp, "pp": c.pp,
                "dp": c.dp, "micro_batch_size": c.micro_batch_size, "global_batch_size": c.global_batch_size,
                "num_layers": c.num_layers, "hidden_size": c.hidden_size,
                "measured_s": row.measured_s, "predicted_s": predicted, "error_s": predicted - row.measured_s,
                "ape": abs(predicted - row.measured_s) / row.measured_s,
            })
        if on_batch:
            on_batch(len(chunk))
    if not out_rows:
        raise InputError(path, f"no row could be predicted (line {failed[0]['line']}: {failed[0]['error']})")
    summary = ape_stats([r["predicted_s"] for r in out_rows], [r["measured_s"] for r in out_rows])
    out_rows.sort(key=lambda r: -r["ape"])
    failed.sort(key=lambda f: f["line"])
    return {"file": str(path), "rows": out_rows, **summary, "failed": failed}


# -- diff of files ----------------------------------------------------------------------------------------------
PREDICTION_MAX_BYTES = 50 << 20  # a prediction JSON is small; bigger .json files are traces


def trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """Trace files named by the paths: files as given, folders searched (recursively) for *.json / *.json.gz,
    skipping tracekit's own JSON (manifest.json, prediction.json)."""
    from extractors.kineto.ingest import CAPTURE_MANIFEST
    from extractors.kineto.load import is_trace_name

    own = (CAPTURE_MANIFEST, "prediction.json")
    out: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if is_trace_name(p) and p.name.lower() not in own)
            if not found:
                raise InputError(path, "no trace files (*.json, *.json.gz) in this folder")
            out += found
        elif path.is_file():
            out.append(path)
        else:
            raise InputError(path, "no such file or folder")
    return out


def read_traces(paths: Iterable[str | Path]) -> list[Any]:
    """Parse every trace file (extractors.kineto.read_trace); InputError names a file that is not a trace."""
    from extractors.kineto import read_trace

    return [read_trace(path) for path in trace_files(paths)]


def process_groups(traces: list[Any]) -> dict[str, int]:
    """Process-group description → size from the traces' `distributedInfo.pg_config` (PyTorch ≥ 2.3)."""
    from extractors.kineto.load import open_trace

    out: dict[str, int] = {}
    for trace in traces:
        info = open_trace(trace.path).distributed_info or {}
        for group in info.get("pg_config") or []:
            if isinstance(group, dict) and group.get("pg_desc") and group.get("pg_size"):
                out[str(group["pg_desc"])] = int(group["pg_size"])
    return out


def read_prediction(path: Path) -> dict[str, Any] | None:
    """The prediction dict in a `tracekit predict --json` file; None when the file is something else."""
    if not path.is_file() or not path.name.lower().endswith(".json") or path.stat().st_size > PREDICTION_MAX_BYTES:
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(path, f"not valid JSON ({exc})") from exc
    if isinstance(data, dict) and isinstance(data.get("predictions"), list) and len(data["predictions"]) == 1:
        data = data["predictions"][0]
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if isinstance(data, dict) and "iteration_time_s" in data:
        return data
    if isinstance(data, dict) and "traceEvents" in data:
        return None
    raise InputError(path, "neither a tracekit prediction (no iteration_time_s) nor a Kineto trace")


def diff_paths(predicted: str | Path, real: Iterable[str | Path], rank: int | None = None,
               config: Any = None, use_hta: bool = True):
    """DiffReport of a prediction (predicted-trace folder/files or prediction JSON) against real trace files."""
    predicted = Path(predicted)
    prediction = read_prediction(predicted)
    real = [Path(p) for p in real]
    if config is None:
        config = manifest_config(real)
    return diff_inputs(prediction if prediction is not None else read_traces([predicted]), read_traces(real),
                       rank=rank, config=config, use_hta=use_hta, predicted_source=str(predicted))


def diff_inputs(predicted: dict[str, Any] | list[Any], real_traces: list[Any], rank: int | None = None,
                config: Any = None, use_hta: bool = True, predicted_source: str = "prediction"):
    """DiffReport of a prediction dict or parsed predicted traces against parsed real traces. `config`: the run's
    TrainingConfig when known (validate passes the manifest's); it maps ranks to pipeline stages and is checked
    against both sides (else the prediction's own configuration is used)."""
    from tracekit.compare import check_same_split, diff_sides, summarize_prediction, summarize_traces

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
    else:
        pp = pipeline_size([real_traces, predicted], [real_groups, process_groups(predicted)])
    # Megatron's rank order puts pp slowest: a stage is world/pp consecutive ranks. The configuration's world size
    # decides it (traces of a few ranks, or predicted traces of one rank per stage, do not tell the world)
    per_stage = max(world // pp, 1) if world else None
    real_side = summarize_traces(real_traces, "real", pp=pp, ranks_per_stage=per_stage, process_groups=real_groups)
    per_stage = per_stage or max(int(real_side.world_size or len(real_traces)) // pp, 1)
    if isinstance(predicted, dict):
        predicted_side = summarize_prediction(predicted, real_side.ranks, per_stage)
    else:
        predicted_side = summarize_traces(predicted, "predicted", pp=pp, ranks_per_stage=per_stage,
                                          drop_warmup=False, process_groups=process_groups(predicted))
    predicted_side.source = predicted_source
    if use_hta:
        apply_hta(real_side, real_traces, pp)
    return diff_sides(predicted_side, real_side, rank=rank, config=config_dict)


def manifest_config(paths: list[Path]) -> Any:
    """The training configuration of the capture run the real traces come from (its manifest.json in the given
    folder or up to two levels above a given file/folder), or None."""
    from tracekit.capture.manifest import MANIFEST_NAME, Manifest

    for path in paths:
        start = path if path.is_dir() else path.parent
        for folder in (start, start.parent, start.parent.parent):
            if (folder / MANIFEST_NAME).is_file():
                try:
                    return Manifest.load(folder).config()
                except (InputError, TypeError):
                    return None
    return None


def pipeline_size(trace_sets: list[list[Any]], groups: list[dict[str, int]]) -> int:
    """Pipeline stages of traces without a configuration: a PIPELINE_MODEL_PARALLEL_GROUP's size in either side's
    process groups or collectives, else 1."""
    from tracekit.compare import trace_groups

    for traces, named in zip(trace_sets, groups):
        sizes = dict(named)
        sizes.update(trace_groups(traces)[0])
        if sizes.get("PIPELINE_MODEL_PARALLEL_GROUP"):
            return int(sizes["PIPELINE_MODEL_PARALLEL_GROUP"])
    return 1


# -- a captured run -------------------------------------------------------------------------------------------
def validate_run(run_dir: str | Path, models: Any = None, models_path: str | Path | None = None,
                 refit: bool = False, store: str | Path | None = None, rank: int | None = None) -> dict[str, Any]:
    """Predict a `tracekit capture` run's configuration on its hardware and diff it with the run's traces.
    Returns {"report": DiffReport, "prediction": dict, "refit": {...} | None}. With `refit`, the run is
    ingested into `store`, models are retrained from the whole store into `models_path` (default
    `<store>/models`), and the run is predicted again: "refit" has the error before and after."""
    from predictor.models import ModelSet
    from predictor.predict import predict
    from tracekit.capture.manifest import MANIFEST_NAME, Manifest

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
    traces = read_traces(paths)
    cluster = run_cluster(manifest, config)
    models = models if models is not None else ModelSet.load(models_path)
    prediction = predict(config, cluster, models).to_dict()
    report = diff_inputs(prediction, traces, rank=rank, config=config, predicted_source=f"{run_dir} (predicted)")
    result: dict[str, Any] = {"report": report, "prediction": prediction, "refit": None}
    if refit:
        result["refit"] = _refit(paths, config, cluster, report, store, models_path)
    return result


def run_cluster(manifest: Any, config: Any):
    """The Cluster a captured run ran on: its hardware's usual node (`default_cluster`) with the run's ranks per node
    and node count."""
    import dataclasses

    from tracekit.core.cluster import default_cluster

    topology = manifest.topology or {}
    per_node = int(topology.get("ranks_per_node") or config.world_size)
    nodes = int(topology.get("nodes") or max(1, -(-config.world_size // per_node)))
    return dataclasses.replace(default_cluster(manifest.hardware, per_node)[0], nodes=nodes)


def _refit(paths: list[Path], config: Any, cluster: Any, before: Any, store: str | Path | None,
           models_path: str | Path | None) -> dict[str, Any]:
    from extractors.kineto import ingest_paths
    from predictor.models import ModelSet, train_models
    from predictor.predict import predict
    from tracekit.core.store import SampleStore

    sample_store = SampleStore(store)
    ingested = ingest_paths([str(p) for p in paths], sample_store)
    if ingested.errors:
        first = ingested.errors[0]
        raise InputError(first["path"], f"cannot ingest for --refit: {first['error']}")
    added = sum(int(t["samples_written"]) for t in ingested.traces)
    out = Path(models_path) if models_path is not None else sample_store.root / "models"
    try:
        trained = train_models(sample_store.read(), out, provenance={"store": str(sample_store.root),
                                                                     "refit_on": [str(p) for p in paths]})
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - a trainer failure is reported as one line; the old models stay
        raise ModelError(f"{sample_store.root}: retraining failed ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}); the models in {out} are unchanged") from exc
    after_prediction = predict(config, cluster, ModelSet.load(out))
    real_s = before.iteration_time_s["real"]

    def errors(predicted_s: float) -> dict[str, float]:
        return {"predicted_s": predicted_s, "real_s": real_s, "error_s": predicted_s - real_s,
                "rel_error": (predicted_s - real_s) / real_s}

    return {"samples_added": added, "store": str(sample_store.root), "models": str(out), "models_trained":
            len(trained), "before": errors(before.iteration_time_s["predicted"]),
            "after": errors(float(after_prediction.iteration_time_s))}


def apply_hta(side: Any, traces: list[Any], pp: int) -> None:
    """Measure the real side's exposed communication and idle time with HTA (temporal breakdown and
    communication/computation overlap) where HTA can load the traces: GPU traces that name their rank."""
    hta = hta_breakdown(traces)
    if not hta:
        return
    side.hta = hta
    per_iteration = [r for r in hta["ranks"] if r["rank"] in side.ranks]
    if not per_iteration:
        return
    import numpy as np

    from tracekit.compare import side_breakdown

    parts = side_breakdown(side, sorted(side.ranks))
    if parts is None:
        return
    parts = dict(parts)
    parts["exposed_communication"] = float(np.mean([r["exposed_communication_s"] for r in per_iteration]))
    parts["pipeline_bubble"] = float(np.mean([r["idle_s"] for r in per_iteration])) if pp > 1 else 0.0
    parts["overlap_ratio"] = float(np.mean([r["comm_comp_overlap"] for r in per_iteration]))
    side.breakdown_override = parts
    side.breakdown_source = "hta (exposed_communication, pipeline_bubble, overlap_ratio) + tracekit (the rest)"


def hta_breakdown(traces: list[Any]) -> dict[str, Any] | None:
    """HTA's temporal breakdown and comm/compute overlap per rank, per iteration; None where HTA cannot load the
    traces (CPU runs, ranks unknown, HTA not installed)."""
    if not traces or any(t.rank is None or not t.hardware or t.hardware.startswith("cpu") for t in traces):
        return None
    try:
        import contextlib
        import io
        import logging

        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return None
    files = {int(t.rank): str(t.path) for t in traces}
    if len(files) != len(traces):
        return None
    logging.getLogger("hta").setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            analysis = TraceAnalysis(trace_files=files)
            temporal = analysis.get_temporal_breakdown(visualize=False)
            overlap = analysis.get_comm_comp_overlap(visualize=False)
    except Exception:  # noqa: BLE001 - HTA cannot load this trace set: fall back to tracekit's own measure
        return None
    iterations = {int(t.rank): max(len(t.iterations or []) - 1, 1) for t in traces}
    ratio = dict(zip(overlap["rank"].astype(int), overlap["comp_comm_overlap_pctg"].astype(float) / 100))
    ranks = []
    for row in temporal.itertuples(index=False):
        rank = int(row.rank)
        n = iterations.get(rank, 1)
        ranks.append({
            "rank": rank, "iterations": n,
            "idle_us": float(row[1]), "compute_us": float(row[2]), "non_compute_us": float(row[3]),
            "kernel_time_us": float(row[4]), "comm_comp_overlap": ratio.get(rank),
            "idle_s": float(row[1]) / n / 1e6, "exposed_communication_s": float(row[3]) / n / 1e6,
        })
    return {"ranks": ranks, "note": "HTA: kernel_time = first to last kernel (last profiler step excluded); "
                                    "non_compute = communication/memory kernels not overlapped by compute"}
