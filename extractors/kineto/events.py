"""Decode a trace's event array into compact per-kind columns.

Events are decoded with typed msgspec Structs that name only the fields tracekit uses (everything else in an
event is skipped by the parser). Large arrays are decoded in chunks: first split into raw JSON events, then
decoded a chunk at a time and reduced to typed arrays, so peak memory stays near the size of the JSON itself.

Handles complete events (`X`) and begin/end pairs (`B`/`E`, paired per thread); timestamps may be integer or
float microseconds (kept as float64 µs on the file's own clock; `baseTimeNanoseconds` is reported, not added,
because adding an epoch would cost float precision).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

_EMPTY = msgspec.Raw(b"")

#: Device activity categories (kernels and memory operations). MTIA's device events are `mtia_ccp_events`.
DEVICE_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "mtia_ccp_events": "kernel"}
#: Host-side operator categories.
OP_CATEGORIES = frozenset({"cpu_op", "user_annotation"})
#: Chunk size of the chunked decoder, in events.
CHUNK_EVENTS = 50_000
#: Arrays larger than this (bytes) are decoded in chunks.
CHUNK_THRESHOLD = 16 << 20


class _Args(msgspec.Struct, gc=False):
    ext: Any = msgspec.field(name="External id", default=None)
    correlation: Any = None
    stream: Any = None
    dims: msgspec.Raw = msgspec.field(name="Input Dims", default=_EMPTY)
    types: msgspec.Raw = msgspec.field(name="Input type", default=_EMPTY)
    concrete: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=_EMPTY)
    coll: Any = msgspec.field(name="Collective name", default=None)
    in_nelems: Any = msgspec.field(name="In msg nelems", default=None)
    out_nelems: Any = msgspec.field(name="Out msg nelems", default=None)
    group_size: Any = msgspec.field(name="Group size", default=None)
    dtype: Any = None
    pg_name: Any = msgspec.field(name="Process Group Name", default=None)
    pg_desc: Any = msgspec.field(name="Process Group Description", default=None)
    pg_ranks: Any = msgspec.field(name="Process Group Ranks", default=None)
    seq: Any = msgspec.field(name="Seq", default=None)
    nbytes: Any = msgspec.field(name="bytes", default=None)


class _Event(msgspec.Struct, gc=False):
    ph: Any = ""
    cat: Any = None
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None


_EVENTS = msgspec.json.Decoder(list[_Event])
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])


@dataclass
class CommFields:
    """Collective metadata as a trace records it (on record_param_comms, or on the NCCL kernel itself)."""

    name: str | None = None
    in_nelems: int | None = None
    out_nelems: int | None = None
    group_size: int | None = None
    dtype: str | None = None
    pg_name: str | None = None
    pg_desc: str | None = None
    pg_ranks: str | None = None
    seq: int | None = None


@dataclass
class EventColumns:
    """The events tracekit uses, column-wise. `thread` codes index `threads` ((pid, tid) pairs)."""

    threads: list = field(default_factory=list)
    # device activity
    dev_ts: np.ndarray = None
    dev_dur: np.ndarray = None
    dev_stream: np.ndarray = None
    dev_ext: np.ndarray = None
    dev_corr: np.ndarray = None
    dev_bytes: np.ndarray = None
    dev_name: list = field(default_factory=list)
    dev_kind: list = field(default_factory=list)  # kernel | memcpy | memset
    dev_comm: dict = field(default_factory=dict)  # row → CommFields (generation (c): fields on the kernel)
    kernel_events: int = 0  # events of category `kernel` in the file
    # host operators (cpu_op and user_annotation)
    op_ts: np.ndarray = None
    op_dur: np.ndarray = None
    op_thread: np.ndarray = None
    op_ext: np.ndarray = None
    op_name: list = field(default_factory=list)
    op_is_annotation: np.ndarray = None
    op_dims: list = field(default_factory=list)  # raw JSON bytes of Input Dims (shared between equal values)
    op_types: list = field(default_factory=list)
    op_concrete: list = field(default_factory=list)
    op_comm: dict = field(default_factory=dict)  # row → CommFields
    # runtime / driver API calls
    rt_ts: np.ndarray = None
    rt_thread: np.ndarray = None
    rt_corr: np.ndarray = None
    rt_name: list = field(default_factory=list)
    # fwdbwd flow ends: (thread, ts) of the backward op each forward op links to
    bwd_flow_ends: set = field(default_factory=set)
    events_total: int = 0


def _int(value: Any, default: int = -1) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return default
    return default


def _comm(a: _Args) -> CommFields | None:
    if a.coll is None and a.in_nelems is None and a.pg_name is None:
        return None
    return CommFields(
        name=a.coll if isinstance(a.coll, str) else None,
        in_nelems=_int(a.in_nelems, None) if a.in_nelems is not None else None,
        out_nelems=_int(a.out_nelems, None) if a.out_nelems is not None else None,
        group_size=_int(a.group_size, None) if a.group_size is not None else None,
        dtype=str(a.dtype) if a.dtype is not None else None,
        pg_name=str(a.pg_name) if a.pg_name is not None else None,
        pg_desc=str(a.pg_desc) if a.pg_desc is not None else None,
        pg_ranks=a.pg_ranks if isinstance(a.pg_ranks, str) else (str(a.pg_ranks) if a.pg_ranks is not None else None),
        seq=_int(a.seq, None) if a.seq is not None else None,
    )


class _Builder:
    """Accumulates events into typed arrays (8 bytes per value) and shared strings."""

    def __init__(self) -> None:
        self.c = EventColumns()
        self.thread_codes: dict = {}
        self.strings: dict = {}
        self.blobs: dict = {}
        self.dev = {k: array("d") for k in ("ts", "dur")} | {k: array("q") for k in ("stream", "ext", "corr", "bytes")}
        self.op = {k: array("d") for k in ("ts", "dur")} | {k: array("q") for k in ("thread", "ext", "ann")}
        self.rt = {"ts": array("d"), "thread": array("q"), "corr": array("q")}
        self.open_spans: dict = {}

    def thread(self, pid: Any, tid: Any) -> int:
        key = (pid, tid)
        code = self.thread_codes.get(key)
        if code is None:
            code = self.thread_codes[key] = len(self.thread_codes)
            self.c.threads.append(key)
        return code

    def blob(self, raw: msgspec.Raw) -> bytes:
        data = bytes(raw)
        return self.blobs.setdefault(data, data)

    def add(self, events: list) -> None:
        dev_cats = DEVICE_CATEGORIES
        op_cats = OP_CATEGORIES
        strings = self.strings
        c = self.c
        dev, op, rt = self.dev, self.op, self.rt
        c.events_total += len(events)
        for e in events:
            ph = e.ph
            if ph != "X":
                if ph == "B" or ph == "E":
                    e = self._pair(e)
                    if e is None:
                        continue
                elif ph == "f" and e.cat == "fwdbwd":
                    c.bwd_flow_ends.add((self.thread(e.pid, e.tid), float(e.ts)))
                    continue
                else:
                    continue
            cat = e.cat
            ts = e.ts
            if ts is None:
                continue
            a = e.args
            if cat in op_cats:
                op["ts"].append(ts)
                op["dur"].append(e.dur or 0.0)
                op["thread"].append(self.thread(e.pid, e.tid))
                op["ann"].append(cat == "user_annotation")
                name = e.name
                c.op_name.append(strings.setdefault(name, name))
                if a is None:
                    op["ext"].append(-1)
                    c.op_dims.append(b"")
                    c.op_types.append(b"")
                    c.op_concrete.append(b"")
                    continue
                op["ext"].append(_int(a.ext))
                c.op_dims.append(self.blob(a.dims))
                c.op_types.append(self.blob(a.types))
                c.op_concrete.append(self.blob(a.concrete))
                if a.coll is not None or a.in_nelems is not None:
                    c.op_comm[len(c.op_name) - 1] = _comm(a)
            elif cat in dev_cats:
                kind = dev_cats[cat]
                if cat == "mtia_ccp_events" and e.name.startswith("dma"):
                    kind = "memcpy"  # MTIA DMA transfers
                if cat == "kernel":
                    c.kernel_events += 1
                dev["ts"].append(ts)
                dev["dur"].append(e.dur or 0.0)
                name = e.name
                c.dev_name.append(strings.setdefault(name, name))
                c.dev_kind.append(kind)
                if a is None:
                    for k in ("stream", "ext", "corr", "bytes"):
                        dev[k].append(-1)
                    continue
                dev["stream"].append(_int(a.stream, _int(e.tid)))
                dev["ext"].append(_int(a.ext))
                dev["corr"].append(_int(a.correlation))
                dev["bytes"].append(_int(a.nbytes))
                if a.coll is not None or a.in_nelems is not None:
                    c.dev_comm[len(c.dev_name) - 1] = _comm(a)
            elif cat is not None and (cat.endswith("_runtime") or cat.endswith("_driver")):
                rt["ts"].append(ts)
                rt["thread"].append(self.thread(e.pid, e.tid))
                rt["corr"].append(_int(a.correlation) if a is not None else -1)
                name = e.name
                c.rt_name.append(strings.setdefault(name, name))

    def _pair(self, e: _Event) -> _Event | None:
        """Turn a B/E pair on one thread into one complete event (returned when the E arrives)."""
        key = (e.pid, e.tid)
        if e.ph == "B":
            self.open_spans.setdefault(key, []).append(e)
            return None
        stack = self.open_spans.get(key)
        if not stack:
            return None
        begin = stack.pop()
        if begin.ts is None or e.ts is None:
            return None
        return _Event(ph="X", cat=begin.cat or e.cat, name=begin.name or e.name, pid=begin.pid, tid=begin.tid,
                      ts=begin.ts, dur=e.ts - begin.ts, args=begin.args or e.args)

    def finish(self) -> EventColumns:
        c = self.c
        f8, i8 = np.float64, np.int64
        c.dev_ts, c.dev_dur = np.asarray(self.dev["ts"], f8), np.asarray(self.dev["dur"], f8)
        c.dev_stream, c.dev_ext = np.asarray(self.dev["stream"], i8), np.asarray(self.dev["ext"], i8)
        c.dev_corr, c.dev_bytes = np.asarray(self.dev["corr"], i8), np.asarray(self.dev["bytes"], i8)
        c.op_ts, c.op_dur = np.asarray(self.op["ts"], f8), np.asarray(self.op["dur"], f8)
        c.op_thread, c.op_ext = np.asarray(self.op["thread"], i8), np.asarray(self.op["ext"], i8)
        c.op_is_annotation = np.asarray(self.op["ann"], i8).astype(bool)
        c.rt_ts, c.rt_thread = np.asarray(self.rt["ts"], f8), np.asarray(self.rt["thread"], i8)
        c.rt_corr = np.asarray(self.rt["corr"], i8)
        return c


def decode_events(events_raw) -> EventColumns:
    """Decode a raw JSON event array into EventColumns (chunked when large). Raises msgspec errors."""
    builder = _Builder()
    view = memoryview(events_raw)
    if len(view) <= CHUNK_THRESHOLD:
        builder.add(_EVENTS.decode(view))
        return builder.finish()
    raws = _RAW_LIST.decode(view)
    for start in range(0, len(raws), CHUNK_EVENTS):
        part = raws[start:start + CHUNK_EVENTS]
        chunk = b"[" + b",".join(part) + b"]"
        del part
        builder.add(_EVENTS.decode(chunk))
        del chunk
    del raws
    return builder.finish()
