"""The schedule simulation's inputs of one prepared graph: each pipeline segment's forward and backward work for
one micro-batch (compute, blocking communication, other), and per stage the gradient-sync buckets, the embedding
sync, the optimizer step and the parameter gather.

    simulation_inputs(graph, est, cal) -> (calibrated µs per spec, (fwd, bwd, micro-batches, options))
    simulate_graph(graph, est, cal) -> (calibrated µs per spec, fwd, bwd, Timeline): one graph on its own (what
        calibration fitting repeats)
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .estimates import calibrated_durations
from .schedule import Work, simulate_many

if TYPE_CHECKING:
    from .calibration import Calibration
    from .estimates import Estimates
    from .graph import Graph, OpUse
    from .schedule import Timeline


def _work(ops: list[OpUse], dur: np.ndarray, layers: int, cal: Calibration, framework_us: float = 0.0,
          hiding: np.ndarray | None = None) -> Work:
    """One micro-batch of a segment's forward or backward. A layer pass's compute lasts at least the host time to
    issue its compute operators (`host_op_us` each: a launch-bound layer waits on the CPU); the excess, and the
    framework time per compute operator no device hides (sampled: `framework_us`, plus the calibration's
    `op_overhead_us`), count as `other`. Blocking collectives add to it, except the TP ones that `hiding` (a mask
    of the specs whose kernels run beside TP communication: the GEMMs, with Transformer Engine's TP overlap) can
    cover: a layer pass then exposes only the TP time beyond its GEMMs'."""
    compute = comm = layer_compute = layer_comm = layer_cover = 0.0
    layer_ops = other_ops = 0
    for op in ops:
        t = float(dur[op.spec])
        if op.per_layer:
            if op.group:
                layer_comm += t
            else:
                layer_compute += t
                layer_ops += 1
                if hiding is not None and hiding[op.spec]:
                    layer_cover += t
        elif op.group:
            comm += op.count * t
        else:
            compute += op.count * t
            other_ops += op.count
    excess = max(0.0, cal.host_op_us * layer_ops - layer_compute)
    framework = (framework_us + cal.op_overhead_us) * (layer_ops * layers + other_ops)
    if hiding is not None:
        layer_comm = max(0.0, layer_comm - layer_cover)
    return Work(compute + layer_compute * layers, comm + layer_comm * layers,
                cal.microbatch_overhead_us + excess * layers + framework)


def simulation_inputs(graph: Graph, est: Estimates, cal: Calibration) -> tuple[np.ndarray, tuple]:
    """Calibrated durations and the schedule simulation's job (fwd, bwd, micro-batches, options) of one graph."""
    c = graph.config
    pp, vp = c.pp, c.vp
    dur = calibrated_durations(graph, est, cal)
    hiding = np.array([spec["primitive"] == "gemm" for spec in graph.specs]) \
        if c.tp_comm_overlap and c.sequence_parallel else None  # TE overlaps TP comm only with SP
    fwd = [[_work(graph.segment(s, k).fwd, dur, graph.segment(s, k).layers, cal, est.framework_us.get("fwd", 0.0),
                  hiding) for k in range(vp)] for s in range(pp)]
    bwd = [[_work(graph.segment(s, k).bwd, dur, graph.segment(s, k).layers, cal, est.framework_us.get("bwd", 0.0),
                  hiding) for k in range(vp)] for s in range(pp)]
    buckets = [[float(dur[o.spec]) for o in graph.grad_sync[s] if o.group == "dp"] for s in range(pp)]
    embd = [float(sum(dur[o.spec] for o in graph.grad_sync[s] if o.group == "embd")) for s in range(pp)]
    optimizer = [float(dur[graph.optimizer[s].spec]) for s in range(pp)]
    gather = [float(sum(dur[o.spec] for o in graph.param_gather[s])) for s in range(pp)]
    options = dict(
        p2p_us=float(dur[graph.p2p]) if graph.p2p is not None else 0.0,
        grad_buckets_us=buckets, overlap_grad=c.overlap_grad_reduce, embedding_sync_us=embd,
        optimizer_us=optimizer, param_gather_us=gather, overlap_param_gather=c.overlap_param_gather,
        iteration_overhead_us=cal.iteration_overhead_us, overlap_p2p=c.overlap_p2p_comm and vp > 1,
    )
    return dur, (fwd, bwd, c.num_microbatches, options)


def simulate_graph(graph: Graph, est: Estimates, cal: Calibration
                   ) -> tuple[np.ndarray, list[list[Work]], list[list[Work]], Timeline]:
    """Calibrated durations, per-segment work and the simulated timeline (the cheap part of `compose`, which
    calibration fitting repeats)."""
    dur, job = simulation_inputs(graph, est, cal)
    return dur, job[0], job[1], simulate_many([job])[0]
