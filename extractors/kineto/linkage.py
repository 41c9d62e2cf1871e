"""Link each device event to the host operator that launched it, and give every operator its context.

Kernel → operator, both generations of Kineto:
- every kernel/memcpy/memset carries the `correlation` id of its runtime/driver launch call (cudaLaunchKernel(ExC),
  cuLaunchKernel(Ex), cudaGraphLaunch, hip*LaunchKernel, cudaMemcpyAsync, ...); the launch is nested in time inside
  the innermost operator on the same thread, which is the launching op (old traces, RCCL generic kernels that carry
  only `correlation`, and new ones alike);
- newer traces also put the launching op's `External id` on the kernel, used when the launch call is missing.

One sweep over each thread's operators (sorted by start, longest first) builds the nesting, and passes down what
an operator inherits from its ancestors: backward (autograd engine / *Backward ops / fwdbwd flow targets),
optimizer step, the enclosing record_param_comms and nccl:/gloo: annotation, the innermost user annotation, the
innermost autograd node (an `evaluate_function:` span or node call carrying a `Sequence number`; a node call inside
the span of its own evaluate_function counts as that span), the outermost GEMM op inside that node (what
`backward.py` reads a backward kernel's role from) and the outermost FSDP2 copy op (`fsdp::all_gather_copy_in`, ...):
on a GPU its kernels are launched by the aten ops it calls (`_foreach_copy_`, a name optimizers use too,
`split_with_sizes_copy`, `_chunk_cat`), and are the copy's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from tracekit.core.samples import FSDP_COPIES

from .events import EventColumns

_BACKWARD = re.compile(r"(^autograd::engine::evaluate_function)|(Backward\d*$)|(backward)", re.I)
_OPTIMIZER = re.compile(r"^Optimizer\.(step|zero_grad)|optimizer\.step|^aten::_fused_(adam|sgd)|^_fused_adam", re.I)
_COMM_ANNOTATION = re.compile(r"^(nccl|gloo|rccl|hccl|mpi|ucc):", re.I)
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
#: A child may end this much after its parent (integer-µs rounding) and still be nested; beyond it, it is async.
_ESCAPE_US = 1.0
_NOT_LAYER = re.compile(r"^(ProfilerStep#|(nccl|gloo|rccl|hccl|ucc):|##|PyTorch Profiler|record_param_comms)")
#: An autograd node as the profiler records it: the engine's span, or the node call (XBackward0, custom C++ nodes).
_NODE = re.compile(r"^autograd::engine::evaluate_function: |Backward\d*$|^torch::autograd::CppNode<")
#: GEMM operators (a backward GEMM's role is read from the outermost one enclosing its launch inside the node).
_GEMM_OP = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|addbmm)$")


@dataclass
class OpContext:
    """Per host operator (row of EventColumns.op_*): nesting and inherited context (-1 = none)."""

    parent: np.ndarray
    cpu_op: np.ndarray  # nearest cpu_op ancestor-or-self
    comm_op: np.ndarray  # nearest record_param_comms ancestor-or-self
    comm_annotation: np.ndarray  # nearest nccl:/gloo: annotation ancestor-or-self
    layer: np.ndarray  # innermost user annotation that names a module/region
    backward: np.ndarray  # bool
    optimizer: np.ndarray  # bool
    top_level: np.ndarray  # bool: cpu_op without a cpu_op ancestor
    node: np.ndarray  # innermost autograd node ancestor-or-self (its evaluate_function span where recorded)
    node_gemm: np.ndarray  # outermost GEMM op between the op and its node (ancestor-or-self)
    fsdp_copy: np.ndarray  # outermost FSDP2 copy op (FSDP_COPIES) ancestor-or-self


@dataclass
class Linkage:
    ops: OpContext
    dev_op: np.ndarray  # innermost host op enclosing the launch (-1 when unknown)
    dev_launch_ts: np.ndarray  # ts of the launch call (NaN when not in the trace)
    iterations: list  # (step, start_us, end_us), sorted by start
    dev_iteration: np.ndarray  # step number, -1 outside profiler steps
    dev_twin: np.ndarray  # bool: the op is a twin's (twins.py), the kernel's own launch is not in the trace


def _name_flags(names: list) -> dict:
    flags = {}
    for name in set(names):
        flags[name] = (
            bool(_BACKWARD.search(name)),
            bool(_OPTIMIZER.search(name)),
            bool(_COMM_ANNOTATION.match(name)),
            not _NOT_LAYER.match(name),
            bool(_NODE.search(name)),
            bool(_GEMM_OP.match(name)),
            name in FSDP_COPIES,
        )
    return flags


def op_context(c: EventColumns) -> tuple[OpContext, np.ndarray]:
    """Nest operators per thread; returns their context and, per runtime call, its innermost enclosing op."""
    n_ops, n_rt = len(c.op_ts), len(c.rt_ts)
    ts = np.concatenate([c.op_ts, c.rt_ts])
    dur = np.concatenate([c.op_dur, np.zeros(n_rt)])
    thread = np.concatenate([c.op_thread, c.rt_thread])
    is_rt = np.concatenate([np.zeros(n_ops, bool), np.ones(n_rt, bool)])
    order = np.lexsort((is_rt, -dur, ts, thread))

    parent = np.full(n_ops, -1, np.int64)
    cpu_op = np.full(n_ops, -1, np.int64)
    comm_op = np.full(n_ops, -1, np.int64)
    comm_ann = np.full(n_ops, -1, np.int64)
    layer = np.full(n_ops, -1, np.int64)
    backward = np.zeros(n_ops, bool)
    optimizer = np.zeros(n_ops, bool)
    rt_op = np.full(n_rt, -1, np.int64)

    flags = _name_flags(c.op_name)
    names = c.op_name
    is_ann = c.op_is_annotation.tolist()
    ends = (c.op_ts + c.op_dur).tolist()
    ts_l, thread_l = ts.tolist(), thread.tolist()
    flow_ends = c.bwd_flow_ends
    par_l, cpu_l, cop_l, cann_l, lay_l = [-1] * n_ops, [-1] * n_ops, [-1] * n_ops, [-1] * n_ops, [-1] * n_ops
    node_l, gemm_l, copy_l = [-1] * n_ops, [-1] * n_ops, [-1] * n_ops
    seq_l = c.op_seq.tolist() if c.op_seq is not None and len(c.op_seq) == n_ops else [-1] * n_ops
    bwd_l, opt_l = [False] * n_ops, [False] * n_ops
    rt_l = [-1] * n_rt

    stack: list = []
    current_thread = None
    for idx in order.tolist():
        t = ts_l[idx]
        th = thread_l[idx]
        if th != current_thread:
            stack = []
            current_thread = th
        while stack and ends[stack[-1]] <= t:
            stack.pop()
        if idx >= n_ops:
            if stack:
                rt_l[idx - n_ops] = stack[-1]
            continue
        i = idx
        name = names[i]
        is_bwd, is_opt, is_comm_ann, is_layer, is_node, is_gemm, is_copy = flags[name]
        if stack:
            p = stack[-1]
            par_l[i] = p
            cpu_l[i] = cpu_l[p]
            cop_l[i] = cop_l[p]
            cann_l[i] = cann_l[p]
            lay_l[i] = lay_l[p]
            copy_l[i] = copy_l[p]
            bwd_l[i] = bwd_l[p] or is_bwd
            opt_l[i] = opt_l[p] or is_opt
            if bwd_l[i]:  # autograd nodes are backward ops
                node = node_l[i] = node_l[p]
                gemm_l[i] = gemm_l[p]
                if is_node and seq_l[i] >= 0 and (node < 0 or seq_l[node] != seq_l[i]):
                    node_l[i], gemm_l[i] = i, -1  # a new node (the call inside its own evaluate_function is not)
                elif is_gemm and gemm_l[p] < 0 and node >= 0:
                    gemm_l[i] = i
        else:
            bwd_l[i] = is_bwd
            opt_l[i] = is_opt
            if is_node and seq_l[i] >= 0:
                node_l[i] = i
        if not bwd_l[i] and flow_ends and (th, t) in flow_ends:
            bwd_l[i] = True
        if is_ann[i]:
            if is_comm_ann:
                cann_l[i] = i
            elif is_layer:
                lay_l[i] = i
        else:
            cpu_l[i] = i
            if name == "record_param_comms":
                cop_l[i] = i
            if is_copy and copy_l[i] < 0:
                copy_l[i] = i
        if stack and ends[i] > ends[stack[-1]] + _ESCAPE_US:
            continue  # async work record (gloo:send) outliving its caller: nothing nests inside it
        stack.append(i)

    parent[:] = par_l
    cpu_op[:] = cpu_l
    comm_op[:] = cop_l
    comm_ann[:] = cann_l
    layer[:] = lay_l
    backward[:] = bwd_l
    optimizer[:] = opt_l
    rt_op[:] = rt_l
    top_level = ~c.op_is_annotation & (np.where(parent >= 0, cpu_op[np.maximum(parent, 0)], -1) < 0)
    node = np.asarray(node_l, np.int64) if n_ops else np.full(0, -1, np.int64)
    node_gemm = np.asarray(gemm_l, np.int64) if n_ops else np.full(0, -1, np.int64)
    fsdp_copy = np.asarray(copy_l, np.int64) if n_ops else np.full(0, -1, np.int64)
    return (OpContext(parent, cpu_op, comm_op, comm_ann, layer, backward, optimizer, top_level, node, node_gemm,
                      fsdp_copy), rt_op)


def _lookup(keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """For each query, the value at the matching key (first occurrence), or -1."""
    if len(keys) == 0:
        return np.full(len(queries), -1, np.int64)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    pos = np.clip(np.searchsorted(sorted_keys, queries), 0, len(keys) - 1)
    found = (sorted_keys[pos] == queries) & (queries >= 0)
    return np.where(found, values[order][pos], -1)


def profiler_steps(c: EventColumns) -> list:
    """(step number, start µs, end µs) of every ProfilerStep#N annotation, sorted by start."""
    steps = []
    for i, name in enumerate(c.op_name):
        if name.startswith("ProfilerStep#"):
            m = _STEP.match(name)
            if m:
                steps.append((int(m.group(1)), float(c.op_ts[i]), float(c.op_ts[i] + c.op_dur[i])))
    steps.sort(key=lambda s: s[1])
    return steps


def link(c: EventColumns) -> Linkage:
    ops, rt_op = op_context(c)
    rt_index = _lookup(c.rt_corr, np.arange(len(c.rt_corr)), c.dev_corr)
    has_rt = rt_index >= 0
    dev_op = np.where(has_rt, rt_op[np.maximum(rt_index, 0)] if len(rt_op) else -1, -1)
    launch_ts = np.where(has_rt, c.rt_ts[np.maximum(rt_index, 0)] if len(c.rt_ts) else np.nan, np.nan)
    # newer traces: the kernel's External id names its op (used where the launch call is missing)
    new_generation = bool(np.any((c.dev_ext >= 0) & (c.dev_ext != c.dev_corr)))
    if new_generation:
        missing = (dev_op < 0) & (c.dev_ext >= 0)
        if missing.any():
            by_ext = _lookup(c.op_ext, np.arange(len(c.op_ext)), c.dev_ext[missing])
            dev_op[missing] = by_ext
    steps = profiler_steps(c)
    dev_iteration = np.full(len(c.dev_ts), -1, np.int64)
    if steps:
        starts = np.array([s[1] for s in steps])
        stops = np.array([s[2] for s in steps])
        numbers = np.array([s[0] for s in steps])
        when = np.where(np.isnan(launch_ts), c.dev_ts, launch_ts)
        pos = np.searchsorted(starts, when, side="right") - 1
        ok = (pos >= 0) & (when <= stops[np.maximum(pos, 0)])
        dev_iteration = np.where(ok, numbers[np.maximum(pos, 0)], -1)
    return Linkage(ops, dev_op.astype(np.int64), launch_ts, steps, dev_iteration,
                   np.zeros(len(dev_op), dtype=bool))
