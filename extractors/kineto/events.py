"""A trace's events as compact per-kind columns.

Events are decoded with typed msgspec Structs that name only the fields tracekit uses (everything else in an
event is skipped by the parser); `ColumnBuilder` reduces each batch of them to typed arrays before the next (the
chunked decoding of large arrays is `extractors.kineto.decode`'s), so peak memory stays near the size of the JSON.

Handles complete events (`X`) and begin/end pairs (`B`/`E`, paired per thread); timestamps may be integer or
float microseconds (kept as float64 µs on the file's own clock; `baseTimeNanoseconds` is reported, not added,
because adding an epoch would cost float precision).
"""
from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field
from typing import Any, overload

import msgspec
import numpy as np

_EMPTY = msgspec.Raw(b"")

#: Device activity categories (kernels and memory operations). MTIA's device events are `mtia_ccp_events`.
DEVICE_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "mtia_ccp_events": "kernel"}
#: Host-side operator categories.
OP_CATEGORIES = frozenset({"cpu_op", "user_annotation"})
_WANTS_CONCRETE = re.compile(r"attention|attn|fmha|index_select", re.I).search


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
    autograd_seq: Any = msgspec.field(name="Sequence number", default=None)
    nbytes: Any = msgspec.field(name="bytes", default=None)
    grid: msgspec.Raw = _EMPTY
    block: msgspec.Raw = _EMPTY


class Event(msgspec.Struct, gc=False):
    """One trace event, only the fields tracekit reads (everything else is skipped by the parser)."""

    ph: Any = ""
    cat: Any = None
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None


EVENTS = msgspec.json.Decoder(list[Event])

#: category → role: 0 skipped, 1 host operator, 2 device activity, 3 runtime/driver call (filled lazily)
_CATEGORY_ROLE: dict = {**{cat: 2 for cat in DEVICE_CATEGORIES}, **{cat: 1 for cat in OP_CATEGORIES}}


def _role(cat) -> int:
    role = 3 if isinstance(cat, str) and (cat.endswith("_runtime") or cat.endswith("_driver")) else 0
    if isinstance(cat, str) or cat is None:
        _CATEGORY_ROLE[cat] = role
    return role
RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])


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


def _no_rows() -> np.ndarray:
    return np.zeros(0)


@dataclass
class EventColumns:
    """The events tracekit uses, column-wise. `thread` codes index `threads` ((pid, tid) pairs)."""

    threads: list = field(default_factory=list)
    # device activity
    dev_ts: np.ndarray = field(default_factory=_no_rows)
    dev_dur: np.ndarray = field(default_factory=_no_rows)
    dev_stream: np.ndarray = field(default_factory=_no_rows)
    dev_ext: np.ndarray = field(default_factory=_no_rows)
    dev_corr: np.ndarray = field(default_factory=_no_rows)
    dev_bytes: np.ndarray = field(default_factory=_no_rows)
    dev_name: list = field(default_factory=list)
    dev_kind: list = field(default_factory=list)  # kernel | memcpy | memset
    #: a kernel's launch geometry, the raw JSON of its grid and block (b"" when not recorded), shared between equals
    dev_geometry: list = field(default_factory=list)
    dev_comm: dict = field(default_factory=dict)  # row → CommFields (generation (c): fields on the kernel)
    kernel_events: int = 0  # events of category `kernel` in the file
    # host operators (cpu_op and user_annotation)
    op_ts: np.ndarray = field(default_factory=_no_rows)
    op_dur: np.ndarray = field(default_factory=_no_rows)
    op_thread: np.ndarray = field(default_factory=_no_rows)
    op_ext: np.ndarray = field(default_factory=_no_rows)
    #: autograd sequence number (a backward node shares its forward op's; -1: none)
    op_seq: np.ndarray = field(default_factory=_no_rows)
    op_name: list = field(default_factory=list)
    op_is_annotation: np.ndarray = field(default_factory=_no_rows)
    op_dims: list = field(default_factory=list)  # raw JSON bytes of Input Dims (shared between equal values)
    op_types: list = field(default_factory=list)
    op_concrete: list = field(default_factory=list)  # Concrete Inputs, kept for attention and index_select ops
    op_comm: dict = field(default_factory=dict)  # row → CommFields
    # runtime / driver API calls
    rt_ts: np.ndarray = field(default_factory=_no_rows)
    rt_thread: np.ndarray = field(default_factory=_no_rows)
    rt_corr: np.ndarray = field(default_factory=_no_rows)
    rt_name: list = field(default_factory=list)
    # fwdbwd flow ends: (thread, ts) of the backward op each forward op links to
    bwd_flow_ends: set = field(default_factory=set)
    events_total: int = 0


@overload
def _int(value: Any, default: int = -1) -> int: ...


@overload
def _int(value: Any, default: None) -> int | None: ...


def _int(value: Any, default: int | None = -1) -> int | None:
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


class ColumnBuilder:
    """Accumulates events into typed arrays (8 bytes per value) and shared strings."""

    def __init__(self) -> None:
        self.c = EventColumns()
        self.thread_codes: dict = {}
        self.strings: dict = {}
        self.blobs: dict = {}
        self.dev: dict[str, array[Any]] = ({k: array("d") for k in ("ts", "dur")}
                                           | {k: array("q") for k in ("stream", "ext", "corr", "bytes")})
        self.op: dict[str, array[Any]] = ({k: array("d") for k in ("ts", "dur")}
                                          | {k: array("q") for k in ("thread", "ext", "ann", "seq")})
        self.rt: dict[str, array[Any]] = {"ts": array("d"), "thread": array("q"), "corr": array("q")}
        self.open_spans: dict = {}
        self.wants_concrete: dict = {}

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
        c = self.c
        c.events_total += len(events)
        strings = self.strings
        intern = strings.setdefault
        blobs = self.blobs
        thread = self.thread
        op_ts, op_dur, op_thread = self.op["ts"].append, self.op["dur"].append, self.op["thread"].append
        op_ann, op_ext, op_seq = self.op["ann"].append, self.op["ext"].append, self.op["seq"].append
        op_name, op_dims, op_types, op_conc = (c.op_name.append, c.op_dims.append, c.op_types.append,
                                               c.op_concrete.append)
        dev_ts, dev_dur, dev_stream = self.dev["ts"].append, self.dev["dur"].append, self.dev["stream"].append
        dev_ext, dev_corr, dev_bytes = self.dev["ext"].append, self.dev["corr"].append, self.dev["bytes"].append
        dev_name, dev_kind, dev_geometry = c.dev_name.append, c.dev_kind.append, c.dev_geometry.append
        rt_ts, rt_thread, rt_corr, rt_name = (self.rt["ts"].append, self.rt["thread"].append,
                                              self.rt["corr"].append, c.rt_name.append)
        roles = _CATEGORY_ROLE
        empty = _EMPTY
        wants_concrete = self.wants_concrete
        last_pid, last_tid, last_code = None, None, -1
        for e in events:
            if e.ph != "X":
                ph = e.ph
                if ph == "B" or ph == "E":
                    e = self._pair(e)
                    if e is None:
                        continue
                elif ph == "f" and e.cat == "fwdbwd" and e.ts is not None:
                    c.bwd_flow_ends.add((thread(e.pid, e.tid), float(e.ts)))
                    continue
                else:
                    continue
            cat = e.cat
            role = roles.get(cat)
            if role is None:
                role = _role(cat)
            if role == 0 or e.ts is None:
                continue
            a = e.args
            if role == 1:  # host operator
                if e.tid != last_tid or e.pid != last_pid:
                    last_pid, last_tid, last_code = e.pid, e.tid, thread(e.pid, e.tid)
                op_ts(e.ts)
                op_dur(e.dur or 0.0)
                op_thread(last_code)
                op_ann(cat == "user_annotation")
                op_name(intern(e.name, e.name))
                if a is None:
                    op_ext(-1)
                    op_seq(-1)
                    op_dims(b"")
                    op_types(b"")
                    op_conc(b"")
                    continue
                ext = a.ext
                op_ext(ext if type(ext) is int else -1 if ext is None else _int(ext))  # _int(None) is -1: no call
                value = a.autograd_seq
                op_seq(value if type(value) is int else -1 if value is None else _int(value))
                raw = a.dims
                if raw is empty:
                    op_dims(b"")
                else:
                    data = bytes(raw)
                    op_dims(blobs.setdefault(data, data))
                raw = a.types
                if raw is empty:
                    op_types(b"")
                else:
                    data = bytes(raw)
                    op_types(blobs.setdefault(data, data))
                raw = a.concrete
                if raw is empty:
                    op_conc(b"")
                else:
                    wanted = wants_concrete.get(e.name)
                    if wanted is None:
                        wanted = wants_concrete[e.name] = bool(_WANTS_CONCRETE(e.name))
                    if wanted:  # only attention ops' flags (is_causal), index_select's dim are used
                        data = bytes(raw)
                        op_conc(blobs.setdefault(data, data))
                    else:
                        op_conc(b"")
                if a.coll is not None or a.in_nelems is not None:
                    c.op_comm[len(c.op_name) - 1] = _comm(a)
            elif role == 2:  # device activity
                kind = DEVICE_CATEGORIES[cat]
                if cat == "kernel":
                    c.kernel_events += 1
                elif cat == "mtia_ccp_events" and e.name.startswith("dma"):
                    kind = "memcpy"  # MTIA DMA transfers
                dev_ts(e.ts)
                dev_dur(e.dur or 0.0)
                dev_name(intern(e.name, e.name))
                dev_kind(kind)
                if a is None:
                    dev_stream(_int(e.tid))
                    dev_ext(-1)
                    dev_corr(-1)
                    dev_bytes(-1)
                    dev_geometry(b"")
                    continue
                if a.grid is empty:
                    dev_geometry(b"")
                else:
                    data = bytes(a.grid) + b"/" + bytes(a.block)
                    dev_geometry(blobs.setdefault(data, data))
                value = a.stream
                dev_stream(value if type(value) is int else _int(value, _int(e.tid)))
                value = a.ext
                dev_ext(value if type(value) is int else -1 if value is None else _int(value))
                value = a.correlation
                dev_corr(value if type(value) is int else -1 if value is None else _int(value))
                value = a.nbytes
                dev_bytes(value if type(value) is int else -1 if value is None else _int(value))
                if a.coll is not None or a.in_nelems is not None:
                    c.dev_comm[len(c.dev_name) - 1] = _comm(a)
            else:  # runtime / driver call
                if e.tid != last_tid or e.pid != last_pid:
                    last_pid, last_tid, last_code = e.pid, e.tid, thread(e.pid, e.tid)
                rt_ts(e.ts)
                rt_thread(last_code)
                value = a.correlation if a is not None else -1
                rt_corr(value if type(value) is int else -1 if value is None else _int(value))
                rt_name(intern(e.name, e.name))

    def _pair(self, e: Event) -> Event | None:
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
        return Event(ph="X", cat=begin.cat or e.cat, name=begin.name or e.name, pid=begin.pid, tid=begin.tid,
                     ts=begin.ts, dur=e.ts - begin.ts, args=begin.args or e.args)

    def finish(self) -> EventColumns:
        c = self.c
        f8, i8 = np.float64, np.int64
        c.dev_ts, c.dev_dur = np.asarray(self.dev["ts"], f8), np.asarray(self.dev["dur"], f8)
        c.dev_stream, c.dev_ext = np.asarray(self.dev["stream"], i8), np.asarray(self.dev["ext"], i8)
        c.dev_corr, c.dev_bytes = np.asarray(self.dev["corr"], i8), np.asarray(self.dev["bytes"], i8)
        c.op_ts, c.op_dur = np.asarray(self.op["ts"], f8), np.asarray(self.op["dur"], f8)
        c.op_thread, c.op_ext = np.asarray(self.op["thread"], i8), np.asarray(self.op["ext"], i8)
        c.op_seq = np.asarray(self.op["seq"], i8)
        c.op_is_annotation = np.asarray(self.op["ann"], i8).astype(bool)
        c.rt_ts, c.rt_thread = np.asarray(self.rt["ts"], f8), np.asarray(self.rt["thread"], i8)
        c.rt_corr = np.asarray(self.rt["corr"], i8)
        return c
