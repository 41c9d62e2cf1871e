"""Trace discovery and the inputs of a diff: which files under the given paths are traces, reading them through
`extractors.kineto`'s public API, a run's process groups, a `tracekit predict --json` file, and the training
configuration of the capture run the traces come from.

Raises InputError naming the path: no such file or folder, a folder without traces, a file that is neither a trace
nor a prediction.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from extractors.kineto import CAPTURE_MANIFEST, is_trace_name, open_trace, read_trace
from tracekit.capture.manifest import MANIFEST_NAME, Manifest
from tracekit.core.errors import InputError

if TYPE_CHECKING:
    from extractors.kineto import KinetoTrace
    from tracekit.core.config import TrainingConfig

PREDICTION_MAX_BYTES = 50 << 20  # a prediction JSON is small; bigger .json files are traces


def trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """Trace files named by the paths: files as given, folders searched (recursively) for *.json / *.json.gz,
    skipping tracekit's own JSON (manifest.json, prediction.json)."""
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


def read_traces(paths: Iterable[str | Path]) -> list[KinetoTrace]:
    """Parse every trace file (extractors.kineto.read_trace); InputError names a file that is not a trace."""
    return [read_trace(path) for path in trace_files(paths)]


def process_groups(traces: list[KinetoTrace]) -> dict[str, int]:
    """Process-group description → size from the traces' `distributedInfo.pg_config` (PyTorch ≥ 2.3)."""
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


def manifest_config(paths: list[Path]) -> TrainingConfig | None:
    """The training configuration of the capture run the real traces come from (its manifest.json in the given
    folder or up to two levels above a given file/folder), or None."""
    for path in paths:
        start = path if path.is_dir() else path.parent
        for folder in (start, start.parent, start.parent.parent):
            if (folder / MANIFEST_NAME).is_file():
                try:
                    return Manifest.load(folder).config()
                except (InputError, TypeError):
                    return None
    return None
