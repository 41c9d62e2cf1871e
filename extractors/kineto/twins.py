"""Kernels without a launch call take the op of their twins: kernels of the same trace that look the same.

Some kernels come without their launch call, so nothing names their op or shapes: most often they were launched
before the profiler's CPU window opened (a warm-up step's work still on the GPU). Two rules name their op, from
kernels whose launch is recorded, and leave a kernel unlinked when they are not sure:

1. **Same kernel, same geometry.** A kernel's twins are the kernels with the same name and launch geometry (grid
   and block). When at least MIN_TWINS twins were all launched by the same op with the same inputs (name, Input
   Dims, Input type) in the same context (backward, optimizer), that op is the kernel's.
2. **Same sequence.** A GEMM of another K, or an element-wise kernel of another op with the same element count,
   has the same geometry, so rule 1 leaves it. But kernels without a launch come in runs (the end of a step), and
   a step repeats: where a run of at least MIN_RUN such kernels on one stream recurs kernel for kernel (name and
   geometry) among launched kernels of that stream, each position takes the op found there, when every recurrence
   agrees.

A communication kernel never borrows (its op would corrupt its sequence in its group), and a borrowed op is never
the kernel's autograd node (trace.py leaves twins out of backward linking). `benchmarks/twin_links.py` hides the
launches of the first 10% or 30% of each corpus trace's linked kernels and counts how often the rules name the
wrong op, beside simpler rules.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .classify import is_comm_kernel
from .events import EventColumns
from .linkage import Linkage, OpContext
from .sets import distinct

#: Twins that must agree before a kernel takes their op by rule 1: fewer is weak evidence (a sampled trace, or one
#: step in which an op occurs once), measured by `benchmarks/twin_links.py`.
MIN_TWINS = 3
#: Kernels a run must hold before rule 2 matches it: a short run recurs by chance.
MIN_RUN = 8


def adopt_twins(c: EventColumns, lk: Linkage) -> Linkage:
    """The linkage with the ops of kernels without a launch filled from their twins (`dev_twin` marks them)."""
    twin = twin_ops(c, lk.ops, lk.dev_op)
    borrowed = twin >= 0
    if not borrowed.any():
        return lk
    return dataclasses.replace(lk, dev_op=np.where(borrowed, twin, lk.dev_op), dev_twin=borrowed)


def twin_ops(c: EventColumns, ops: OpContext, dev_op: np.ndarray, min_twins: int = MIN_TWINS,
             min_run: int | None = MIN_RUN) -> np.ndarray:
    """Per device event, the op its twins name where its own launch is not in the trace (`dev_op` < 0), else -1.
    `min_run=None` applies rule 1 alone."""
    out = np.full(len(dev_op), -1, np.int64)
    orphan = np.zeros(len(dev_op), dtype=bool)
    for i in np.flatnonzero(dev_op < 0).tolist():
        orphan[i] = c.dev_kind[i] == "kernel" and i not in c.dev_comm and not is_comm_kernel(c.dev_name[i])
    if not orphan.any():
        return out
    _same_geometry(c, ops, dev_op, orphan, min_twins, out)
    if min_run is not None and (orphan & (out < 0)).any():
        _same_sequence(c, ops, dev_op, orphan, min_run, out)
    return out


def _launched_by(c: EventColumns, ops: OpContext, inner: int) -> tuple:
    """What launched a kernel whose innermost enclosing op is `inner`: op name, inputs and context."""
    launcher = int(ops.cpu_op[inner]) if ops.cpu_op[inner] >= 0 else inner
    return (c.op_name[launcher], c.op_dims[launcher], c.op_types[launcher], bool(ops.backward[inner]),
            bool(ops.optimizer[inner]))


def _same_geometry(c: EventColumns, ops: OpContext, dev_op: np.ndarray, orphan: np.ndarray, min_twins: int,
                   out: np.ndarray) -> None:
    """Rule 1 (module docstring), into `out`."""
    candidates = [i for i in np.flatnonzero(orphan).tolist() if c.dev_geometry[i]]
    wanted = {(c.dev_name[i], c.dev_geometry[i]) for i in candidates}
    donor: dict = {}  # signature → [what its twins were launched by, one twin's op, how many twins]
    disagree: set = set()
    for i in np.flatnonzero(dev_op >= 0).tolist():
        signature = (c.dev_name[i], c.dev_geometry[i])
        if signature not in wanted or signature in disagree:
            continue
        key = _launched_by(c, ops, int(dev_op[i]))
        seen = donor.setdefault(signature, [key, int(dev_op[i]), 0])
        seen[2] += 1
        if seen[0] != key:
            disagree.add(signature)
    for i in candidates:
        signature = (c.dev_name[i], c.dev_geometry[i])
        if signature in donor and signature not in disagree and donor[signature][2] >= min_twins:
            out[i] = donor[signature][1]


def _same_sequence(c: EventColumns, ops: OpContext, dev_op: np.ndarray, orphan: np.ndarray, min_run: int,
                   out: np.ndarray) -> None:
    """Rule 2 (module docstring), into `out` where rule 1 left a kernel unlinked."""
    codes: dict = {}
    signature = np.array([codes.setdefault((c.dev_name[i], c.dev_geometry[i]), len(codes))
                          for i in range(len(dev_op))], dtype="<u4")
    kernels = np.array([kind == "kernel" for kind in c.dev_kind], dtype=bool)
    for stream in distinct(c.dev_stream[orphan]).tolist():
        rows = np.flatnonzero((c.dev_stream == stream) & kernels)
        rows = rows[np.argsort(c.dev_ts[rows], kind="stable")]
        lost, launched = orphan[rows], dev_op[rows] >= 0
        text = signature[rows].tobytes()  # one 4-byte code per kernel: a run is found by bytes.find
        edges = np.flatnonzero(np.diff(np.concatenate(([0], lost.astype(np.int8), [0]))))
        for start, stop in zip(edges[::2].tolist(), edges[1::2].tolist()):
            if stop - start < min_run or not (out[rows[start:stop]] < 0).any():
                continue
            pattern, found = text[4 * start:4 * stop], []
            at = text.find(pattern)
            while at >= 0:
                first = at // 4
                if at % 4 == 0 and launched[first:first + stop - start].all():
                    found.append(first)
                at = text.find(pattern, at + 1)
            for offset in range(stop - start) if found else ():
                row = rows[start + offset]
                if out[row] >= 0:
                    continue
                keys = {_launched_by(c, ops, int(dev_op[rows[first + offset]])) for first in found}
                if len(keys) == 1:
                    out[row] = int(dev_op[rows[found[0] + offset]])
