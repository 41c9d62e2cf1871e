"""The predicted timeline as Kineto-format Chrome traces (one `rank-{r}.json.gz` per simulated rank, or plain
`rank-{r}.json`), so Perfetto, HTA and `tracekit ingest` read predicted and real traces alike. A trace is of the
hardware predicted: its device, backend and kernel names are that hardware's (`kernel_names`); a CPU's is a CPU run
on gloo (`cpu_trace_writer`), the rest of this docstring describes a GPU's.

Each operator instance becomes a `cpu_op` (named as PyTorch/Megatron name it: aten::mm with `Input Dims`/`Input
type`, record_param_comms with the collective metadata of PyTorch ≥ 2.3) holding a `cudaLaunchKernel`
`cuda_runtime` event, the kernel on its GPU stream (compute 7; tensor/context-parallel collectives 20; data-parallel
24; pipeline send/recv 28) carrying `External id` and `correlation`, and an `ac2g` flow from launch to kernel.
A linear's backward is written as its two GEMMs (dgrad, wgrad), half the estimated time each; a column-parallel
linear's backward collectives start with the part they run beside (predictor.schedule.tp_overlap). Iterations are
marked `ProfilerStep#N` (CPU user_annotation and GPU gpu_user_annotation). The forward ops (recomputed ones too)
sit inside `user_annotation` ranges named as the reference trainer's `record_function` ranges name Megatron's
modules (`layer_unit`): `embedding`, `layer_{i}/attention`, `layer_{i}/mlp` (i: the global layer number),
`output_layer`, `cross_entropy`; the reader takes them as each op's layer, so predicted and real traces compare
layer by layer. Times are µs relative to
`baseTimeNanoseconds`. The simulated ranks are the first rank of every pipeline stage (tp = cp = dp = 0).
"""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import Callable, Iterator, Protocol

import numpy as np

from predictor.ir.graph import Graph
from predictor.ir.ops import OpUse, part_share
from predictor.ir.placement import order_of, rank_coordinates, strides
from predictor.report.cpu_trace_writer import CpuTraceWriter, span
from predictor.report.kernel_names import DeviceNames, device_names
from predictor.report.trace_writer import BASE_NS, TraceWriter
from predictor.schedule import tp_overlap
from predictor.schedule.pipeline import Timeline
from predictor.schedule.stage_work import head_wgrad_parts, split_backward, step_us
from predictor.schedule.zero_bubble import segment_of
from tracekit.core.atomic import atomic_write_bytes
from tracekit.core.cluster import Cluster
from tracekit.core.pipeline_layout import SPLIT_BACKWARD, torch_schedule
from tracekit.core.runtime import deferred_share


class PredictedRun(Protocol):
    """What a predicted trace is drawn from (a `predictor.predict.Prediction`): the graph, its operators' durations,
    the simulated timeline and the cluster."""

    graph: Graph
    durations_us: np.ndarray
    timeline: Timeline
    cluster: Cluster

def default_ranks(graph: Graph) -> list[int]:
    """The first global rank of every pipeline stage."""
    c = graph.config
    return [s * strides(c.tp, c.cp, c.dp, c.pp, order_of(c))["pp"] for s in range(c.pp)]


def write_traces(prediction: PredictedRun, out_dir: str | Path, ranks: list[int] | None = None,
                 iterations: int = 2, compress: bool = True, progress: Callable[[Path], None] | None = None
                 ) -> list[Path]:
    """Write one trace per simulated rank (default: first rank of each stage), gzip-compressed unless `compress` is
    False (a 7B model's two ranks are ~160 MB of JSON, ~10 MB gzipped); `progress(path)` after each file. Returns
    the paths."""
    graph = prediction.graph
    ranks = ranks or default_ranks(graph)
    out = []
    for rank in ranks:
        path = Path(out_dir) / f"rank-{rank}.json{'.gz' if compress else ''}"
        data = dumps(rank_trace(prediction, rank, iterations))
        atomic_write_bytes(path, gzip.compress(data, compresslevel=3, mtime=0) if compress else data)
        out.append(path)
        if progress:
            progress(path)
    return out


def dumps(doc: dict) -> bytes:
    """Kineto's layout: header keys first, one event per line, `"rank": N` spaced as HTA's rank scan expects."""
    import json

    import orjson

    head = [f'  "{k}": {json.dumps(v)}' for k, v in doc.items() if k != "traceEvents"]
    events = b",\n".join(orjson.dumps(e, option=orjson.OPT_SERIALIZE_NUMPY) for e in doc["traceEvents"])
    return ("{\n" + ",\n".join(head) + ',\n  "traceEvents": [\n').encode() + events + b"\n]}\n"


def _expand(ops: list[OpUse], backward: bool = False) -> Iterator[tuple[OpUse, int | None]]:
    """Per-layer blocks repeated layer by layer, in execution order (a block: consecutive per-layer ops of one kind of
    layer, `OpUse.block`, repeated `count` times): (op, the decoder layer's number within the segment, None for an
    op outside the decoder layers). A segment's backward runs its blocks, and their layers, last first."""
    runs: list[tuple[int, int]] = []  # (start, end) of each op run: one op outside the layers, or one block
    i = 0
    while i < len(ops):
        j = i + 1
        if ops[i].per_layer:
            while j < len(ops) and ops[j].per_layer and ops[j].block == ops[i].block and ops[j].count == ops[i].count:
                j += 1
        runs.append((i, j))
        i = j
    decoder = [(i, j) for i, j in runs if ops[i].per_layer and not str(ops[i].block or "").startswith("mtp")]
    total = sum(ops[i].count for i, _ in decoder)
    offset = total if backward else 0
    for i, j in runs:
        if not ops[i].per_layer:
            yield ops[i], None
            continue
        count = ops[i].count
        numbered = (i, j) in decoder
        if numbered and backward:
            offset -= count
        for layer in range(count):
            number = (offset + (count - 1 - layer if backward else layer)) if numbered else None
            for use in ops[i:j]:
                yield use, number
        if numbered and not backward:
            offset += count


#: Module-path prefixes → the range a forward op runs in (the reference trainer's record_function names).
_UNITS = (("embedding", "embedding"), ("input_layernorm", "attention"), ("self_attention", "attention"),
          ("pre_mlp_layernorm", "mlp"), ("mlp", "mlp"), ("final_layernorm", "output_layer"),
          ("output_layer", "output_layer"), ("loss", "cross_entropy"))


def layer_unit(name: str, layer: int | None) -> str | None:
    """The annotation a forward op of module path `name` runs in: `layer_{layer}/attention` or `/mlp` for the
    transformer layer's ops (`layer` global), `embedding`, `output_layer`, `cross_entropy` outside it; None for an
    op of no module the ranges name."""
    unit = next((u for prefix, u in _UNITS if name == prefix or name.startswith(prefix + ".")), None)
    if unit in ("attention", "mlp"):
        return None if layer is None else f"layer_{layer}/{unit}"
    return unit


def first_layers(graph: Graph) -> dict[tuple[int, int], int]:
    """(stage, chunk) → the global number of its first transformer layer: Megatron numbers the layers along the
    model chunks in the order chunk × pp + stage."""
    c = graph.config
    out, offset = {}, 0
    for chunk in range(c.vp):
        for stage in range(c.pp):
            out[(stage, chunk)] = offset
            offset += graph.segment(stage, chunk).layers
    return out


#: The relative overrun of an iteration's end that is a rounding error of its summed times (not a simulated op's).
ROUNDING = 1e-9


def within(start: float, dur: float, end: float) -> float:
    """`dur`, or the duration that ends an op at `end` where `start + dur` overruns it by a rounding error: an
    iteration's ops are placed by summing their times one by one, its step range spans the simulated period, and an
    op that overran the range by a rounding error would be read as outside the iteration."""
    if start + dur > end and start + dur - end <= ROUNDING * max(abs(end), 1.0):
        return span(start, end)
    return dur


def rank_trace(prediction: PredictedRun, rank: int, iterations: int = 2, names: DeviceNames | None = None) -> dict:
    """The Kineto document of one simulated rank (`iterations` identical iterations back to back), named as the
    predicted hardware's traces are (`names`: another hardware's naming, the same timeline)."""
    graph, tl, dur = prediction.graph, prediction.timeline, prediction.durations_us
    c = graph.config
    stage = rank_coordinates(rank, c.tp, c.cp, c.dp, c.pp, order_of(c))["pp"]
    names = names or device_names(prediction.cluster.hardware)
    w = (CpuTraceWriter if names.cpu else TraceWriter)(graph, rank, c.precision, names)
    period = tl.iteration_us
    origin = 1000.0
    first = first_layers(graph)
    schedule = torch_schedule(c)
    split = split_backward(graph, dur) if schedule in SPLIT_BACKWARD else None  # input / weight backward parts
    beside = tp_overlap.applies(graph)
    if split is not None:
        dur = split[0]
    # defer_embedding_wgrad_compute: the last stage's output-layer backwards lose the deferred share of their weight
    # gradients, which run after its last task (stage_work.deferred_wgrad_us)
    share = deferred_share(c) if stage == c.pp - 1 else 0.0
    deferred = [(o, part) for o, part in head_wgrad_parts(graph, dur) if part] if share else []
    cut = {id(o): share * part for o, part in deferred}
    for it in range(iterations):
        t0 = origin + it * period

        def put(use: OpUse, pass_: str, start: float, d: float, end: float = t0 + period,
                role: str | None = None) -> None:
            """An op of this iteration, ending inside its step range (`within`)."""
            w.op(use, pass_, start, within(start, d, end), role)

        for task in tl.tasks[stage]:
            where = segment_of(stage, task.chunk, c.pp, schedule)
            seg = graph.segment(*where)
            ops = seg.fwd if task.kind == "F" else seg.bwd if split is None or task.kind == "B" else \
                split[1][where[0]][where[1]][task.kind == "W"]
            t = t0 + task.start + task.work.other
            # a column-parallel linear's backward collectives start with the GEMM part they run beside and add only
            # their time beyond it (predictor.schedule.tp_overlap: what the simulation counts)
            hidden = {id(ops[i]): h for i, h in tp_overlap.hidden_us(ops, dur, graph.specs).items()} \
                if beside and task.kind != "F" else {}
            starts: dict[tuple[str, str], float] = {}  # (linear, part of its GEMM backward) → where it starts
            for use, layer in _expand(ops, backward=task.kind != "F"):
                d = float(dur[use.spec]) - (cut.get(id(use), 0.0) if task.kind == "B" else 0.0)
                forward = task.kind == "F" or use.recompute
                w.annotate(layer_unit(use.name, None if layer is None else first[where] + layer)
                           if forward else None)
                pair = tp_overlap.covered(use.name) if id(use) in hidden else None
                if pair is not None and pair in starts:
                    put(use, "bwd", starts[pair], d)
                    t += d - hidden[id(use)]
                    continue
                if hidden and not forward and use.group is None and graph.specs[use.spec]["primitive"] == "gemm":
                    # a whole backward is drawn as its dgrad, then its wgrad; a role's row is that part alone
                    role = graph.specs[use.spec].get("role")
                    for part, offset in (("dgrad", 0.0), ("wgrad", d * part_share(role, "dgrad"))):
                        if part_share(role, part):
                            starts[(use.name, part)] = t + offset
                put(use, "fwd" if forward else "bwd", t, d)
                t += d
            w.annotate(None)
            if task.send and graph.p2p is not None:
                send = min(task.send, float(dur[graph.p2p]))
                put(OpUse("p2p.send", graph.p2p, group="pp"), "comm", t, send)
                if graph.p2p_gather is not None and task.send > send:
                    put(OpUse("p2p.gather", graph.p2p_gather, group="tp"), "comm", t + send, task.send - send)
        tail = tl.tails[stage]
        if tail.drain_us:
            put(OpUse("output_layer.deferred_wgrad", deferred[0][0].spec), "bwd", t0 + tail.busy_end - tail.drain_us,
                tail.drain_us, role="wgrad")
        sync_ops = graph.grad_sync[stage]
        for use, (a, b) in zip(sync_ops, tail.sync_intervals):
            put(use, "comm", t0 + a, b - a)
        # the step and the recipe's casts; not the per-iteration passes after them (framework_costs)
        put(graph.optimizer[stage], "optimizer", t0 + tail.opt_start, step_us(graph, dur, stage))
        t = t0 + tail.opt_end
        if tail.exposed_gather_us:
            for use in graph.param_gather[stage]:
                d = float(dur[use.spec])
                put(use, "comm", t, d)
                t += d
        for use, times in graph.reports.get(stage, []):  # the loss report, the logging barrier's share
            d = times * float(dur[use.spec])
            put(use, "comm", t, d)
            t += d
        w.step(it + 1, t0, period)
    events = w.finish()
    doc = {
        "schemaVersion": 1,
        "deviceProperties": names.device_properties(),
        "distributedInfo": w.distributed_info(),
        "traceEvents": w.metadata() + events,
        "traceName": f"tracekit predicted rank {rank}",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_NS,
    }
    if names.cpu:  # the profiler leaves the CPU model out; tracekit's captures add it (extractors.kineto.cpu)
        doc["cpu_model"] = names.hardware[len("cpu-"):]
    return doc
