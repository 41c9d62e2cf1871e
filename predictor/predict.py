"""Predict one training iteration of a Megatron GPT configuration on a cluster.

Public API (stable; used by the CLI, `tracekit diff/validate` and capture):

    predict(config: TrainingConfig, cluster: Cluster, models, calibration=None) -> Prediction
    predict_many(configs, clusters, models, calibration=None) -> list[Prediction | Exception]  (calibration: one, or
        one per configuration)

`models` is anything with the interface of `predictor.models.ModelSet` — `predict(frame) -> frame`,
`hardware_ids()`, `framework_us(hw)`, `sampled_cluster(hw)`, `sampled_topologies(hw, primitive)`,
`resolve(hw, primitive, pass, group)`, and optionally `role_primitives(hw)` (the primitives whose backward the
graph asks per role; without it, whole): `predict` gets a frame of operator rows (hardware, primitive, pass, dtype,
variant, role + FEATURE_COLUMNS) and returns `duration_us`, `path` ('model' | 'derived' | 'transfer' | 'roofline')
and `out_of_range` on the same index (a GPU without models takes `transfer`: the note of `resolve_hardware` names
its source GPUs). Collectives not measured on the configuration's cluster and topology take the algorithm model of
`predictor.collectives` instead (path 'physics'; beyond the sampled message sizes, anchored to the learned model).
`predict_many` builds every configuration's graph, de-duplicates the operator rows of all of them and asks the
models once (plus once for learned collectives outside their sampled sizes, when there are any; only rows not
answered before by the same models object: estimates are cached per process, `clear_estimate_cache()` forgets them);
a configuration that cannot be built (ConfigError...) yields its exception in place. `clusters` is one Cluster for
all or one per config.

Pipeline: graph (predictor.graph) → frame of distinct ops → durations (models) → calibration constants
(predictor.calibration) → schedule simulation (predictor.schedule) → Prediction.

`Prediction.to_dict()` (the `--json` document), times in seconds unless the key ends in `_us`:
    iteration_time_s, breakdown{compute, exposed_communication, pipeline_bubble, optimizer, other} (seconds, sum =
    iteration time, for the busiest pipeline stage `critical_stage`), tflops_per_gpu, mfu, tokens_per_s,
    memory_gb_per_gpu{weights, gradients, optimizer_state, activations, total}, warnings[],
    top_operators[{name, pass, primitive, variant, time_s, share}] (busiest stage, per iteration),
    fallbacks[{primitive, pass, variant, path, out_of_range, time_s}] (ops not estimated by a trained model in range),
    per_stage[{stage, fwd_us, bwd_us (one micro-batch, all chunks of the stage, recompute in bwd), chunks[{chunk,
        layers, fwd_us, bwd_us}], busy_s, idle_s}],
    operators[{stage, primitive, pass, time_s, count}] (per iteration on one GPU of that stage; pass fwd|bwd|comm|
        optimizer; recomputed forward ops count under fwd),
    hardware, hardware_used, cluster{name, fabric, link figures...}, gpus_per_node, nodes, world_size, microbatches,
    schedule, calibration (a stack profile's constants are named `stack:<name>`), config{...}.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tracekit.core.cluster import Cluster
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError, did_you_mean
from tracekit.core.hardware import SPECS, hardware_spec
from tracekit.core.samples import COLLECTIVE_PRIMITIVES, FEATURE_COLUMNS

from .calibration import NONE, Calibration
from .flops import throughput
from .graph import Graph, OpUse, build_graph
from .memory import memory_per_gpu
from .schedule import Timeline, Work, simulate_many
from .transfer import source_weights

TENSOR_PRIMITIVES = ("gemm", "bmm", "attention")
KEYS = ("hardware", "primitive", "pass", "dtype", "variant", "role")
BREAKDOWN = ("compute", "exposed_communication", "pipeline_bubble", "optimizer", "other")


@dataclass
class Estimates:
    """Per-spec estimates of one graph (µs), with how each was obtained."""

    duration_us: np.ndarray
    path: list[str]
    out_of_range: np.ndarray
    #: framework time per compute operator sampled on this hardware, per pass ({} where none was sampled)
    framework_us: dict[str, float] = field(default_factory=dict)


@dataclass
class Prediction:
    config: TrainingConfig
    cluster: Cluster
    hardware_used: str
    iteration_time_s: float
    breakdown: dict[str, float]
    tflops_per_gpu: float
    mfu: float | None
    tokens_per_s: float
    memory_gb_per_gpu: dict[str, float]
    warnings: list[str]
    fallbacks: list[dict]
    critical_stage: int
    calibration: Calibration
    #: framework time per compute operator the models sampled on this hardware, per pass (µs; in `other`)
    framework_us: dict[str, float]
    graph: Graph = field(repr=False)
    timeline: Timeline = field(repr=False)
    durations_us: np.ndarray = field(repr=False)  # calibrated, per spec of `graph`
    counts: np.ndarray = field(repr=False)  # instances per iteration, (stage, spec)
    work: tuple[list[list[Work]], list[list[Work]]] = field(repr=False)  # (fwd, bwd): Work per [stage][chunk],
    # one micro-batch

    @property
    def top_operators(self) -> list[dict]:
        """The busiest stage's operators by time per iteration (top 10)."""
        return _top(self.graph, self.durations_us, self.critical_stage, self.iteration_time_s)

    @property
    def operators(self) -> list[dict]:
        return _operators(self.graph, self.durations_us, self.counts)

    @property
    def per_stage(self) -> list[dict]:
        return _per_stage(self.graph, *self.work, self.timeline)

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "iteration_time_s": self.iteration_time_s,
            "breakdown": self.breakdown,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "tokens_per_s": self.tokens_per_s,
            "memory_gb_per_gpu": self.memory_gb_per_gpu,
            "warnings": self.warnings,
            "top_operators": self.top_operators,
            "fallbacks": self.fallbacks,
            "per_stage": self.per_stage,
            "operators": self.operators,
            "critical_stage": self.critical_stage,
            "hardware": self.cluster.hardware,
            "hardware_used": self.hardware_used,
            "cluster": self.cluster.to_dict(),
            "gpus_per_node": self.cluster.gpus_per_node,
            "nodes": -(-c.world_size // self.cluster.gpus_per_node),
            "world_size": c.world_size,
            "microbatches": c.num_microbatches,
            "schedule": "interleaved" if c.vp > 1 else ("1f1b" if c.pp > 1 else "no pipeline"),
            "calibration": self.calibration.name,
            "framework_us_per_op": self.framework_us,
            "config": c.to_dict(),
        }


def resolve_hardware(requested: str, available: Sequence[str], compute: Sequence[str] = ()) -> tuple[str, str | None]:
    """The installed hardware model to use for `requested`: itself, else the same GPU family (e.g. an A100 40 GB
    → A100-SXM4-80GB models), else the requested id unchanged: a GPU in the datasheet table then takes the transfer
    path from the GPUs with compute models (`compute`, named in the note), anything else the roofline."""
    if requested in available or not available:
        return requested, None
    spec = hardware_spec(requested)
    if spec is not None and spec.name in available:  # e.g. "A100" → the datasheet's A100-SXM4-80GB
        return spec.name, f"no models for {requested}; using {spec.name}'s models"
    family = requested.split("-")[0].upper()
    for hw in available:
        other = hardware_spec(hw)
        if hw.split("-")[0].upper() == family or (spec is not None and other is not None and other.name == spec.name):
            return hw, f"no models for {requested}; using {hw}'s models (same GPU family)"
    if spec is None and not requested.startswith("cpu-"):
        raise ConfigError(f"unknown hardware {requested!r}: no trained models (installed: {', '.join(available)}) "
                          f"and no datasheet peaks (known: {', '.join(SPECS)}){did_you_mean(requested, SPECS)}")
    weights = source_weights(requested, list(compute)) if spec is not None else []
    if weights:
        named = ", ".join(f"{hw} {w:.2f}" for hw, w in weights)
        return requested, (f"no models for {requested}: compute operators transferred from the models of {named} "
                           "(weights by datasheet similarity; path `transfer`), collectives from the link model")
    return requested, f"no models for {requested} (installed: {', '.join(available)}); operators use roofline estimates"


def predict(config: TrainingConfig, cluster: Cluster, models, calibration: Calibration | None = None) -> Prediction:
    """One configuration; raises ConfigError/ModelError instead of returning them."""
    result = predict_many([config], [cluster], models, calibration)[0]
    if isinstance(result, Exception):
        raise result
    return result


def predict_many(configs: Sequence[TrainingConfig], clusters: Cluster | Sequence[Cluster], models,
                 calibration: Calibration | Sequence[Calibration | None] | None = None
                 ) -> list[Prediction | Exception]:
    """Many configurations with one `models.predict` call over their de-duplicated operator rows; `calibration` is
    one for all or one per configuration (e.g. each row's stack profile)."""
    prepared = prepare_many(configs, clusters, models)
    calibrations = calibration if isinstance(calibration, (list, tuple)) else [calibration] * len(prepared)
    if len(calibrations) != len(prepared):
        raise ValueError("give one calibration, or one per configuration")
    out: list[Prediction | Exception] = []
    for item, cal in zip(prepared, calibrations):
        if isinstance(item, Exception):
            out.append(item)
            continue
        try:
            out.append(compose(*item, calibration=cal))
        except ConfigError as exc:
            out.append(exc)
    return out


def prepare_many(configs: Sequence[TrainingConfig], clusters: Cluster | Sequence[Cluster], models
                 ) -> list[tuple[Graph, Estimates, Cluster, list[str]] | Exception]:
    """Graphs and their (uncalibrated) operator estimates; the expensive half of `predict_many`, reusable when only
    the calibration changes (calibration fitting recomposes these).

    Compute operators are answered by `models`. Collectives are answered by the learned models only where they
    were measured: on the cluster the model set's samples of that hardware came from (`models.sampled_cluster`)
    and in a topology sampled there; everywhere else by the algorithm model of `predictor.collectives` over the
    cluster's links (path `physics`)."""
    if isinstance(clusters, Cluster):
        clusters = [clusters] * len(configs)
    if len(clusters) != len(configs):
        raise ValueError("give one cluster, or one per configuration")
    available = list(models.hardware_ids())
    compute = [hw for hw in available if models.resolve(hw, "gemm", "fwd") is not None]
    built: list[tuple[Graph, Cluster, list[str]] | Exception] = []
    rows: list[dict] = []
    row_cluster: list[Cluster | None] = []
    row_of: dict[tuple, int] = {}
    spec_rows: list[np.ndarray] = []
    for config, cluster in zip(configs, clusters):
        try:
            hardware, note = resolve_hardware(cluster.hardware, available, compute)
            notes = [note] if note else []
            if config.precision == "fp8":
                spec = hardware_spec(cluster.hardware)
                if spec is None or not spec.peak_tflops_fp8:
                    raise ConfigError(f"fp8 needs fp8 tensor cores: {cluster.hardware} has none")
                notes.append("fp8: GEMMs estimated from bf16 estimates at the datasheet's fp8/bf16 roofline ratio "
                             "(Transformer Engine fp8 GEMMs, everything else bf16); an estimate, no fp8 samples")
            roles = models.role_primitives(hardware) if hasattr(models, "role_primitives") else ()
            graph = build_graph(config, hardware, cluster.gpus_per_node, roles)
        except (ConfigError, ValueError, ZeroDivisionError) as exc:
            built.append(exc if isinstance(exc, ConfigError) else ConfigError(str(exc)))
            continue
        mapping = np.empty(len(graph.specs), dtype=np.int64)
        links = (cluster.fingerprint(),)  # what a collective's estimate depends on besides its row
        for local_key, i in graph._index.items():
            collective = graph.specs[i]["primitive"] in COLLECTIVE_PRIMITIVES
            key = (hardware, config.precision) + local_key + (links if collective else ())
            j = row_of.get(key)
            if j is None:
                j = row_of[key] = len(rows)
                rows.append(graph.specs[i])
                row_cluster.append(cluster if collective else None)
            mapping[i] = j
        spec_rows.append(mapping)
        built.append((graph, cluster, notes))
    keys = list(row_of)
    cache = _estimate_cache(models)
    missing = [j for j, key in enumerate(keys) if key not in cache]
    if missing:
        answers = _estimate([rows[j] for j in missing], [row_cluster[j] for j in missing], models)
        if len(cache) + len(missing) > CACHE_ROWS:
            cache.clear()
        cache.update({keys[j]: answer for j, answer in zip(missing, answers)})
    answers = [cache[key] for key in keys]
    duration = np.array([a[0] for a in answers], dtype="float64")
    paths = np.array([a[1] for a in answers], dtype=object)
    oor = np.array([a[2] for a in answers], dtype=bool)
    out: list = []
    it = iter(spec_rows)
    for item in built:
        if isinstance(item, Exception):
            out.append(item)
            continue
        graph, cluster, notes = item
        idx = next(it)
        est = Estimates(duration[idx], list(paths[idx]), oor[idx], models.framework_us(graph.hardware))
        if not np.all(np.isfinite(est.duration_us)):
            bad = [graph.specs[i]["variant"] for i in np.flatnonzero(~np.isfinite(est.duration_us))]
            out.append(ConfigError(f"no estimate for operators {sorted(set(bad))} on {graph.hardware}"))
            continue
        out.append((graph, est, cluster, notes))
    return out


def _estimate(rows: list[dict], row_clusters: list[Cluster | None], models) -> list[tuple[float, str, bool]]:
    """(µs, path, out_of_range) per operator row: models for compute rows and for collectives measured on their
    cluster and topology; the collective algorithm model for the other collectives."""
    import pandas as pd

    frame = pd.DataFrame(rows, columns=list(KEYS) + list(FEATURE_COLUMNS))
    fp8 = (frame["dtype"] == "fp8").to_numpy()
    asked = frame.assign(dtype=np.where(fp8, "bf16", frame["dtype"])) if fp8.any() else frame
    result = models.predict(asked)
    duration = result["duration_us"].to_numpy(dtype="float64").copy()
    path = result["path"].astype(str).to_numpy().astype(object)
    oor = result["out_of_range"].fillna(False).to_numpy(dtype=bool).copy()
    if fp8.any():  # Transformer Engine fp8 GEMMs: the bf16 estimate at the fp8/bf16 roofline ratio
        from .roofline import estimate_us

        ratio = estimate_us(frame[fp8]) / estimate_us(asked[fp8])
        duration[fp8] = duration[fp8] * ratio
        path[fp8] = np.where(path[fp8] == "model", "derived", path[fp8])
    collective = np.array([c is not None for c in row_clusters])
    if collective.any():
        _collectives(frame, row_clusters, np.flatnonzero(collective), models, duration, path, oor)
    return [(float(d), str(p), bool(o)) for d, p, o in zip(duration, path, oor)]


def _collectives(frame, row_clusters: list, idx: np.ndarray, models, duration: np.ndarray, path: np.ndarray,
                 oor: np.ndarray) -> None:
    """Collective rows `idx`, in place. A CPU host's collectives keep their own samples. On the cluster a model set
    sampled the hardware's collectives on, in a sampled topology, the learned model answers inside its message
    sizes, and outside them anchors the algorithm model (the algorithm model's time × learned / algorithm at the
    nearest sampled size: it keeps growing with the message as the physics does). Everything else is the
    algorithm model of `predictor.collectives` over the row's cluster (path `physics`)."""
    from .collectives import collective_us
    from .model_keys import topology_key

    topology = topology_key(frame).to_numpy()
    groups: dict[tuple, list[int]] = {}
    for i in idx:
        groups.setdefault(row_clusters[i].fingerprint(), []).append(int(i))
    for members in groups.values():
        cluster = row_clusters[members[0]]
        rows = frame.iloc[members]
        own: list[int] = []
        anchored: list[int] = []
        for i in members:
            hardware, primitive = str(frame.at[i, "hardware"]), str(frame.at[i, "primitive"])
            if hardware.startswith("cpu-"):
                own.append(i)
            elif path[i] == "model" and models.sampled_cluster(hardware) == cluster.name \
                    and topology[i] in models.sampled_topologies(hardware, primitive):
                (own if not oor[i] else anchored).append(i)
        physics, _ = collective_us(rows, cluster)
        by_row = dict(zip(members, physics))
        for i in set(members) - set(own):
            duration[i], path[i], oor[i] = by_row[i], "physics", i in anchored
        if anchored:
            edge = frame.loc[anchored].copy()
            for j, i in enumerate(anchored):
                model = models.resolve(str(frame.at[i, "hardware"]), str(frame.at[i, "primitive"]), "comm",
                                       topology[i])
                lo, hi = model.meta["ranges"].get("bytes", [edge.iat[j, edge.columns.get_loc("bytes")]] * 2)
                edge.iat[j, edge.columns.get_loc("bytes")] = min(max(float(frame.at[i, "bytes"]), lo), hi)
            edge["numel"] = edge["bytes"] / frame.loc[anchored, "bytes"] * frame.loc[anchored, "numel"]
            learned = models.predict(edge)["duration_us"].to_numpy(dtype="float64")
            at_edge, _ = collective_us(edge, cluster)
            for j, i in enumerate(anchored):
                duration[i] = by_row[i] * learned[j] / at_edge[j]


#: Estimates already answered, per models object: identical operator rows are asked once per process.
CACHE_ROWS = 200_000
_CACHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _estimate_cache(models) -> dict:
    try:
        return _CACHES.setdefault(models, {})
    except TypeError:  # not weak-referenceable: no cache
        return {}


def clear_estimate_cache() -> None:
    """Forget cached operator estimates (e.g. to time cold predictions)."""
    _CACHES.clear()


def calibrated_durations(graph: Graph, est: Estimates, cal: Calibration) -> np.ndarray:
    """Estimates with the calibration's scale factors applied, per spec."""
    prims = [s["primitive"] for s in graph.specs]
    scale = np.array([
        cal.comm_scale if p in COLLECTIVE_PRIMITIVES else cal.compute_scale if p in TENSOR_PRIMITIVES
        else cal.memory_scale for p in prims
    ])
    return est.duration_us * scale


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


def compose(graph: Graph, est: Estimates, cluster: Cluster, notes: list[str] | None = None,
            calibration: Calibration | None = None) -> Prediction:
    """Schedule simulation and reporting for one prepared graph."""
    result = compose_many([(graph, est, cluster, notes)], calibration)[0]
    if isinstance(result, Exception):
        raise result
    return result


def compose_many(prepared: Sequence[tuple], calibration: Calibration | None = None
                 ) -> list[Prediction | ConfigError]:
    """`compose` of many prepared graphs (graph, estimates, cluster, notes); those of one pipeline shape share
    their schedule simulation's arrays (`schedule.simulate_many`). A graph that cannot be composed yields its
    ConfigError in place."""
    cal = calibration or NONE
    inputs = [simulation_inputs(graph, est, cal) for graph, est, _, _ in prepared]
    timelines = simulate_many([job for _, job in inputs])
    out: list[Prediction | ConfigError] = []
    for (graph, est, cluster, notes), (dur, job), timeline in zip(prepared, inputs, timelines):
        try:
            out.append(_prediction(graph, est, cluster, notes, cal, dur, job[0], job[1], timeline))
        except ConfigError as exc:
            out.append(exc)
    return out


def _prediction(graph: Graph, est: Estimates, cluster: Cluster, notes: list[str] | None, cal: Calibration,
                dur: np.ndarray, fwd: list[list[Work]], bwd: list[list[Work]], timeline: Timeline) -> Prediction:
    c = graph.config
    seconds = timeline.iteration_us / 1e6
    rates = throughput(c, graph.hardware, seconds)
    memory, mem_warnings = memory_per_gpu(graph)
    counts = instance_counts(graph)
    warnings = list(notes or []) + mem_warnings
    fallbacks = _fallbacks(graph, est, dur, counts)
    if fallbacks:
        share = sum(f["time_s"] for f in fallbacks) / max(seconds, 1e-12)
        warnings.append(f"{len(fallbacks)} operator kinds were not estimated by a trained model within its range "
                        f"(see fallbacks); they take about {100 * share:.0f}% of an average GPU's iteration")
    return Prediction(
        config=c, cluster=cluster, hardware_used=graph.hardware, iteration_time_s=seconds,
        breakdown={k: float(timeline.breakdown_us[k]) / 1e6 for k in BREAKDOWN},
        tflops_per_gpu=rates["tflops_per_gpu"], mfu=rates["mfu"], tokens_per_s=rates["tokens_per_s"],
        memory_gb_per_gpu=memory, warnings=warnings, fallbacks=fallbacks, critical_stage=timeline.critical_stage,
        calibration=cal, framework_us=dict(est.framework_us), graph=graph, timeline=timeline, durations_us=dur,
        counts=counts, work=(fwd, bwd),
    )


def _stage_ops(graph: Graph, stage: int):
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
    for op in graph.grad_sync[stage] + graph.param_gather[stage]:
        yield op, 1
    yield graph.optimizer[stage], 1


def instance_counts(graph: Graph) -> np.ndarray:
    """Instances per iteration of every spec on one GPU of each stage, shape (pp, specs)."""
    counts = np.zeros((graph.config.pp, len(graph.specs)))
    for stage in range(graph.config.pp):
        row = counts[stage]
        for op, n in _stage_ops(graph, stage):
            row[op.spec] += n
    return counts


def _operators(graph: Graph, dur: np.ndarray, counts: np.ndarray) -> list[dict]:
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


def _top(graph: Graph, dur: np.ndarray, stage: int, seconds: float, limit: int = 10) -> list[dict]:
    agg: dict[tuple[str, str], list] = {}
    for op, n in _stage_ops(graph, stage):
        spec = graph.specs[op.spec]
        slot = agg.setdefault((op.name, spec["pass"]), [0.0, spec["primitive"], spec["variant"]])
        slot[0] += n * dur[op.spec]
    ranked = sorted(agg.items(), key=lambda kv: -kv[1][0])[:limit]
    return [{"name": name, "pass": ps, "primitive": prim, "variant": var, "time_s": float(t) / 1e6,
             "share": float(t) / 1e6 / seconds if seconds else 0.0} for (name, ps), (t, prim, var) in ranked]


def _fallbacks(graph: Graph, est: Estimates, dur: np.ndarray, counts: np.ndarray) -> list[dict]:
    flagged = [i for i in range(len(graph.specs)) if est.path[i] != "model" or est.out_of_range[i]]
    if not flagged:
        return []
    time_of = counts.mean(axis=0) * dur  # average GPU's time per iteration
    out = [{"primitive": graph.specs[i]["primitive"], "pass": graph.specs[i]["pass"],
            "variant": graph.specs[i]["variant"], "path": est.path[i], "out_of_range": bool(est.out_of_range[i]),
            "time_s": float(time_of[i]) / 1e6} for i in flagged]
    return sorted(out, key=lambda f: -f["time_s"])


def _per_stage(graph: Graph, fwd: list[list[Work]], bwd: list[list[Work]], timeline: Timeline) -> list[dict]:
    out = []
    for s in range(graph.config.pp):
        chunks = [{"chunk": k, "layers": graph.segment(s, k).layers, "fwd_us": fwd[s][k].total,
                   "bwd_us": bwd[s][k].total} for k in range(graph.config.vp)]
        busy = sum(t.end - t.start for t in timeline.tasks[s])
        out.append({"stage": s, "fwd_us": sum(ch["fwd_us"] for ch in chunks),
                    "bwd_us": sum(ch["bwd_us"] for ch in chunks), "chunks": chunks,
                    "busy_s": busy / 1e6, "idle_s": (timeline.tails[s].busy_end - busy) / 1e6})
    return out
