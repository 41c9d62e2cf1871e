"""CPU-only runs (torch.profiler on CPU, gloo collectives): top-level operators and collectives as device events.

Without GPU kernels, an operator's own duration is its time: tracekit times the top-level aten operators (those
with no enclosing cpu_op on their thread; nested ops are part of their parent's time) and the gloo collectives
(`gloo:<kind>` annotations, on gloo's worker threads or, for send/recv, inside the issuing c10d:: call; where
a trace has none, record_param_comms or the c10d:: call itself: otherwise that call only enqueues the work).
gloo runs a reduce-scatter as an all-reduce of the whole buffer on a worker thread; such work is matched to the
`c10d::` call that issued it (same process, issued before it, holding its buffer; first come, first served) and
recorded as the reduce-scatter it was asked for, with the output shard as its message (the convention of samples);
`launch_ts_us` is the call's start and `blocked_us` what the calling thread waited for it, up to its next operator
or the end of the top-level operator the call is in (a collective's sample duration on a CPU run, as `tracekit
sample` times a call). A collective issued inside a top-level operator (tensor parallelism's all-reduces inside
autograd functions, `_ReduceFromTP`) is a row of its own: that operator's row leaves out the call and the wait.
A backward node (`autograd::engine::evaluate_function: AddmmBackward0`) is the whole backward of the forward op
that shares its autograd `Sequence number` (role `whole`, linked as in backward.py); it takes that op's name and
input shapes (the convention of sampled `bwd` rows). FSDP2's backward hooks run inside the autograd node whose
gradient triggers them (a layer's gather before its backward inside the node of the op after it, its reduce-scatter
inside `RegisterPostBackwardFunctionBackward`): a top-level op's time leaves out the FSDP ranges nested in it, and
the copies inside those ranges (tracekit.core.samples.FSDP_COPIES) are rows of their own, as in forward.
Hardware is `cpu-<model>` from the trace's top-level `cpu_model` key (add it while profiling with
`prof.add_metadata("cpu_model", ...)`: tracekit's capture writes `cpu_hardware_id()` without `cpu-`, a raw model
name comes out as its slug, the earlier id rule that this machine's CPU still answers to); torch does not record
the CPU model itself, so other CPU traces get `cpu-unknown`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tracekit.core.hardware import normalize_hardware
from tracekit.core.samples import FEATURE_COLUMNS, FSDP_COPIES

from .backward import WHOLE, backward_node_op, forward_by_sequence, forward_op
from .classify import collective_kind, is_pointwise_op, op_primitive
from .collectives import assign_sequence, comm_info
from .columns import EVENT_COLUMNS
from .events import EventColumns
from .fsdp import fsdp_unit, unit_or_label
from .linkage import link
from .sets import distinct
from .shapes import json_list, op_features, tensor_bytes
from .table import EventTable


def cpu_hardware(model: str | None) -> str:
    return normalize_hardware("cpu-" + model) if model else "cpu-unknown"


def cpu_events(c: EventColumns, world_size: int | None) -> EventTable:
    """The device events of a CPU run (the same columns as a GPU trace's)."""
    lk = link(c)
    ctx = lk.ops
    names = c.op_name
    rows: list[dict[str, Any]] = []
    comm_rows: list[int] = []
    comm_recorded: list[int | None] = []
    comm_pg: list[str | None] = []
    comm_ts: list[float] = []
    annotated_comms = bool(np.any(ctx.comm_annotation == np.arange(len(names))))
    forward = forward_by_sequence(c, ctx.backward)
    issuer = _issuing_calls(c, ctx) if annotated_comms else {}
    outer = _top_level_ancestors(ctx)
    blocked = _blocked_us(c, outer, issuer) if issuer else {}
    hooks, hooked_copies = _fsdp_hooks(c, ctx)
    for q, spans in _collective_waits(c, ctx, outer, blocked).items():
        hooks.setdefault(q, []).extend(spans)
    left_out = {q: _union_us(spans) for q, spans in hooks.items()}
    for i in range(len(names)):
        name = names[i]
        is_ann = bool(c.op_is_annotation[i])
        comm_ann = is_ann and int(ctx.comm_annotation[i]) == i
        caller = int(ctx.cpu_op[i])
        if is_ann and not (comm_ann and (caller < 0 or _is_comm_call(names[caller]))):
            continue
        if not is_ann and not ctx.top_level[i] and i not in hooked_copies:
            continue
        dur = float(c.op_dur[i]) - left_out.get(i, 0.0)
        if dur <= 0:
            continue
        c10d = _is_comm_call(name)
        if c10d and annotated_comms:
            continue  # the issuing call of a collective whose work is timed by its gloo: annotation
        row: dict[str, Any] = {key: None for key in EVENT_COLUMNS}
        row.update(ts_us=float(c.op_ts[i]), dur_us=dur, name=name, op=name, kind="cpu_op",
                   stream=int(c.threads[int(c.op_thread[i])][1]) if isinstance(c.threads[int(c.op_thread[i])][1], int)
                   else -1)
        if comm_ann or c10d or name == "record_param_comms":
            ann = int(ctx.comm_annotation[i]) if comm_ann else _child_annotation(ctx, i)
            fields = c.op_comm.get(i if not is_ann else int(ctx.comm_op[i]))
            info = comm_info(name, fields, names[ann] if ann >= 0 else name,
                             (c.op_dims[ann], c.op_types[ann]) if ann >= 0 else None,
                             (c.op_dims[i], c.op_types[i]), world_size)
            kind, nbytes = info.primitive, info.bytes
            call = issuer.get(i, -1)
            if call >= 0:
                row["launch_ts_us"] = float(c.op_ts[call])
                row["blocked_us"] = blocked[call]
            if call >= 0 and kind == "all_reduce" and collective_kind(names[call]) == "reduce_scatter":
                shard, _ = tensor_bytes(c.op_dims[call], c.op_types[call], count=1)  # the output, first
                kind, nbytes = "reduce_scatter", float(shard) if shard else nbytes
            row.update(category="communication", primitive=kind, dtype=info.dtype,
                       process_group=info.process_group, process_group_desc=info.process_group_desc,
                       bytes=nbytes, group_size=info.group_size, **{"pass": "comm"})
            comm_rows.append(len(rows))
            comm_recorded.append(info.seq)
            comm_pg.append(info.process_group)
            comm_ts.append(row["ts_us"])
        else:
            shaped = i
            if "::" in name and not name.startswith("autograd::"):
                op = name
            else:
                op = backward_node_op(name) or name
                shaped = forward_op(forward, names, int(c.op_seq[i]), op) if op != name else -1
                op = names[shaped] if shaped >= 0 else op
            primitive = op_primitive(op) or ("elementwise" if is_pointwise_op(op) else "other")
            if ctx.optimizer[i] and primitive not in ("gemm", "bmm"):
                primitive = "optimizer"
            row.update(category="computation", primitive=primitive,
                       **{"pass": "optimizer" if ctx.optimizer[i] else ("bwd" if ctx.backward[i] else "fwd")})
            if primitive not in ("other", "optimizer") and shaped >= 0:  # an optimizer sample is a whole step
                dtype, values = op_features(op, primitive, c.op_dims[shaped], c.op_types[shaped],
                                            c.op_concrete[shaped])
                row["dtype"] = dtype
                row.update(dict(values))
                if shaped != i:  # a backward node linked to its forward op: that op's whole backward
                    row.update(role=WHOLE, fwd_op=op, bwd_node=i)
        layer = int(ctx.layer[i])
        if layer < 0 and row["category"] == "communication" and issuer.get(i, -1) >= 0:
            # gloo work runs on its own thread: an FSDP collective takes the unit of the range that issued it
            issued_in = int(ctx.layer[issuer[i]])
            layer = issued_in if issued_in >= 0 and fsdp_unit(names[issued_in]) is not None else -1
        row["layer"] = unit_or_label(names[layer]) if layer >= 0 else None
        rows.append(row)
    n = len(rows)
    columns: dict[str, Any] = {key: [row[key] for row in rows] for key in EVENT_COLUMNS}
    for col in ("ts_us", "dur_us", *FEATURE_COLUMNS, "wait_us", "launch_ts_us", "blocked_us"):
        columns[col] = np.array(columns[col], dtype=np.float64)  # None → NaN
    columns["bwd_node"] = np.array([-1 if node is None else node for node in columns["bwd_node"]], dtype=np.int64)
    columns["op_from_twin"] = np.zeros(n, dtype=bool)  # every row is an op of the trace itself
    seq_col: list[int | None] = [None] * n
    if comm_rows:
        seqs = assign_sequence(comm_pg, [rows[r]["primitive"] for r in comm_rows],
                               np.argsort(np.asarray(comm_ts), kind="stable"), comm_recorded)
        for at, seq in zip(comm_rows, seqs):
            seq_col[at] = seq
    columns["comm_seq"] = seq_col
    columns["iteration"] = np.full(n, -1, dtype=np.int64)
    starts = np.array([s[1] for s in lk.iterations])
    if len(starts) and n:
        stops = np.array([s[2] for s in lk.iterations])
        numbers = np.array([s[0] for s in lk.iterations])
        ts = columns["ts_us"]
        pos = np.searchsorted(starts, ts, side="right") - 1
        ok = (pos >= 0) & (ts <= stops[np.maximum(pos, 0)])
        columns["iteration"] = np.where(ok, numbers[np.maximum(pos, 0)], -1)
    columns["stream"] = np.array(columns["stream"], dtype=np.int64)
    return EventTable(columns)


def _fsdp_hooks(c: EventColumns, ctx) -> tuple[dict[int, list[tuple[float, float]]], set[int]]:
    """FSDP2's hooks inside top-level operators (module docstring): the spans of the outermost FSDP ranges nested in
    each such op, and the FSDP copies directly inside those ranges (no other operator between the copy and its range:
    an `aten::` op a copy calls is part of the copy)."""
    names, parent, n = c.op_name, ctx.parent, len(c.op_name)
    hooks: dict[int, list[tuple[float, float]]] = {}
    copies: set[int] = set()
    candidates = [i for i in np.flatnonzero(c.op_is_annotation | ~ctx.top_level).tolist()
                  if names[i] in FSDP_COPIES or (c.op_is_annotation[i] and names[i].startswith("FSDP::"))]
    for i in candidates:
        in_range, q = False, int(parent[i])
        while 0 <= q < n and not ctx.top_level[q]:
            if not c.op_is_annotation[q] and names[i] in FSDP_COPIES and not in_range:
                break  # a copy inside another operator within the range: that operator's
            in_range = in_range or (bool(c.op_is_annotation[q]) and fsdp_unit(names[q]) is not None)
            q = int(parent[q])
        if not (0 <= q < n and ctx.top_level[q]):
            continue
        if names[i] in FSDP_COPIES and in_range:
            copies.add(i)
        elif c.op_is_annotation[i] and fsdp_unit(names[i]) is not None and not in_range:
            hooks.setdefault(q, []).append((float(c.op_ts[i]), float(c.op_ts[i] + c.op_dur[i])))
    return hooks, copies


def _collective_waits(c: EventColumns, ctx, outer: np.ndarray, blocked: dict[int, float]
                      ) -> dict[int, list[tuple[float, float]]]:
    """Collectives issued inside a top-level operator (module docstring), per such op: the spans of the `c10d::`
    calls nested in it, each as long as its thread was blocked on the call's gloo work where it waited for it."""
    names, parent, n = c.op_name, ctx.parent, len(c.op_name)
    out: dict[int, list[tuple[float, float]]] = {}
    for call in np.flatnonzero(~ctx.top_level & ~c.op_is_annotation).tolist():
        if not _is_comm_call(names[call]) or (0 <= parent[call] < n and _is_comm_call(names[int(parent[call])])):
            continue  # not a call, or the inner call of one (record_param_comms inside c10d::allreduce_)
        q = int(outer[call])
        if q < 0:
            continue
        waited = blocked.get(call, float("nan"))
        span = waited if waited == waited else float(c.op_dur[call])  # NaN: asynchronous, the call's own time
        out.setdefault(q, []).append((float(c.op_ts[call]), float(c.op_ts[call]) + span))
    return out


def _union_us(spans: list[tuple[float, float]]) -> float:
    """µs covered by the union of `spans` (an FSDP range and a wait inside it count once)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _issuing_calls(c: EventColumns, ctx) -> dict[int, int]:
    """gloo: annotation on a worker thread → the c10d:: call that issued it (same process, started no later, one of
    its tensors has the annotation's first shape; each call issues one piece of work, matched in start order)."""
    names, pid = c.op_name, [c.threads[int(t)][0] for t in c.op_thread]
    by_start = np.argsort(c.op_ts, kind="stable")
    calls = [i for i in by_start if names[i].startswith("c10d::") and not c.op_is_annotation[i]]
    work = [i for i in by_start if c.op_is_annotation[i] and int(ctx.comm_annotation[i]) == i
            and int(ctx.cpu_op[i]) < 0]
    shapes: dict[int, list] = {}
    open_calls: list[int] = []
    out, k = {}, 0
    for i in work:
        while k < len(calls) and c.op_ts[calls[k]] <= c.op_ts[i]:
            call = int(calls[k])
            open_calls.append(call)
            shapes[call] = _tensor_shapes(json_list(c.op_dims[call]))  # parsed once, not per work item
            k += 1
        first = (json_list(c.op_dims[i]) or [None])[0]
        for j, call in enumerate(open_calls):
            if pid[call] == pid[i] and first in shapes[call]:
                out[int(i)] = open_calls.pop(j)
                break
    return out


def _tensor_shapes(dims: list) -> list:
    """Every tensor shape of an op's Input Dims, TensorList arguments ([[shape], ...]) unpacked."""
    out = []
    for arg in dims:
        if arg and all(isinstance(x, list) for x in arg):
            out.extend(arg)
        else:
            out.append(arg)
    return out


def _top_level_ancestors(ctx) -> np.ndarray:
    """Per operator, its top-level ancestor-or-self (-1: none, an annotation outside every operator): its nearest
    operator ancestor-or-self (`cpu_op`), climbed operator by operator until none is above."""
    top = ctx.cpu_op.copy()
    while True:
        parent = np.where(top >= 0, ctx.parent[np.maximum(top, 0)], -1)
        above = np.where(parent >= 0, ctx.cpu_op[np.maximum(parent, 0)], -1)
        if not (above >= 0).any():
            return top
        top = np.where(above >= 0, above, top)


def _blocked_us(c: EventColumns, outer: np.ndarray, issuer: dict[int, int]) -> dict[int, float]:
    """Per `c10d::` call that issued gloo work: how long its thread waited for that work, from the call to the next
    operator on the thread after the call (or the end of the top-level operator around the call, if sooner). NaN
    when the thread went on before the work ended (an asynchronous call: nothing was waited for)."""
    ops = np.flatnonzero(~c.op_is_annotation)
    starts = {int(t): np.sort(c.op_ts[ops[c.op_thread[ops] == t]]) for t in distinct(c.op_thread[ops])}
    out = {}
    for work, call in issuer.items():
        mine = starts[int(c.op_thread[call])]
        after = float(c.op_ts[call] + c.op_dur[call])
        nxt = int(np.searchsorted(mine, after))
        resume = float(mine[nxt]) if nxt < len(mine) else float("inf")
        q = int(outer[call])
        if q >= 0 and q != call:
            resume = min(resume, float(c.op_ts[q] + c.op_dur[q]))
        work_end = float(c.op_ts[work] + c.op_dur[work])
        if resume == float("inf"):
            resume = work_end
        out[call] = float("nan") if resume < work_end else resume - float(c.op_ts[call])
    return out


def _is_comm_call(name: str) -> bool:
    """The host-side call that issues a collective (c10d::allreduce_, c10d::send, record_param_comms)."""
    return name.startswith("c10d::") or name == "record_param_comms"


def _child_annotation(ctx, i: int) -> int:
    """The gloo:/nccl: annotation directly inside record_param_comms `i` (-1 if none)."""
    children = np.flatnonzero((ctx.parent == i) & (ctx.comm_annotation >= 0))
    return int(children[0]) if len(children) else -1
