"""nccl-tests results → collective samples.

Two layouts are read:
- the tool's own stdout (`all_reduce_perf -b 1M -e 1G ...`): `#`-commented header naming the devices, then rows
  `size count type redop root time algbw busbw #wrong time algbw busbw #wrong` (times in µs);
- CSV tables converted from it (vTrain's `AR_GPU{n}_..._LUT.csv`): `size(B),count,type,time(ns),busbw(GB/s),...`.
The out-of-place time is the sample. Topology comes from the options (`nodes`, `gpus_per_node`), else from the
device list of stdout, else from the file name (`AR_GPU8_...` = 8 GPUs on one node).

nccl-tests' `size` is the whole buffer; tracekit's `bytes` is per rank (all_gather: each rank's input shard,
reduce_scatter: each rank's output shard), so those two are divided by the group size.
"""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pandas as pd

from tracekit.core.errors import InputError
from tracekit.core.hardware import normalize_hardware
from tracekit.core.hashing import file_digest
from tracekit.core.samples import COLLECTIVE_PRIMITIVES

from . import files

_KINDS = {  # substrings of the test binary / file name → primitive
    "all_reduce": "all_reduce", "allreduce": "all_reduce", "ar_": "all_reduce",
    "all_gather": "all_gather", "allgather": "all_gather", "ag_": "all_gather",
    "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter", "rs_": "reduce_scatter",
    "alltoall": "all_to_all", "all_to_all": "all_to_all", "broadcast": "broadcast", "sendrecv": "send_recv",
}
_DTYPES = {"float": "fp32", "half": "fp16", "bfloat16": "bf16", "double": "fp64", "int8": "int8", "int32": "int32",
           "uint8": "uint8", "int64": "int64", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
_DEVICE = re.compile(r"^#\s+Rank\s+\d+\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(?P<host>\S+)"
                     r"\s+device\s+\d+\s+\[[^\]]*\]\s+(?P<name>.+?)\s*$")
_GPU_COUNT = re.compile(r"gpu(\d+)", re.I)


def _kind(text: str) -> str | None:
    low = text.lower()
    for needle, kind in _KINDS.items():
        if needle in low:
            return kind
    return None


def read_file(path: str | Path, hardware: str | None = None, gpus_per_node: int | None = None,
              nodes: int | None = None, collective: str | None = None, source: str | None = None) -> pd.DataFrame:
    """All samples of one nccl-tests result file, every row validated (InputError names file and line)."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, f"unreadable ({exc})") from exc
    lines = text.splitlines()
    first = next((line for line in lines if line.strip()), "")
    if first.startswith("size(B)") or first.startswith('"size(B)"'):
        hosts: set[str] = set()
        devices: list[str] = []
        table, kind = _read_csv(path, text), None
    else:
        table, hosts, devices, kind = _read_stdout(path, lines)
    if collective is not None:
        named = collective if collective in COLLECTIVE_PRIMITIVES else _kind(collective + "_")
        if named is None:
            raise InputError(path, f"unknown collective {collective!r} (one of {', '.join(COLLECTIVE_PRIMITIVES)})")
        collective = named
    kind = collective or kind or _kind(path.name)
    if kind is None:
        raise InputError(path, "cannot tell which collective this is; name it (e.g. --collective all_reduce)")
    if hardware is None:
        if not devices:
            raise InputError(path, "the file names no device; give the hardware id (--hardware)")
        hardware = devices[0]
    nodes = nodes or (len(hosts) if hosts else 1)
    if gpus_per_node is None:
        if devices:
            gpus_per_node = max(1, len(devices) // nodes)
        else:
            match = _GPU_COUNT.search(path.name)
            if not match:
                raise InputError(path, "group size unknown: give --gpus-per-node (and --nodes)")
            gpus_per_node = int(match.group(1))
    group = nodes * gpus_per_node
    per_rank = table["size"] / group if kind in ("all_gather", "reduce_scatter") else table["size"]
    return pd.DataFrame({
        "hardware": normalize_hardware(hardware), "primitive": kind, "pass": "comm", "dtype": table["dtype"],
        "variant": f"nccl-tests {kind}", "bytes": per_rank, "numel": table["count"], "group_size": float(group),
        "ranks_per_node": float(gpus_per_node), "nodes": float(nodes), "duration_us": table["time_us"],
        "source": source or file_digest(path), "source_path": path.name,
    })


def _number(path: Path, line: int, column: str, value: str, positive: bool = True) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not number == number or number < 0 or (positive and number == 0):
        raise InputError(path, f"line {line}: column {column!r} has {value!r}, expected a positive number")
    return number


def _read_csv(path: Path, text: str) -> pd.DataFrame:
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader)]
    need = ("size(B)", "count", "type", "time(ns)")
    missing = [c for c in need if c not in header]
    if missing:
        raise InputError(path, f"missing column(s) {missing}")
    pos = {name: header.index(name) for name in need}  # first time(ns) = out-of-place
    rows = []
    for lineno, row in enumerate(reader, start=2):
        if not row or not any(cell.strip() for cell in row):
            continue
        if len(row) < len(header):
            raise InputError(path, f"line {lineno}: {len(row)} fields, expected {len(header)}")
        rows.append({
            "size": _number(path, lineno, "size(B)", row[pos["size(B)"]]),
            "count": _number(path, lineno, "count", row[pos["count"]]),
            "dtype": _dtype(path, lineno, row[pos["type"]]),
            "time_us": _number(path, lineno, "time(ns)", row[pos["time(ns)"]]) / 1000.0,
        })
    if not rows:
        raise InputError(path, "no result rows")
    return pd.DataFrame(rows)


def _dtype(path: Path, line: int, name: str) -> str:
    key = name.strip().lower()
    if key not in _DTYPES:
        raise InputError(path, f"line {line}: unknown data type {name!r}")
    return _DTYPES[key]


def _read_stdout(path: Path, lines: list[str]) -> tuple[pd.DataFrame, set[str], list[str], str | None]:
    hosts: set[str] = set()
    devices: list[str] = []
    kind = None
    time_col = 5  # size count type redop root time ...: recent nccl-tests; the header line says where `time` is
    rows = []
    for lineno, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            device = _DEVICE.match(stripped)
            tokens = stripped.lstrip("#").split()
            if device:
                hosts.add(device["host"])
                devices.append(device["name"])
            elif tokens[:2] == ["size", "count"] and "time" in tokens:
                time_col = tokens.index("time")
            elif "Collective test starting" in stripped or "_perf" in stripped:
                kind = kind or _kind(stripped)
            continue
        fields = stripped.split()
        if len(fields) <= time_col or not fields[0].isdigit():
            raise InputError(path, f"line {lineno}: not a nccl-tests result row: {stripped[:60]!r}")
        rows.append({
            "size": _number(path, lineno, "size", fields[0]),
            "count": _number(path, lineno, "count", fields[1]),
            "dtype": _dtype(path, lineno, fields[2]),
            "time_us": _number(path, lineno, "time", fields[time_col]),
        })
    if not rows:
        raise InputError(path, "no nccl-tests result rows")
    return pd.DataFrame(rows), hosts, devices, kind


def list_files(root: str | Path) -> list[Path]:
    """Result files under a folder (or the file itself), sorted."""
    return files.list_files(root, lambda p: p.suffix.lower() in (".csv", ".txt", ".log", ".out"))
