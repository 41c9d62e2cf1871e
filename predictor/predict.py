"""Predict one training iteration of a Megatron GPT configuration on a cluster.

Public API (stable; used by the CLI, `tracekit diff/validate` and capture):

    predict(config: TrainingConfig, cluster: Cluster, models, calibration=None) -> Prediction
    predict_many(configs, clusters, models, calibration=None) -> list[Prediction | Exception]  (calibration: one, or
        one per configuration)

`models` is anything with the interface of `predictor.costs.learned.models.ModelSet` — `predict(frame) -> frame`,
`hardware_ids()`, `framework_us(hw)`, `sampled_cluster(hw)`, `sampled_topologies(hw, primitive)`,
`resolve(hw, primitive, pass, group)`, and optionally `role_primitives(hw)` (the primitives whose backward the graph
asks per role; without it, whole) and `fsdp_unit_us(hw)` (torch FSDP2's host time per unit; without it, none):
`predict` gets a frame of operator rows (hardware, primitive, pass, dtype, variant, role + FEATURE_COLUMNS) and
returns `duration_us`, `path` ('model' | 'derived' | 'transfer' | 'roofline' | 'lowp') and `out_of_range` on the
same index (a GPU without models takes `transfer`: the note of `estimates.resolve_hardware` names its source GPUs).
Collectives not measured on the configuration's cluster and topology take the algorithm model of
`predictor.costs.physics.collectives` instead (path 'physics'; beyond the sampled message sizes, anchored to the learned
model). `predict_many` builds every configuration's graph, de-duplicates the operator rows of all of them and asks the
models once (plus once for learned collectives outside their sampled sizes, when there are any; only rows not
answered before by the same models object: estimates are cached per process,
`predictor.costs.estimates.clear_estimate_cache()` forgets them); a configuration that cannot be built (ConfigError...)
yields its exception in place. `clusters` is one Cluster for all or one per config.

Pipeline: graph (predictor.assembly.graph) → distinct operator rows → durations (models; predictor.costs.estimates) →
calibration constants (tracekit.core.calibration) → each stage's work (predictor.schedule.stage_work) → schedule
simulation (predictor.schedule.pipeline) → Prediction, its tables built by predictor.report.tables. This module holds
the entry points (predict, predict_many, prepare_many, compose, compose_many) and the Prediction.

`Prediction.to_dict()` (the `--json` document), times in seconds unless the key ends in `_us`:
    iteration_time_s, breakdown{compute, exposed_communication, pipeline_bubble, optimizer, other} (seconds, sum =
    iteration time, for the busiest pipeline stage `critical_stage`), tflops_per_gpu, mfu, tokens_per_s,
    memory_gb_per_gpu{weights, gradients, optimizer_state, activations, workspaces, total}, fits_in_memory (null: no
    datasheet entry), memory_capacity_gb, warnings[] (a configuration that does not fit: its memory warning first; a
    model FLOP rate above the best published MFU: `predictor.report.plausibility`'s warning; above the GPU's peak a
    prediction is a PlausibilityError instead),
    top_operators[{name, pass, primitive, variant, time_s, share}] (busiest stage, per iteration),
    estimates{operator_time_s, parts[{path, out_of_range, what, share, time_s, operators, sources}]} (how much of an
        average GPU's operator time each way of estimating carries: trained models first, then largest first;
        `operators` the module paths of `top_operators`, numbered families as `ddp.bucket*.all_reduce`; `sources` the
        GPUs a transfer came from; `predictor.report.provenance`; when any rests on other than a trained model within
        its range, its sentence is one of `warnings`),
    fallbacks[{primitive, pass, variant, path, out_of_range, operators, time_s}] (ops not estimated by a trained model
        in range, one entry per kind, `operators` their module paths),
    per_stage[{stage, fwd_us, bwd_us (one micro-batch, all chunks of the stage, recompute in bwd), chunks[{chunk,
        layers, fwd_us, bwd_us}], busy_s, idle_s}],
    operators[{stage, primitive, pass, time_s, count}] (per iteration on one GPU of that stage; pass fwd|bwd|comm|
        optimizer; recomputed forward ops count under fwd),
    hardware, hardware_used, cluster{name, fabric, link figures...}, gpus_per_node, nodes, world_size, microbatches,
    schedule, calibration (a stack profile's constants are named `stack:<name>`), framework_us_per_op{pass: µs},
    fsdp2_us_per_unit{pass: µs} (torch FSDP2's host time per unit, where sampled and the job uses it), config{...}.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from predictor.architecture.flops import throughput
from predictor.assembly.graph import build_graph
from predictor.costs.estimates import Estimates, estimate_rows, resolve_hardware
from predictor.costs.physics.transfer import transfer_candidates
from predictor.ir.graph import Graph
from predictor.memory.stages import config_memory
from predictor.parallel import fsdp
from predictor.report import provenance, tables
from predictor.report.plausibility import check as plausibility
from predictor.schedule.framework_costs import cluster_for
from predictor.schedule.pipeline import BREAKDOWN, Timeline, Work
from predictor.schedule.stage_work import simulation_inputs
from predictor.schedule.zero_bubble import as_run, simulate_jobs
from tracekit.core import layer_impl
from tracekit.core.calibration import NONE, Calibration
from tracekit.core.cluster import Cluster
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError, PlausibilityError
from tracekit.core.hardware import hardware_spec
from tracekit.core.megatron_arguments import unmodelled_warning
from tracekit.core.samples import COLLECTIVE_PRIMITIVES


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
    #: how much of the operator time rests on what (predictor.report.provenance)
    estimates: dict
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
    memory_capacity_gb: float | None = None  # the GPU's memory (datasheet); None when unknown
    #: torch FSDP2's host time per unit the models sampled on this hardware, per pass (µs; in `other`)
    fsdp_unit_us: dict[str, float] = field(default_factory=dict)

    @property
    def fits_in_memory(self) -> bool | None:
        """Whether the fullest stage's memory fits the GPU's; None for a GPU without a datasheet entry."""
        if self.memory_capacity_gb is None:
            return None
        return self.memory_gb_per_gpu["total"] <= self.memory_capacity_gb

    @property
    def top_operators(self) -> list[dict]:
        """The busiest stage's operators by time per iteration (top 10)."""
        return tables.top_operators(self.graph, self.durations_us, self.critical_stage, self.iteration_time_s)

    @property
    def operators(self) -> list[dict]:
        return tables.operators(self.graph, self.durations_us, self.counts)

    @property
    def per_stage(self) -> list[dict]:
        return tables.per_stage(self.graph, *self.work, self.timeline)

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "iteration_time_s": self.iteration_time_s,
            "breakdown": self.breakdown,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "tokens_per_s": self.tokens_per_s,
            "memory_gb_per_gpu": self.memory_gb_per_gpu,
            "fits_in_memory": self.fits_in_memory,
            "memory_capacity_gb": self.memory_capacity_gb,
            "warnings": self.warnings,
            "top_operators": self.top_operators,
            "estimates": self.estimates,
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
            "fsdp2_us_per_unit": self.fsdp_unit_us,
            "config": c.to_dict(),
        }


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
        except (ConfigError, PlausibilityError) as exc:
            out.append(exc)
    return out


def prepare_many(configs: Sequence[TrainingConfig], clusters: Cluster | Sequence[Cluster], models
                 ) -> list[tuple[Graph, Estimates, Cluster, list[str]] | Exception]:
    """Graphs and their (uncalibrated) operator estimates; the expensive half of `predict_many`, reusable when only
    the calibration changes (calibration fitting recomposes these).

    Compute operators are answered by `models`. Collectives are answered by the learned models only where they
    were measured: on the cluster the model set's samples of that hardware came from (`models.sampled_cluster`)
    and in a topology sampled there; everywhere else by the algorithm model of `predictor.costs.physics.collectives`
    over the cluster's links (path `physics`)."""
    if isinstance(clusters, Cluster):
        clusters = [clusters] * len(configs)
    if len(clusters) != len(configs):
        raise ValueError("give one cluster, or one per configuration")
    available = list(models.hardware_ids())
    compute = transfer_candidates(models, "gemm", "fwd")
    built: list[tuple[Graph, Cluster, list[str]] | Exception] = []
    rows: list[dict] = []
    row_cluster: list[Cluster | None] = []
    row_of: dict[tuple, int] = {}
    spec_rows: list[np.ndarray] = []
    for config, cluster in zip(configs, clusters):
        cluster = cluster_for(config, cluster)  # NCCL as the run's settings leave it (deterministic mode: Ring)
        try:
            hardware, note = resolve_hardware(cluster.hardware, available, compute)
            notes = [note] if note else []
            if config.recipe.low_precision:
                spec = hardware_spec(cluster.hardware)
                if spec is None or not spec.peak_tflops(config.gemm_dtype):
                    raise ConfigError(f"precision {config.precision} needs {config.gemm_dtype} tensor cores: "
                                      f"{cluster.hardware} has none")
                notes.append(f"{config.precision}: linear layers' GEMMs in {config.gemm_dtype} with the recipe's "
                             "casts (tracekit.core.precision), everything else in bf16")
            notes.extend(layer_impl.notes(config))  # what was assumed installed, where it matters
            roles = models.role_primitives(hardware) if hasattr(models, "role_primitives") else ()
            graph = build_graph(config, hardware, cluster.domain_size, roles)  # NVL72: the rack is the unit
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
    duration, paths, oor, sources = estimate_rows(list(row_of), rows, row_cluster, models)
    out: list = []
    it = iter(spec_rows)
    for item in built:
        if isinstance(item, Exception):
            out.append(item)
            continue
        graph, cluster, notes = item
        idx = next(it)
        units = models.fsdp_unit_us(graph.hardware) \
            if fsdp.pays_unit_hooks(graph.config) and hasattr(models, "fsdp_unit_us") else {}
        est = Estimates(duration[idx], list(paths[idx]), oor[idx], models.framework_us(graph.hardware), units,
                        list(sources[idx]))
        if not np.all(np.isfinite(est.duration_us)):
            bad = [graph.specs[i]["variant"] for i in np.flatnonzero(~np.isfinite(est.duration_us))]
            out.append(ConfigError(f"no estimate for operators {sorted(set(bad))} on {graph.hardware}"))
            continue
        out.append((graph, est, cluster, notes))
    return out


def compose(graph: Graph, est: Estimates, cluster: Cluster, notes: list[str] | None = None,
            calibration: Calibration | None = None) -> Prediction:
    """Schedule simulation and reporting for one prepared graph."""
    result = compose_many([(graph, est, cluster, notes)], calibration)[0]
    if isinstance(result, Exception):
        raise result
    return result


def compose_many(prepared: Sequence[tuple], calibration: Calibration | None = None
                 ) -> list[Prediction | ConfigError | PlausibilityError]:
    """`compose` of many prepared graphs (graph, estimates, cluster, notes); those of one pipeline shape share
    their schedule simulation's arrays (`schedule.simulate_many`; PyTorch's zero-bubble schedules are simulated one
    by one: `zero_bubble.simulate`). A graph that cannot be composed yields its ConfigError in place, an impossible
    prediction (`predictor.report.plausibility`) its PlausibilityError."""
    cal = calibration or NONE
    inputs = [simulation_inputs(graph, est, cal) for graph, est, _, _ in prepared]
    timelines = simulate_jobs([job for _, job in inputs])
    out: list[Prediction | ConfigError | PlausibilityError] = []
    for (graph, est, cluster, notes), (dur, job), timeline in zip(prepared, inputs, timelines):
        try:
            out.append(_prediction(graph, est, cluster, notes, cal, dur, *as_run(*job), timeline))
        except (ConfigError, PlausibilityError) as exc:
            out.append(exc)
    return out


def _prediction(graph: Graph, est: Estimates, cluster: Cluster, notes: list[str] | None, cal: Calibration,
                dur: np.ndarray, fwd: list[list[Work]], bwd: list[list[Work]], timeline: Timeline) -> Prediction:
    c = graph.config
    seconds = timeline.iteration_us / 1e6
    rates = throughput(c, graph.hardware, seconds)
    memory, mem_warnings = config_memory(c, cluster.hardware)  # the GPU the job runs on, not the models' sibling
    counts = tables.instance_counts(graph)
    warnings = mem_warnings + list(notes or [])  # a configuration that does not fit: that first
    if c.hybrid is not None:  # what Megatron changes and says so (a --num-layers the pattern overrides, ...)
        warnings += c.hybrid.notes(c)
    unmodelled = unmodelled_warning(c.extra)
    if unmodelled:
        warnings.append(unmodelled)
    names = provenance.operator_names(graph, dur)  # one walk of the graph for both
    fallbacks = provenance.fallbacks(graph, est, dur, counts, names)
    estimates = provenance.provenance(graph, est, dur, counts, names)
    if provenance.rests_on_fallbacks(estimates):  # what `predict` prints above its answer, a warning to the rest
        warnings.append(provenance.sentence(estimates))
    warnings += plausibility(c, cluster.hardware, rates["tflops_per_gpu"], fallbacks, seconds)
    spec = hardware_spec(cluster.hardware)
    return Prediction(
        config=c, cluster=cluster, hardware_used=graph.hardware, iteration_time_s=seconds,
        breakdown={k: float(timeline.breakdown_us[k]) / 1e6 for k in BREAKDOWN},
        tflops_per_gpu=rates["tflops_per_gpu"], mfu=rates["mfu"], tokens_per_s=rates["tokens_per_s"],
        memory_gb_per_gpu=memory, warnings=warnings, fallbacks=fallbacks, estimates=estimates,
        critical_stage=timeline.critical_stage,
        calibration=cal, framework_us=dict(est.framework_us), graph=graph, timeline=timeline, durations_us=dur,
        counts=counts, work=(fwd, bwd), memory_capacity_gb=spec.memory_gb if spec is not None else None,
        fsdp_unit_us=dict(est.fsdp_unit_us),
    )
