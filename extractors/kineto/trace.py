"""`read_trace`: one Kineto trace file → a KinetoTrace with one classified row per device event."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from tracekit.core.errors import InputError
from tracekit.core.hardware import normalize_hardware
from tracekit.core.samples import FEATURE_COLUMNS

from .backward import link_backward
from .classify import classify, is_comm_kernel
from .collectives import assign_sequence, comm_info
from .cpu import cpu_events, cpu_hardware
from .decode import decode_events, event_columns
from .events import Event, EventColumns
from .fsdp import unit_or_label
from .linkage import Linkage, link, profiler_steps
from .load import open_trace
from .shapes import op_features
from .table import EventTable
from .twins import adopt_twins

if TYPE_CHECKING:  # pandas is imported where a reader asks for the frame (ingest does not)
    import pandas as pd


@dataclass
class KinetoTrace:
    """A parsed, redacted Kineto trace (never holds the trace's `metadata`/environment block).

    `events` has one row per GPU kernel / memcpy / memset (on CPU runs: per timed top-level op and gloo
    collective); see `columns.EVENT_COLUMNS` and the package docstring for the meaning of each column.
    `device_events` is the same table as a pandas DataFrame.
    """

    path: Path
    hardware: str
    rank: int | None
    world_size: int | None
    iterations: list  # [(step_number, start_us, end_us)] from ProfilerStep#N, sorted by start
    events: EventTable
    kernels: int = 0  # events of category `kernel` in the file
    size_bytes: int = 0  # uncompressed JSON bytes
    base_time_ns: int | None = None
    is_cpu_run: bool = False
    backend: str | None = None
    device_properties: list = field(default_factory=list)

    @property
    def device_events(self) -> pd.DataFrame:
        return self.events.to_pandas()


def _rank_info(dist: dict) -> tuple:
    def as_int(value):
        try:
            return int(value)
        except (TypeError, ValueError):
            return None

    rank = as_int(dist.get("rank"))
    world = as_int(dist.get("world_size"))
    return rank, world, dist.get("backend")


def _gpu_events(c: EventColumns, lk: Linkage, world_size: int | None) -> EventTable:
    n = len(c.dev_ts)
    ctx = lk.ops
    cols: dict[str, list[Any]] = {name: [None] * n for name in ("primitive", "pass", "dtype", "op", "category",
                                                                "process_group", "process_group_desc", "comm_seq",
                                                                "layer")}
    names = c.dev_name
    op_names = c.op_name
    dev_op = lk.dev_op.tolist()
    dev_kind, dev_bytes = c.dev_kind, c.dev_bytes.tolist()
    cpu_op, comm_op, comm_ann = ctx.cpu_op.tolist(), ctx.comm_op.tolist(), ctx.comm_annotation.tolist()
    fsdp_copy = ctx.fsdp_copy.tolist()
    optimizer, backward, layer = ctx.optimizer.tolist(), ctx.backward.tolist(), ctx.layer.tolist()
    feat_rows = {name: [np.nan] * n for name in FEATURE_COLUMNS}
    comm_rows: list[int] = []
    comm_recorded: list[int | None] = []
    comm_pg: list[str | None] = []
    for i in range(n):
        kind = dev_kind[i]
        kernel = names[i]
        inner = dev_op[i]
        launcher = -1
        if inner >= 0:  # an FSDP2 copy's kernels are the copy's, whichever aten op inside it launched them
            launcher = fsdp_copy[inner] if fsdp_copy[inner] >= 0 else cpu_op[inner] if cpu_op[inner] >= 0 else inner
        op = op_names[launcher] if launcher >= 0 else None
        fields = c.dev_comm.get(i)
        rpc = comm_op[inner] if inner >= 0 else -1
        ann = comm_ann[inner] if inner >= 0 else -1
        if fields is None and rpc >= 0:
            fields = c.op_comm.get(rpc)
        if kind == "kernel" and (is_comm_kernel(kernel) or c.dev_comm.get(i) is not None):
            info = comm_info(
                kernel, fields, op_names[ann] if ann >= 0 else None,
                (c.op_dims[ann], c.op_types[ann]) if ann >= 0 else None,
                (c.op_dims[rpc], c.op_types[rpc]) if rpc >= 0 else None, world_size)
            cols["primitive"][i] = info.primitive
            cols["pass"][i] = "comm"
            cols["category"][i] = "communication"
            cols["dtype"][i] = info.dtype
            cols["process_group"][i] = info.process_group
            cols["process_group_desc"][i] = info.process_group_desc
            feat_rows["bytes"][i] = np.nan if info.bytes is None else info.bytes
            feat_rows["group_size"][i] = np.nan if info.group_size is None else info.group_size
            comm_rows.append(i)
            comm_recorded.append(info.seq)
            comm_pg.append(info.process_group)
        else:
            in_opt = optimizer[inner] if inner >= 0 else False
            primitive = classify(kind, kernel, op, in_opt)
            cols["primitive"][i] = primitive
            cols["category"][i] = "memory" if kind in ("memcpy", "memset") else "computation"
            if inner >= 0 and in_opt:
                cols["pass"][i] = "optimizer"
            elif inner >= 0 and backward[inner]:
                cols["pass"][i] = "bwd"
            else:
                cols["pass"][i] = "fwd"
            if launcher >= 0 and primitive not in ("memcpy", "memset", "other"):
                dtype, values = op_features(op, primitive, c.op_dims[launcher], c.op_types[launcher],
                                            c.op_concrete[launcher])
                cols["dtype"][i] = dtype
                for key, value in values:
                    feat_rows[key][i] = value
            elif kind in ("memcpy", "memset") and dev_bytes[i] >= 0:
                feat_rows["bytes"][i] = float(dev_bytes[i])
        cols["op"][i] = op
        if inner >= 0 and layer[inner] >= 0:
            cols["layer"][i] = unit_or_label(op_names[layer[inner]])
    # a twin's op is not this kernel's autograd node: borrowed, it would sum into the twin's backward; an FSDP2 copy
    # in backward runs in a hook inside some node, and is the copy's, not that node's forward op's
    in_copy = (lk.dev_op >= 0) & (ctx.fsdp_copy[np.maximum(lk.dev_op, 0)] >= 0) if len(ctx.fsdp_copy) \
        else np.zeros(n, dtype=bool)
    bwd = link_backward(c, lk, (np.array(cols["category"], dtype=object) == "computation")
                        & (np.array(cols["pass"], dtype=object) == "bwd") & ~lk.dev_twin & ~in_copy)
    fwd_name: list = [None] * n
    for i in np.flatnonzero(bwd.forward >= 0).tolist():  # the forward op's primitive, dtype and shapes
        fwd = int(bwd.forward[i])
        primitive = cols["primitive"][i] = bwd.primitive[i]
        fwd_name[i] = op_names[fwd]
        dtype, values = op_features(op_names[fwd], primitive, c.op_dims[fwd], c.op_types[fwd], c.op_concrete[fwd])
        cols["dtype"][i] = dtype
        for key in feat_rows:
            feat_rows[key][i] = np.nan
        for key, value in values:
            feat_rows[key][i] = value
    if comm_rows:
        when = np.where(np.isnan(lk.dev_launch_ts), c.dev_ts, lk.dev_launch_ts)[comm_rows]
        order = np.argsort(when, kind="stable")
        seqs = assign_sequence(comm_pg, [cols["primitive"][r] for r in comm_rows], order, comm_recorded)
        for row, seq in zip(comm_rows, seqs):
            cols["comm_seq"][row] = seq
    return EventTable({
        "ts_us": c.dev_ts, "dur_us": c.dev_dur, "stream": c.dev_stream, "name": names, "kind": c.dev_kind,
        "category": cols["category"], "primitive": cols["primitive"], "pass": cols["pass"], "dtype": cols["dtype"],
        "op": cols["op"], "op_from_twin": lk.dev_twin, "iteration": lk.dev_iteration,
        **{name: np.array(values, dtype=float) for name, values in feat_rows.items()},
        "process_group": cols["process_group"], "process_group_desc": cols["process_group_desc"],
        "comm_seq": cols["comm_seq"], "wait_us": np.full(n, np.nan), "layer": cols["layer"],
        "launch_ts_us": lk.dev_launch_ts, "blocked_us": np.full(n, np.nan), "role": bwd.role, "fwd_op": fwd_name,
        "bwd_node": bwd.node,
    })


def _hardware(properties: list) -> str:
    """Hardware id from deviceProperties; a generic marketing name ('AMD Radeon Graphics', as some ROCm builds
    report an MI250 GCD) is made specific with the device's architecture, compute units and memory."""
    if not properties or not properties[0].get("name"):
        return "unknown"
    first = properties[0]
    hardware = normalize_hardware(str(first["name"]))
    if hardware in ("GRAPHICS", "GPU", "DEVICE", "unknown"):
        vendor = "AMD" if "amd" in str(first["name"]).lower() else "GPU"
        parts = [vendor, f"cc{first.get('computeMajor', '')}{first.get('computeMinor', '')}"]
        if first.get("numSms"):
            parts.append(f"{first['numSms']}CU")
        if first.get("totalGlobalMem"):
            parts.append(f"{round(first['totalGlobalMem'] / 2**30)}GB")
        hardware = "-".join(parts)
    return hardware


def _gpu_listed(header_devices: list, backend: str | None) -> bool:
    return bool(header_devices) or bool(backend and re.search(r"nccl|hccl|rccl", str(backend), re.I))


def read_trace(path: str | Path) -> KinetoTrace:
    """Parse one Kineto trace file. Raises InputError(path, reason) for anything that is not a usable trace."""
    path = Path(path)
    tf = open_trace(path, event_type=Event)
    try:
        c = event_columns(tf.events) if tf.events is not None else decode_events(tf.events_raw)
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError, ValueError, OverflowError) as exc:
        raise InputError(path, f"malformed trace events ({exc})") from exc
    tf.events_raw, tf.events = b"", None
    rank, world, backend = _rank_info(tf.distributed_info)
    devices = [d.get("name", "") for d in tf.device_properties]
    base = dict(path=path, rank=rank, world_size=world, kernels=c.kernel_events, size_bytes=tf.size_bytes,
                base_time_ns=tf.base_time_ns, backend=backend, device_properties=tf.device_properties)
    if len(c.dev_ts):
        lk = adopt_twins(c, link(c))
        table = _gpu_events(c, lk, world)
        return KinetoTrace(hardware=_hardware(tf.device_properties), iterations=lk.iterations, events=table, **base)
    timed = np.count_nonzero(c.op_dur > 0) if len(c.op_dur) else 0
    if not timed:
        raise InputError(path, "nothing timed in it (no device kernels and no operators with durations)")
    if _gpu_listed(devices, backend):
        raise InputError(path, "a GPU run whose trace holds no device kernels (GPU activity was not recorded); "
                               "its CPU-side operator times are not operator times")
    table = cpu_events(c, world)
    if not len(table):
        raise InputError(path, "nothing timed in it (no device kernels, top-level operators or collectives)")
    return KinetoTrace(hardware=cpu_hardware(tf.cpu_model), iterations=profiler_steps(c), events=table,
                       is_cpu_run=True, **base)
