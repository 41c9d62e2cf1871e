"""Operator-time estimates: what each distinct operator row of the graphs costs (µs) and how it was obtained.

    resolve_hardware(requested, available, compute) -> (the hardware whose models answer, a note or None)
    Estimates                                   per-spec estimates of one graph, with each one's path
    estimate_rows(keys, rows, row_clusters, models) -> (µs, path, out_of_range, sources), one entry per distinct
                                                row (sources: a transfer answer's source GPUs, '' elsewhere)
    clear_estimate_cache()                      forget the answers kept per models object
    calibrated_durations(graph, est, cal) -> µs per spec, with a calibration's scale factors

Compute rows are answered by the models; a GEMM in a dtype its GPU has no model for (fp8, fp8_block, MXFP8,
NVFP4, MXFP4, fp32) by the bf16 estimate at a learned speed-up bounded by the dtype's dense peak
(`predictor.costs.physics.lowp_gemm`, path `lowp`). Collectives are answered by the learned models where they were
measured (the row's cluster and a sampled topology; past the sampled message sizes they anchor the algorithm model),
everywhere else by the algorithm model of `predictor.costs.physics.collectives` (path `physics`). A training graph's
half-precision (and, where the part has an fp8 ceiling, fp8) GEMMs on a part with a sustained ceiling are no faster
than their FLOPs at it (`predictor.costs.physics.sustained_gemm`: the samples time bursts, a run holds the tensor
cores busy for minutes).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from predictor.costs.physics import sustained_gemm
from predictor.costs.physics.roofline import TENSOR_CORE_PRIMITIVES
from predictor.costs.physics.transfer import source_weights
from predictor.ir.graph import Graph
from tracekit.core.cpu_id import same_cpu
from tracekit.core.errors import ConfigError, did_you_mean
from tracekit.core.hardware import SPECS, gpu_family, hardware_spec
from tracekit.core.samples import COLLECTIVE_PRIMITIVES, FEATURE_COLUMNS

if TYPE_CHECKING:
    from tracekit.core.calibration import Calibration
    from tracekit.core.cluster import Cluster

KEYS = ("hardware", "primitive", "pass", "dtype", "variant", "role")


@dataclass
class Estimates:
    """Per-spec estimates of one graph (µs), with how each was obtained."""

    duration_us: np.ndarray
    path: list[str]
    out_of_range: np.ndarray
    #: framework time per compute operator sampled on this hardware, per pass ({} where none was sampled)
    framework_us: dict[str, float] = field(default_factory=dict)
    #: torch FSDP2's own host time per unit, per pass, sampled on this hardware ({} where none was sampled)
    fsdp_unit_us: dict[str, float] = field(default_factory=dict)
    #: per spec, what the answer came from beyond its path (a transfer's source GPUs with their weights; '' mostly)
    sources: list[str] = field(default_factory=list)


def resolve_hardware(requested: str, available: Sequence[str], compute: Sequence[str] = ()) -> tuple[str, str | None]:
    """The installed hardware model to use for `requested`: itself, else the same GPU family with the same peaks (e.g.
    an A100 40 GB → A100-SXM4-80GB models), else the requested id unchanged: a part of a family with models but
    other peaks (GB200 beside B200's models) then takes its sibling's models scaled by their rooflines (path
    `derived`), another GPU in the datasheet table the transfer path from the GPUs with compute models (`compute`,
    named in the note), anything else the roofline."""
    if requested in available or not available:
        return requested, None
    same = same_cpu(requested, available)  # this CPU's models made under the id's earlier rule
    if same is not None:
        return same, f"no models for {requested}; using {same}'s models (the same CPU's earlier id)"
    spec = hardware_spec(requested)
    if spec is not None and spec.name in available:  # e.g. "A100" → the datasheet's A100-SXM4-80GB
        return spec.name, f"no models for {requested}; using {spec.name}'s models"
    family = gpu_family(requested)
    for hw in available:
        other = hardware_spec(hw)
        if gpu_family(hw) != family and not (spec is not None and other is not None and other.name == spec.name):
            continue
        if spec is None or other is None or _same_peaks(spec, other):
            return hw, f"no models for {requested}; using {hw}'s models (same GPU family)"
        return requested, (f"no models for {requested}: operators from the models of {hw} (same GPU family) scaled "
                           f"by the ratio of their rooflines (path `derived`), collectives from the link model")
    if spec is None and not requested.startswith("cpu-"):
        raise ConfigError(f"unknown hardware {requested!r}: no trained models (installed: {', '.join(available)}) "
                          f"and no datasheet peaks (known: {', '.join(SPECS)}){did_you_mean(requested, SPECS)}")
    weights = source_weights(requested, list(compute)) if spec is not None else []
    if weights:
        named = ", ".join(f"{hw} {w:.2f}" for hw, w in weights)
        return requested, (f"no models for {requested}: compute operators transferred from the models of {named} "
                           "(weights by datasheet similarity; path `transfer`), collectives from the link model")
    return requested, f"no models for {requested} (installed: {', '.join(available)}); operators use roofline estimates"


def _same_peaks(a, b) -> bool:
    """Whether two datasheet entries have the same compute peaks (then one's models answer for the other as is)."""
    return all(getattr(a, k) == getattr(b, k) for k in ("peak_tflops_fp16", "peak_tflops_fp8", "peak_tflops_fp4"))


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


def estimate_rows(keys: list[tuple], rows: list[dict], row_clusters: list[Cluster | None], models
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(µs, path, out_of_range, sources) arrays over the distinct operator rows (`keys[j]` identifies `rows[j]`; a
    collective's row has its cluster in `row_clusters`, a compute row None). Rows answered before by the same models
    object come from the cache; the others are asked in one call."""
    cache = _estimate_cache(models)
    missing = [j for j, key in enumerate(keys) if key not in cache]
    if missing:
        answers = _estimate([rows[j] for j in missing], [row_clusters[j] for j in missing], models)
        if len(cache) + len(missing) > CACHE_ROWS:
            cache.clear()
        cache.update({keys[j]: answer for j, answer in zip(missing, answers)})
    answers = [cache[key] for key in keys]
    duration = np.array([a[0] for a in answers], dtype="float64")
    paths = np.array([a[1] for a in answers], dtype=object)
    oor = np.array([a[2] for a in answers], dtype=bool)
    sources = np.array([a[3] for a in answers], dtype=object)
    return duration, paths, oor, sources


def _estimate(rows: list[dict], row_clusters: list[Cluster | None], models) -> list[tuple[float, str, bool, str]]:
    """(µs, path, out_of_range, sources) per operator row: models for compute rows and for collectives measured on their
    cluster and topology; the collective algorithm model for the other collectives."""
    import pandas as pd

    frame = pd.DataFrame(rows, columns=list(KEYS) + list(FEATURE_COLUMNS))
    # GEMMs in any dtype: a model where measured, else predictor.costs.physics.lowp_gemm's bound
    result = models.predict(frame)
    duration = result["duration_us"].to_numpy(dtype="float64").copy()
    # a training run's GEMMs no faster than what the part sustains under its power limit (the samples' bursts are)
    if hasattr(models, "gemm_ceilings"):
        duration = np.fmax(duration, sustained_gemm.floor_us(frame, models.gemm_ceilings()))
    path = result["path"].astype(str).to_numpy().astype(object)
    oor = result["out_of_range"].fillna(False).to_numpy(dtype=bool).copy()
    sources = result["sources"].fillna("").astype(str).to_numpy() if "sources" in result else [""] * len(frame)
    collective = np.array([c is not None for c in row_clusters])
    if collective.any():
        _collectives(frame, row_clusters, np.flatnonzero(collective), models, duration, path, oor)
    return [(float(d), str(p), bool(o), str(s) if p == "transfer" else "")
            for d, p, o, s in zip(duration, path, oor, sources)]


def _collectives(frame, row_clusters: list, idx: np.ndarray, models, duration: np.ndarray, path: np.ndarray,
                 oor: np.ndarray) -> None:
    """Collective rows `idx`, in place. A CPU host's collectives keep their own samples. On the cluster a model set
    sampled the hardware's collectives on, in a sampled topology, the learned model answers inside its message
    sizes, and outside them anchors the algorithm model (the algorithm model's time × learned / algorithm at the
    nearest sampled size: it keeps growing with the message as the physics does). Everything else is the
    algorithm model of `predictor.costs.physics.collectives` over the row's cluster (path `physics`)."""
    from predictor.costs.learned.model_keys import topology_key
    from predictor.costs.physics.collectives import collective_us

    topology = topology_key(frame).to_numpy()
    groups: dict[tuple, list[int]] = {}
    for i in idx:
        groups.setdefault(row_clusters[i].fingerprint(), []).append(int(i))
    for members in groups.values():
        cluster = row_clusters[members[0]]
        rows = frame.iloc[members]
        own: list[int] = []
        anchored: list[int] = []
        as_sampled = _as_sampled(cluster)
        for i in members:
            hardware, primitive = str(frame.at[i, "hardware"]), str(frame.at[i, "primitive"])
            if hardware.startswith("cpu-"):
                own.append(i)
            elif path[i] == "model" and as_sampled and models.sampled_cluster(hardware) == cluster.name \
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


def _as_sampled(cluster: Cluster) -> bool:
    """Whether NCCL runs on `cluster` as on the preset of its name (where a model set's collectives were sampled):
    not when the run rules out the preset's in-network reduction (deterministic mode's NCCL_ALGO=Ring)."""
    from tracekit.core.cluster import PRESETS

    named = PRESETS.get(cluster.name)
    return named is None or named.in_network_reduction == cluster.in_network_reduction


def calibrated_durations(graph: Graph, est: Estimates, cal: Calibration) -> np.ndarray:
    """Estimates with the calibration's scale factors applied, per spec."""
    prims = [s["primitive"] for s in graph.specs]
    scale = np.array([
        cal.comm_scale if p in COLLECTIVE_PRIMITIVES
        else cal.compute_scale * (cal.attention_scale if p == "attention" else 1.0) if p in TENSOR_CORE_PRIMITIVES
        else cal.memory_scale for p in prims
    ])
    return est.duration_us * scale
