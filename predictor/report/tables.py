"""A prediction's report tables, from its graph, calibrated durations and simulated timeline (the `Prediction`
properties and fields of `predictor.predict` that are lists of rows):

    instance_counts(graph)                      instances per iteration of every spec on one GPU of each stage,
                                                an array (pp, specs)
    operators(graph, dur, counts)               per stage and (primitive, pass): time and instances per iteration
    top_operators(graph, dur, stage, seconds)   a stage's operators by time per iteration (top 10)
    per_stage(graph, fwd, bwd, timeline)        per stage: forward and backward of one micro-batch, busy and idle
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from predictor.ir.graph import Graph
from predictor.ir.ops import OpUse

if TYPE_CHECKING:
    from predictor.schedule.pipeline import Timeline, Work


def stage_ops(graph: Graph, stage: int):
    """(op, instances per iteration) of everything one GPU of `stage` runs."""
    m = graph.config.num_microbatches
    for k in range(graph.config.vp):
        seg = graph.segment(stage, k)
        for op in seg.fwd:
            yield op, op.count * m
        for op in seg.bwd:
            yield op, op.count * m
    if graph.p2p is not None:
        sends = (graph.config.vp * 2 - (stage == 0) - (stage == graph.config.pp - 1)) * m
        yield OpUse("p2p.send_recv", graph.p2p, group="pp"), sends
        if graph.p2p_gather is not None:
            yield OpUse("p2p.gather", graph.p2p_gather, group="tp"), sends
    for op in graph.grad_sync[stage] + graph.param_gather[stage]:
        yield op, 1
    for op in graph.casts.get(stage, []):  # weight casts once, Muon's iterations `count` times
        yield op, op.count
    yield graph.optimizer[stage], 1
    yield from graph.reports.get(stage, [])  # the loss report; the logging barrier 1/log_interval times


def instance_counts(graph: Graph) -> np.ndarray:
    """Instances per iteration of every spec on one GPU of each stage, shape (pp, specs)."""
    counts = np.zeros((graph.config.pp, len(graph.specs)))
    for stage in range(graph.config.pp):
        row = counts[stage]
        for op, n in stage_ops(graph, stage):
            row[op.spec] += n
    return counts


def operators(graph: Graph, dur: np.ndarray, counts: np.ndarray) -> list[dict]:
    """Per stage, per (primitive, pass): time and instances per iteration (a spec's pass: recomputed forward ops
    are `fwd`, collectives and P2P `comm`)."""
    keys = [(s["primitive"], s["pass"]) for s in graph.specs]
    out: list[dict] = []
    for stage in range(graph.config.pp):
        agg: dict[tuple[str, str], list[float]] = {}
        for i, key in enumerate(keys):
            n = counts[stage, i]
            if n:
                slot = agg.setdefault(key, [0.0, 0.0])
                slot[0] += n * dur[i]
                slot[1] += n
        out.extend({"stage": stage, "primitive": p, "pass": ps, "time_s": float(t) / 1e6, "count": int(n)}
                   for (p, ps), (t, n) in sorted(agg.items()))
    return out


def top_operators(graph: Graph, dur: np.ndarray, stage: int, seconds: float, limit: int = 10) -> list[dict]:
    agg: dict[tuple[str, str], list] = {}
    for op, n in stage_ops(graph, stage):
        spec = graph.specs[op.spec]
        slot = agg.setdefault((op.name, spec["pass"]), [0.0, spec["primitive"], spec["variant"]])
        slot[0] += n * dur[op.spec]
    ranked = sorted(agg.items(), key=lambda kv: -kv[1][0])[:limit]
    return [{"name": name, "pass": ps, "primitive": prim, "variant": var, "time_s": float(t) / 1e6,
             "share": float(t) / 1e6 / seconds if seconds else 0.0} for (name, ps), (t, prim, var) in ranked]


def per_stage(graph: Graph, fwd: list[list[Work]], bwd: list[list[Work]], timeline: Timeline) -> list[dict]:
    out = []
    for s in range(graph.config.pp):
        chunks = [{"chunk": k, "layers": graph.segment(s, k).layers, "fwd_us": fwd[s][k].total,
                   "bwd_us": bwd[s][k].total} for k in range(graph.config.vp)]
        busy = sum(t.end - t.start for t in timeline.tasks[s]) + timeline.tails[s].drain_us
        out.append({"stage": s, "fwd_us": sum(ch["fwd_us"] for ch in chunks),
                    "bwd_us": sum(ch["bwd_us"] for ch in chunks), "chunks": chunks,
                    "busy_s": busy / 1e6, "idle_s": (timeline.tails[s].busy_end - busy) / 1e6})
    return out
