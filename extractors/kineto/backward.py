"""Backward kernels → the forward operator whose gradient they compute, and their role in its backward.

Linking. Autograd stamps every node with the `Sequence number` of the forward op that created it: the forward
`aten::addmm` and the backward `autograd::engine::evaluate_function: AddmmBackward0` (and the `AddmmBackward0`
call inside it) carry the same number. Kineto draws its `fwdbwd` flow events from these same numbers, so they add
nothing where the numbers are recorded. A kernel launched inside a node's span (linkage's `OpContext.node`) is part
of that node's backward, except the engine's accumulation of gradients that reach one tensor from several consumers
(an `aten::add`/`add_` the evaluate_function span itself runs: it belongs to the tensor, not to this op). The
forward op is the operator outside backward with the node's number: the only one, or else the one named like the
node (NativeLayerNormBackward0 → aten::native_layer_norm, where the composite aten::layer_norm shares the number);
anything else leaves the node unlinked.

Roles. For a GEMM-family forward op (primitive gemm or bmm) C = A·B, A [M × K] (the activation), B [K × N] (the
weight of a linear), the node runs
- `dgrad`: dA = dC·Bᵀ — a GEMM contracting over N with an M × K output, own (m, n, k) = (M, K, N);
- `wgrad`: dB = Aᵀ·dC — contracting over M, output K × N: (K, N, M), or its transpose dBᵀ = dCᵀ·A: (N, K, M);
- `bgrad`: the reduction of dC to the bias (`aten::sum`, the engine's sum_to of addmm's broadcast bias).
A GEMM kernel's role is read from the outermost GEMM op around its launch in the node (so a split-K reduction kernel
of the wgrad `aten::mm` is wgrad too): its own shapes against the forward op's, by the contraction dimension and the
output dimensions above. Launch order is no guide on its own: in the corpus AddmmBackward0 runs dgrad first while
MmBackward0 and most BmmBackward0 run wgrad first. Where both readings fit (M = N), the node's other GEMM op, when
its shapes tell, takes the other role; where both fit for both, they are GEMMs of one shape and are called dgrad and
wgrad in launch order. Without recorded shapes a GEMM's role stays unknown. Kernels of other forward ops' nodes
(norm, activation, softmax, attention, ...) are together the `whole` backward of their op. Linked kernels carry
the forward op's primitive, dtype and shape features (the seed paper's `bwd` convention), so the per-role rows of
one node sum to its whole backward.

Kernels that cannot be linked (no node, no forward op, an unclassified forward op, a GEMM op whose role its shapes
do not tell, other work inside a GEMM's node) keep their own launching op's features and no role (the
ingest report counts them).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .classify import is_pointwise_op, op_primitive
from .events import EventColumns
from .linkage import Linkage
from .sets import distinct, members
from .shapes import op_features

#: Role of the kernels of a non-GEMM node (tracekit.core.samples.ROLES names them all).
WHOLE = "whole"
_ENGINE_ACCUMULATE = frozenset({"aten::add", "aten::add_"})
_WRAPPER = "autograd::engine::evaluate_function: "
_NODE_NAME = re.compile(r"(\w+?)Backward\d*$")


def backward_node_op(name: str) -> str | None:
    """'autograd::engine::evaluate_function: AddmmBackward0' → 'aten::addmm' (None: the name is no backward node)."""
    m = _NODE_NAME.search(name)
    if not m:
        return None
    return "aten::" + re.sub(r"(?<!^)(?=[A-Z])", "_", m.group(1)).lower()


def forward_by_sequence(c: EventColumns, backward: np.ndarray, wanted: np.ndarray | None = None
                        ) -> dict[int, list[int]]:
    """Autograd sequence number (of those `wanted`, default all) → the forward operators that carry it (several
    where composites share it)."""
    mask = (c.op_seq >= 0) & ~backward & ~c.op_is_annotation
    if wanted is not None:
        mask &= members(c.op_seq, distinct(wanted))
    out: dict[int, list[int]] = {}
    rows = np.flatnonzero(mask)
    for i, seq in zip(rows.tolist(), c.op_seq[rows].tolist()):
        out.setdefault(seq, []).append(i)
    return out


def forward_op(forward: dict[int, list[int]], names: list, seq: int, op: str | None) -> int:
    """The forward operator of a backward node with sequence number `seq` whose name maps to `op`: the only operator
    with that number, or the one named `op` among several; -1 if none or ambiguous."""
    found = forward.get(seq, ()) if seq >= 0 else ()
    if len(found) == 1:
        return found[0]
    named = [j for j in found if names[j] == op]
    return named[0] if len(named) == 1 else -1


def gemm_role(fwd: dict, own: dict) -> str | None:
    """'dgrad' or 'wgrad' from a backward GEMM's own (m, n, k, batch) against its forward op's (module docstring);
    'either' when both readings fit (M = N: the two are GEMMs of one shape), None when neither does or shapes are
    missing."""
    try:
        big_m, big_n, big_k = fwd["m"], fwd["n"], fwd["k"]
        m, n, k = own["m"], own["n"], own["k"]
    except KeyError:
        return None
    if fwd.get("batch", 1.0) != own.get("batch", 1.0):
        return None
    dgrad = k == big_n and {m, n} == {big_m, big_k}
    wgrad = k == big_m and {m, n} == {big_k, big_n}
    if dgrad and wgrad:
        return "either"
    return "dgrad" if dgrad else "wgrad" if wgrad else None


@dataclass
class BackwardLinks:
    """Per device event: its node and forward op (op rows, -1 when unlinked), the forward op's primitive and the
    event's role (None when unlinked)."""

    node: np.ndarray
    forward: np.ndarray
    primitive: list
    role: list


def _features(c: EventColumns, i: int, primitive: str) -> tuple:
    return op_features(c.op_name[i], primitive, c.op_dims[i], c.op_types[i], c.op_concrete[i])


def _forward_primitive(name: str) -> str | None:
    primitive = op_primitive(name)
    if primitive is None and is_pointwise_op(name):
        primitive = "elementwise"
    return None if primitive in (None, "other", "optimizer") else primitive


def link_backward(c: EventColumns, lk: Linkage, candidates: np.ndarray) -> BackwardLinks:
    """Roles of the device events `candidates` (a bool mask: computation kernels launched in backward)."""
    n = len(c.dev_ts)
    node_of = np.full(n, -1, np.int64)
    fwd_of = np.full(n, -1, np.int64)
    role: list = [None] * n
    prim_of: list = [None] * n
    ctx, names = lk.ops, c.op_name
    dev_op = lk.dev_op
    rows = np.flatnonzero(candidates & (dev_op >= 0))
    rows = rows[ctx.node[dev_op[rows]] >= 0]
    forward = forward_by_sequence(c, ctx.backward, distinct(c.op_seq[ctx.node[dev_op[rows]]])) if len(rows) else {}
    nodes: dict[int, tuple[int, str | None]] = {}  # node → (forward op, its primitive)
    gemm_ops: dict[int, list[int]] = {}  # node → its GEMM ops in launch order
    gemm_of: dict[int, int] = {}  # device event → the GEMM op its role is read from
    ops = dev_op[rows]
    launchers = ctx.cpu_op[ops]
    callers = np.where(launchers >= 0, ctx.parent[np.maximum(launchers, 0)], -1) if len(ops) else launchers
    columns = (rows, ctx.node[ops], launchers, callers, ctx.node_gemm[ops])
    for d, node, launcher, caller, gemm in zip(*(col.tolist() for col in columns)):
        if node not in nodes:
            fwd = forward_op(forward, names, int(c.op_seq[node]), backward_node_op(names[node]))
            nodes[node] = (fwd, _forward_primitive(names[fwd]) if fwd >= 0 else None)
        fwd, primitive = nodes[node]
        if primitive is None:
            continue
        if caller == node and launcher >= 0 and names[launcher] in _ENGINE_ACCUMULATE \
                and names[node].startswith(_WRAPPER):
            continue  # the engine adding up a tensor's gradients from several consumers
        node_of[d], fwd_of[d] = node, fwd
        if primitive not in ("gemm", "bmm"):
            role[d] = WHOLE
        elif gemm >= 0:
            node_gemms = gemm_ops.setdefault(node, [])
            if gemm not in node_gemms:
                node_gemms.append(gemm)
            gemm_of[d] = gemm  # resolved below, once all of the node's GEMM ops are known
        elif launcher >= 0 and names[launcher] == "aten::sum":
            role[d] = "bgrad"
    resolved = _gemm_roles(c, nodes, gemm_ops)
    for d, gemm in gemm_of.items():
        role[d] = resolved.get(gemm)
    for d in rows.tolist():
        if role[d] is None:
            node_of[d], fwd_of[d] = -1, -1
        else:
            prim_of[d] = nodes[int(node_of[d])][1]
    return BackwardLinks(node_of, fwd_of, prim_of, role)


def _gemm_roles(c: EventColumns, nodes: dict, gemm_ops: dict) -> dict[int, str]:
    """Role of each GEMM op inside a GEMM node, from shapes (module docstring)."""
    out: dict[int, str] = {}
    for node, ops in gemm_ops.items():
        fwd, primitive = nodes[node]
        ops.sort(key=lambda i: c.op_ts[i])
        fwd_shape = dict(_features(c, fwd, primitive)[1])
        by_shape = [gemm_role(fwd_shape, dict(_features(c, op, primitive)[1])) for op in ops]
        if by_shape == ["either", "either"]:
            by_shape = ["dgrad", "wgrad"]  # one GEMM shape twice: called by launch order (addmm's)
        elif len(ops) == 2 and "either" in by_shape and set(by_shape) - {"either"} <= {"dgrad", "wgrad"}:
            known = next(r for r in by_shape if r != "either")
            by_shape = [r if r != "either" else ("wgrad" if known == "dgrad" else "dgrad") for r in by_shape]
        for op, value in zip(ops, by_shape):
            if value in ("dgrad", "wgrad"):
                out[op] = value
    return out
