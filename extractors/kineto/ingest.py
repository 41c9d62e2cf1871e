"""Orchestration: trace paths → runs → KinetoTraces → matched collectives → samples in the SampleStore."""
from __future__ import annotations

import glob
import math
import os
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from tracekit.core.arrow_arrays import float64_array, int64_array, string_array, text_codes
from tracekit.core.errors import ConfigError, InputError, TracekitError
from tracekit.core.hashing import file_digest
from tracekit.core.samples import COLUMNS, FEATURE_COLUMNS, SCHEMA

from .collectives import match_collectives
from .load import NotATraceError, is_trace_name
from .parallel import SPAWN_MIN_BYTES, ordered_map, worker_pool
from .table import EventTable
from .trace import KinetoTrace, read_trace


@dataclass
class IngestResult:
    """`traces`: one report dict per ingested trace (the `--json` schema); `errors`: {path, error} per failure;
    `skipped`: {path, reason} per JSON file of a run folder that is not a trace (a config.json beside the ranks)."""

    traces: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    collective_bytes: list = field(default_factory=list)  # per trace: {primitive: total message bytes}
    matched_collectives: int = 0

    def as_json(self) -> dict:
        return {"traces": self.traces, "errors": self.errors, "skipped": self.skipped}


#: Rows of samples per store commit at most (the traces of a run are committed together up to this many).
COMMIT_ROWS = 250_000
#: The manifest `tracekit capture` writes beside a run's traces (not a trace).
CAPTURE_MANIFEST = "manifest.json"


def find_runs(paths) -> tuple[list, list, set]:
    """Expand PATH arguments (files, directories, globs) into runs (lists of trace files), errors, and the files
    found by scanning a directory (not named on their own).

    A directory is one run (every *.json / *.json.gz inside, recursively, but a `tracekit capture` folder's
    manifest.json); files named directly are grouped into one run per parent directory. Names that are not traces
    (README, CSV, ...) are skipped.
    """
    runs: dict = {}
    errors = []
    scanned: set = set()
    for arg in paths:
        arg = str(arg)
        matches = sorted(glob.glob(arg)) if any(ch in arg for ch in "*?[") else [arg]
        if not matches:
            errors.append(InputError(arg, "no such file or directory (the pattern matched nothing)"))
            continue
        for match in matches:
            path = Path(match)
            if path.is_dir():
                files = sorted(p for p in path.rglob("*") if is_trace_name(p) and p.name != CAPTURE_MANIFEST)
                if not files:
                    errors.append(InputError(path, "no trace files (*.json, *.json.gz) in this directory"))
                    continue
                runs.setdefault(("dir", str(path.resolve())), []).extend(files)
                scanned.update(files)
            elif path.is_file():
                runs.setdefault(("files", str(path.resolve().parent)), []).append(path)
            else:
                errors.append(InputError(path, "no such file or directory"))
    out = []
    for files in runs.values():
        seen, unique = set(), []
        for f in files:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                unique.append(f)
        out.append(unique)
    return out, errors, scanned


def may_be_a_rank(trace: KinetoTrace) -> bool:
    """Whether the trace says it is one rank of several (and can so be matched with other ranks' traces)."""
    return trace.rank is not None and trace.world_size is not None and trace.world_size >= 2


def rank_sets(traces: list) -> list:
    """Groups of traces that are ranks of one job: same hardware and world size > 1, one trace per rank."""
    groups: dict = {}
    for trace in traces:
        if not may_be_a_rank(trace):
            continue
        groups.setdefault((trace.hardware, trace.world_size), []).append(trace)
    out = []
    for members in groups.values():
        ranks = [t.rank for t in members]
        if len(members) >= 2 and len(set(ranks)) == len(ranks):
            out.append(members)
    return out


def trace_samples(trace: KinetoTrace, source_id: str):
    """`sample_table` as a pandas DataFrame."""
    return sample_table(trace, source_id).to_pandas()


def sample_table(trace: KinetoTrace, source_id: str) -> pa.Table:
    """The trace's device events as rows of the sample schema (collectives carry their transfer time; gloo work of
    a synchronous call on a CPU run, what its caller waited: `tracekit sample` times a call so). Backward kernels
    linked to their forward op (extractors/kineto/backward.py) become one row per autograd node and role: the sum
    of its kernels' times, the forward op as `variant`, the kernels' names joined by " + ". Built column by column
    from the event frame's arrays (no DataFrame in between: this runs once per trace of an ingest). The rows come
    grouped by primitive, each primitive's in event order."""
    ev = trace.events
    wait = ev["wait_us"].astype(float)
    dur = ev["dur_us"].astype(float)
    blocked = ev["blocked_us"].astype(float)
    dur = np.where(np.isnan(blocked), dur, blocked)
    duration = np.where(np.isnan(wait), dur, dur - np.nan_to_num(wait))
    node = ev["bwd_node"]
    kernel = ev["name"]
    keep = np.arange(len(ev))
    if np.any(node >= 0):
        keep, duration, kernel = per_role(node, ev["role"], duration, kernel)
    # rows grouped by primitive (in their order within one): the store writes each partition as one slice
    keep = keep[np.argsort(text_codes(ev["primitive"][keep])[0], kind="stable")]
    rows = len(keep)
    iteration = ev["iteration"][keep]
    variant = np.where(node >= 0, ev["fwd_op"], ev["op"])[keep]

    columns = {
        "hardware": string_array([trace.hardware] * rows),
        **{name: string_array(ev[name][keep]) for name in ("primitive", "pass", "dtype")},
        "variant": string_array(variant),
        "role": string_array(ev["role"][keep]),
        **{name: float64_array(ev[name][keep]) for name in FEATURE_COLUMNS},
        "duration_us": float64_array(duration[keep], nan_as_null=False),
        "wait_us": float64_array(wait[keep]),
        "process_group": string_array(ev["process_group"][keep]),
        "stream": int64_array(ev["stream"][keep]),
        "rank": int64_array(np.full(rows, trace.rank or 0), None if trace.rank is not None else np.zeros(rows, bool)),
        "iteration": int64_array(np.where(iteration >= 0, iteration, 0), iteration >= 0),
        "kernel": string_array(kernel[keep]),
        "source": string_array([source_id] * rows),
        "source_path": string_array([trace.path.name] * rows),
    }
    return pa.Table.from_arrays([columns[name] for name in COLUMNS], schema=SCHEMA)


def per_role(node: np.ndarray, role: np.ndarray, duration: np.ndarray, kernel: np.ndarray):
    """(rows to keep, durations, kernel names): the linked backward kernels (`node` ≥ 0) of each (autograd node,
    role) become their first row, with the group's summed duration and its kernels' names joined by " + "."""
    idx = np.flatnonzero(node >= 0)
    code: dict = {}  # each role a number, in order of appearance; none: -1
    codes = np.array([-1 if r is None else code.setdefault(r, len(code)) for r in role[idx].tolist()], dtype=np.int64)
    key = node[idx] * 8 + codes  # fewer than 8 roles
    order = np.argsort(key, kind="stable")
    idx, key = idx[order], key[order]
    start = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    first = idx[start]
    duration, kernel = duration.copy(), kernel.copy()
    duration[first] = np.add.reduceat(duration[idx], start)
    sizes = np.diff(np.r_[start, len(idx)])
    for row, s, n in zip(first.tolist(), start.tolist(), sizes.tolist()):
        if n > 1:
            kernel[row] = " + ".join(dict.fromkeys(kernel[idx[s:s + n]]))
    keep = np.sort(np.concatenate([np.flatnonzero(node < 0), first]))
    return keep, duration, kernel


def busy_time(ev: EventTable) -> float:
    """Time (µs) during which at least one device event ran (union of their intervals)."""
    if not len(ev):
        return 0.0
    start = ev["ts_us"]
    end = start + ev["dur_us"]
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)
    new_block = np.empty(len(start), bool)
    new_block[0] = True
    new_block[1:] = start[1:] > reach[:-1]
    block_start = start[new_block]
    block_end = np.maximum.reduceat(end, np.flatnonzero(new_block))
    return float(np.sum(block_end - block_start))


def group_sums(keys: np.ndarray, values: np.ndarray) -> dict[str, tuple[int, float]]:
    """{key: (values, their sum)} by key, sorted; rows without a key and NaN values are left out (what pandas'
    groupby count and sum give, but a key whose values are all NaN: 0 and 0.0). Sums are exact (`math.fsum`)."""
    by_key: dict[str, list[float]] = {}
    for key, value in zip(keys.tolist(), values.tolist()):
        if key is not None:
            by_key.setdefault(key, [])
            if value == value:
                by_key[key].append(value)
    return {key: (len(v), math.fsum(v)) for key, v in sorted(by_key.items())}


def trace_report(trace: KinetoTrace, written: int) -> dict:
    ev = trace.events
    by_prim = group_sums(ev["primitive"], ev["dur_us"])
    total = float(np.sum(ev["dur_us"]))
    other = by_prim["other"][1] if "other" in by_prim else 0.0
    return {
        "path": str(trace.path),
        "hardware": trace.hardware,
        "rank": trace.rank,
        "world_size": trace.world_size,
        "iterations": len(trace.iterations),
        "kernels": trace.kernels,
        "gpu_busy_us": round(busy_time(ev), 3),
        "primitives": {name: {"count": rows, "time_us": round(time_us, 3)}
                       for name, (rows, time_us) in by_prim.items()},
        "unclassified_share": round(other / total, 6) if total > 0 else 0.0,
        "backward": backward_report(ev),
        "launch_not_recorded": unlaunched_report(ev),
        "samples_written": int(written),
    }


def backward_report(ev: EventTable) -> dict:
    """Backward compute kernels (ops on CPU runs): how many are linked to their forward op, per role, and how many
    are not (they keep their own launching op's shapes)."""
    bwd = (ev["pass"] == "bwd") & (ev["category"] == "computation")
    roles = Counter(role for role in ev["role"][bwd] if isinstance(role, str))
    linked, kernels = sum(roles.values()), int(bwd.sum())
    return {"kernels": kernels, "linked": linked, "unlinked": kernels - linked, "roles": dict(sorted(roles.items()))}


def unlaunched_report(ev: EventTable) -> dict:
    """Compute kernels whose launch call is not in the trace (most often: launched before the profiler's CPU window
    opened): how many took their twins' op and shapes (twins.py), how many stay without an op (no shapes)."""
    compute = (ev["kind"] == "kernel") & (ev["category"] == "computation")
    twins = int((ev["op_from_twin"].astype(bool) & compute).sum())
    no_op = np.fromiter((op is None for op in ev["op"]), dtype=bool, count=len(ev))
    return {"from_twins": twins, "without_op": int((no_op & compute).sum())}


@dataclass
class Parsed:
    """One file as a worker hands it back: the trace or the error entry; its report (`samples_written` still 0) and
    collective bytes; and, for a trace no other can be matched with (`may_be_a_rank` false), its samples already
    built and its device events dropped (they are not needed again, and not sent back)."""

    path: Path
    trace: KinetoTrace | None = None
    source_id: str | None = None
    error: dict | None = None
    report: dict = field(default_factory=dict)
    collective_bytes: dict = field(default_factory=dict)
    samples: pa.Table | None = None


def _load(path: Path) -> Parsed:
    """One file parsed, with what can be done before the collectives of its run are matched; never raises for a bad
    file."""
    try:
        trace, source_id = read_trace(path), file_digest(path)
    except NotATraceError as exc:
        return Parsed(path, error={"path": exc.path, "error": exc.reason, "not_a_trace": True})
    except InputError as exc:
        return Parsed(path, error={"path": exc.path, "error": exc.reason})
    except TracekitError as exc:
        return Parsed(path, error={"path": str(path), "error": str(exc)})
    except (ValueError, KeyError, TypeError, IndexError, OverflowError) as exc:  # a trace we misread
        return Parsed(path, error={"path": str(path), "error": f"could not be read ({type(exc).__name__}: {exc})"})
    ev = trace.events
    comm = ev["category"] == "communication"
    parsed = Parsed(path, trace, source_id, report=trace_report(trace, 0),
                    collective_bytes={k: total for k, (_, total) in group_sums(ev["primitive"][comm],
                                                                               ev["bytes"][comm]).items()})
    if not may_be_a_rank(trace):
        parsed.samples = sample_table(trace, source_id)
        trace.events = ev.take([])
    return parsed


def _ray_loads(files: list[Path], ray) -> Iterator[Parsed]:
    """Each file's `_load` as one Ray task (`ray`: an initialized ray module), in order."""
    task = ray.remote(_load)
    for ref in [task.remote(path) for path in files]:
        parsed = ray.get(ref)
        if parsed.trace is not None:  # Ray hands back read-only arrays of its object store; matching writes to them
            parsed.trace.events = parsed.trace.events.copy()
        yield parsed


def ingest_paths(paths, store, progress: Callable | None = None, jobs: int | None = None,
                 parallel_min_bytes: int = SPAWN_MIN_BYTES, executor: str = "local",
                 ray_address: str | None = None, ray_options: dict | None = None) -> IngestResult:
    """Ingest trace files/directories/globs into `store` (a SampleStore). Never raises for a bad input file:
    each failure becomes an entry of `errors` ({"path", "error"}) and the store is left unchanged for it. With
    several files, they are parsed and their samples written by `jobs` worker processes (default: every core;
    `parallel.worker_pool`: forked where that is safe, else spawned for files of `parallel_min_bytes` or more
    together), or, with `executor="ray"`, parsed as one Ray task per file
    (`tracekit.core.ray_runtime.connect(ray_address, **ray_options)`: a local Ray on demand, or a cluster whose
    nodes see the files at the same paths). Either way this process matches each run's collectives, and the
    result is what one process gives, in the same order."""
    if executor not in ("local", "ray"):
        raise ConfigError(f"executor must be local or ray, not {executor!r}")
    ray = None
    if executor == "ray":
        from tracekit.core.ray_runtime import connect

        ray = connect(ray_address, **(ray_options or {}))
    runs, path_errors, scanned = find_runs(paths)
    result = IngestResult(errors=[{"path": e.path, "error": e.reason} for e in path_errors])
    files = [f for run in runs for f in run]
    jobs = jobs or os.cpu_count() or 1
    done = 0
    pool_of = nullcontext(None) if ray is not None else worker_pool(jobs, files, parallel_min_bytes)
    with pool_of as pool:
        loads = _ray_loads(files, ray) if ray is not None else ordered_map(_load, files, pool)
        for run in runs:
            loaded = []
            for _ in run:
                parsed = next(loads)
                error = parsed.error or {}
                if parsed.trace is not None and parsed.source_id is not None:
                    loaded.append((parsed.trace, parsed.source_id, parsed))
                elif error.pop("not_a_trace", False) and parsed.path in scanned:  # a run folder's config.json
                    result.skipped.append({"path": str(parsed.path), "reason": error["error"]})
                else:
                    result.errors.append(error)
                done += 1
                if progress:
                    progress(done, len(files), parsed.path)
            for members in rank_sets([trace for trace, _, _ in loaded]):
                report = match_collectives([t.events for t in members])
                result.matched_collectives += report.matched
            _commit_run(loaded, store, result)
    return result


def _commit_run(loaded: list[tuple[KinetoTrace, str, Parsed]], store, result: IngestResult) -> None:
    """The samples of a run's parsed (and matched) traces into the store, in commits of all its traces (up to
    `COMMIT_ROWS` rows each: one lock, one file per partition, one source-list write per commit), and each trace's
    report into `result`."""
    batch: list = []
    written: list[int] = []
    rows = 0
    for trace, source_id, parsed in loaded:
        samples = parsed.samples if parsed.samples is not None else sample_table(trace, source_id)
        batch.append((source_id, samples, {"path": trace.path.name, "format": "kineto",
                                                  "hardware": trace.hardware, "rank": trace.rank,
                                                  "world_size": trace.world_size, "kernels": trace.kernels}))
        rows += samples.num_rows
        if rows >= COMMIT_ROWS:
            written += store.add_many(batch)
            batch, rows = [], 0
    if batch:
        written += store.add_many(batch)
    for (_, _, parsed), rows_written in zip(loaded, written):
        result.traces.append({**parsed.report, "samples_written": int(rows_written)})
        result.collective_bytes.append(parsed.collective_bytes)
