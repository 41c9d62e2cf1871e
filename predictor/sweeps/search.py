"""Configuration search: the splits Megatron accepts for a model on N GPUs, pruned by memory, predicted in one batched
model call (`predict.prepare_many`), ranked.

Public API:

    enumerate_configs(base: dict, gpus: int, fixed: set[str], context_parallel=False) -> (configs, rejected)
    input_config(base: dict, gpus: int) -> TrainingConfig   (the input's own split on `gpus` GPUs; ConfigError)
    evaluate(configs, cluster, models, calibration, gpus, price, progress=None, keep_all=False)
        -> (candidate rows, {"memory", "failed", "implausible"}, {kind: first message})
    search(base, gpus, cluster, models, fixed, calibration=None, objective="time", price_per_gpu_hour=None,
           executor=None, context_parallel=False, progress=None) -> SearchResult
    nothing_fits(result, gpus) -> str   (why a search ranked nothing)

`base` is the job as Megatron argument names (the model, the global batch, whatever else the input states); keys in
`fixed` keep the input's value, the others of SEARCH_KEYS are varied: tensor parallelism (divides the heads and the
query groups), an MoE model's expert parallelism (EP dividing the experts, expert TP 1 or the TP size, EP·ETP dividing
a stage's GPUs), pipeline parallelism (divides the layers), context parallelism (only when `context_parallel` opens it:
2·cp divides the sequence), data parallelism (the rest of the GPUs), micro-batch size (divides the per-replica batch, at
most MAX_MICRO_BATCH), interleaving (virtual stages that divide a stage's layers, when the micro-batches divide by pp),
sequence parallelism (off and on, with tp > 1), activation recompute (none, selective, full) and the distributed
optimizer (off and on, with dp > 1). A hybrid model (a layer pattern: tracekit.core.hybrid) is split as Megatron
splits one, by `|` in its pattern: for each pp and vp (pp·vp segments, any pp up to the layers, vp dividing a
stage's share as for a GPT), the pattern's layers cut into contiguous segments that balance their forward FLOPs
(the last one carrying the output layer and the MTP layers; no segment starting on a DSA layer that reuses an
earlier layer's top-k); the input's own pipes are kept when it fixes both pp and vp. Each candidate's pattern is
in its `config` (`hybrid_layer_pattern`). A job that shards with FSDP/ZeRO-2/3 (tracekit.core.sharding) keeps its
strategy and varies its shard group instead of the distributed optimizer: every number of HSDP replicas dividing the
dp·cp ranks (1: FSDP over all of them; the setting `num_distributed_optimizer_instances`, fixed when `fixed` names
it). A candidate Megatron would refuse (`TrainingConfig.validate`) is counted under
`pruned["invalid"]`; one whose memory per GPU exceeds the GPU's under `pruned["memory"]`; one whose prediction could
not be made under `pruned["failed"]`, or, when it was impossible (`predictor.report.plausibility`: above the GPU's
peak), under `pruned["implausible"]`. Ranking: iteration time (`time`), tokens per second (`tokens_per_s`) or cost per
iteration (`cost`, with a price per GPU-hour).

The input's own configuration (its split, with dp taking the rest of the GPUs) is always evaluated, even when it is
no candidate (a micro-batch above MAX_MICRO_BATCH...) or does not fit: `SearchResult.input` is its row with its
`rank` (None when it does not fit), so the best candidate is never predicted slower than what the user has.
`SearchResult.warnings` are the best candidate's prediction warnings, as `predict` of it gives them.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from predictor.memory.stages import config_memory
from predictor.parallel.fsdp import shard_splits, shards
from predictor.predict import compose_many, prepare_many
from predictor.sweeps.hybrid_pipes import HybridPipes
from tracekit.core.cluster import Cluster
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError, PlausibilityError
from tracekit.core.hardware import hardware_spec
from tracekit.core.settings import setting_name
from tracekit.core.sharding import sharding_of

SEARCH_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
               "micro_batch_size", "virtual_pipeline_model_parallel_size", "sequence_parallel",
               "recompute_granularity", "use_distributed_optimizer", "expert_model_parallel_size",
               "expert_tensor_parallel_size")
#: The settings of an MoE model's experts (tracekit.core.moe): searched only for MoE models.
EXPERT_KEYS = ("expert_model_parallel_size", "expert_tensor_parallel_size")
MAX_MICRO_BATCH = 16
OBJECTIVES = ("time", "tokens_per_s", "cost")


@dataclass
class SearchResult:
    candidates: list[dict[str, Any]]  # ranked, best first
    evaluated: int
    pruned: dict[str, int]
    seconds: float
    objective: str
    notes: list[str] = field(default_factory=list)
    #: the input's own configuration: its row (with `rank`, None when it does not fit) or None when it is no
    #: configuration of the GPUs (`input_error` says why)
    input: dict[str, Any] | None = None
    input_error: str | None = None
    warnings: list[str] = field(default_factory=list)
    #: the settings the input fixed (not searched)
    fixed: list[str] = field(default_factory=list)
    #: first message per kind of candidate that could not be ranked ("failed", "implausible")
    problems: dict[str, str] = field(default_factory=dict)

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        return {"candidates": self.candidates[:top] if top else self.candidates, "evaluated": self.evaluated,
                "pruned": self.pruned, "seconds": self.seconds, "objective": self.objective, "notes": self.notes,
                "input": self.input, "input_error": self.input_error, "warnings": self.warnings,
                "fixed": self.fixed, "problems": self.problems}


def _divisors(n: int, limit: int | None = None) -> list[int]:
    return [d for d in range(1, (limit or n) + 1) if n % d == 0]


def enumerate_configs(base: dict[str, Any], gpus: int, fixed: set[str], context_parallel: bool = False
                      ) -> tuple[list[TrainingConfig], int]:
    """Every candidate configuration Megatron accepts, and how many combinations it would refuse. Context
    parallelism stays 1 unless `context_parallel` opens it (then: the divisors of the GPUs that Megatron accepts,
    2·cp dividing the sequence)."""
    model = TrainingConfig.from_mapping({**base, "world_size": gpus}, strict=True)  # a misspelt key is an error
    if "global_batch_size" not in {setting_name(k) for k in base}:
        raise ConfigError("a search needs the global batch size (--global-batch-size): it is what the splits share")

    def options(key: str, values: list) -> list:
        return [getattr(model, key)] if key in fixed else values

    moe = model.moe

    def expert_splits(tp: int, pp: int) -> list[tuple[int, int | None]]:
        """(EP, ETP) of an MoE model on a stage's GPUs: EP dividing the experts, ETP 1 or the TP size (Megatron's
        default), EP·ETP dividing the stage's GPUs; the input's own where it fixes them."""
        if moe is None:
            return [(1, None)]
        eps = [moe.ep] if "expert_model_parallel_size" in fixed else _divisors(moe.num_experts)
        etps = [moe.etp(tp)] if "expert_tensor_parallel_size" in fixed else sorted({1, tp})
        stage = gpus // pp
        return [(ep, etp) for ep in eps for etp in etps if stage % (ep * etp) == 0]

    heads, groups, layers = model.num_attention_heads, model.num_query_groups, model.num_layers
    hybrid = HybridPipes(model, fixed)
    tps = options("tensor_model_parallel_size", [t for t in _divisors(gpus) if heads % t == 0 and groups % t == 0])
    pps = options("pipeline_model_parallel_size", [p for p in _divisors(gpus) if (p <= layers if hybrid.pattern
                                                                                   else layers % p == 0)])
    cps = options("context_parallel_size", [c for c in _divisors(gpus) if c == 1 or model.seq_length % (2 * c) == 0]
                  if context_parallel else [1])
    recomputes = options("recompute_granularity", ["none", "selective", "full"])
    configs, rejected = [], 0
    for tp, pp, cp, recompute in itertools.product(tps, pps, cps, recomputes):
        if gpus % (tp * pp * cp):
            rejected += 1
            continue
        dp = gpus // (tp * pp * cp)
        per_replica = model.global_batch_size // dp if model.global_batch_size % dp == 0 else 0
        mbs = options("micro_batch_size", _divisors(per_replica, min(per_replica, MAX_MICRO_BATCH)) or [1])
        sps = options("sequence_parallel", [False, True] if tp > 1 else [False])
        dist = options("use_distributed_optimizer", [False, True] if dp > 1 and not shards(model) else
                       [model.use_distributed_optimizer])  # FSDP/ZeRO-2/3 jobs shard without it
        experts = expert_splits(tp, pp)
        for mb, sp, distributed, (ep, etp) in itertools.product(mbs, sps, dist, experts):
            m = per_replica // mb if per_replica and per_replica % mb == 0 else 0
            vps = options("virtual_pipeline_model_parallel_size",
                          [1] + ([v for v in _divisors(layers // pp)[1:] if m and m % pp == 0] if pp > 1 else []))
            for vp in vps:
                split = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                         "context_parallel_size": cp, "data_parallel_size": dp, "micro_batch_size": mb,
                         "virtual_pipeline_model_parallel_size": vp or 1, "sequence_parallel": sp,
                         "recompute_granularity": recompute, "use_distributed_optimizer": distributed}
                if moe is not None:
                    split["moe"] = dataclasses.replace(moe, expert_model_parallel_size=ep,
                                                       expert_tensor_parallel_size=etp)
                if hybrid.pattern:
                    try:
                        split["hybrid"] = hybrid.settings(pp, vp or 1)
                    except ConfigError:
                        rejected += 1
                        continue
                candidate = dataclasses.replace(model, extra=dict(model.extra), **split)
                # an FSDP job's shard groups: FSDP over every data-parallel rank, or HSDP replicas of smaller ones
                for variant in shard_splits(candidate) if "num_distributed_optimizer_instances" not in fixed \
                        else [candidate]:
                    try:  # the job's parsed settings with this split (what parsing them all again would give)
                        configs.append(variant.validate())
                    except ConfigError:
                        rejected += 1
    return configs, rejected


def input_config(base: dict[str, Any], gpus: int) -> TrainingConfig:
    """The input's own configuration on `gpus` GPUs: its split, data parallelism taking the rest of the GPUs (as
    `tracekit predict --gpus` does); ConfigError when that is no configuration Megatron accepts."""
    own = {k: v for k, v in base.items() if setting_name(k) not in ("data_parallel_size", "world_size")}
    try:
        return TrainingConfig.from_mapping({**own, "world_size": gpus}, strict=True).validate()
    except ConfigError as exc:
        raise ConfigError(f"the input's own split is no configuration of {gpus} GPUs: {exc}") from exc


def split_of(config: TrainingConfig) -> dict[str, Any]:
    """A candidate's settings (SEARCH_KEYS, data parallelism, virtual stages; an MoE model's expert parallel sizes,
    None for a dense one; an FSDP job's shard group, `sharding`: FSDP or HSDP R×S): what tells two candidates
    apart."""
    moe = config.moe
    experts = {"expert_model_parallel_size": moe.ep if moe else None,
               "expert_tensor_parallel_size": moe.etp(config.tp) if moe else None}
    layout = config.layout
    pattern = config.hybrid.pattern(config.num_layers, layout.mtp_num_layers if layout else None) \
        if config.hybrid is not None else None
    return {**{k: getattr(config, k) for k in SEARCH_KEYS if k not in EXPERT_KEYS}, **experts,
            "data_parallel_size": config.dp, "virtual_pipeline_model_parallel_size": config.vp,
            **({"sharding": sharding_of(config).name} if shards(config) else {}),
            **({"hybrid_layer_pattern": pattern} if pattern else {})}


#: Candidates prepared and composed at a time: bounds the graphs and timelines held in memory at once.
CHUNK = 1024


def shape(config: TrainingConfig) -> tuple[int, int, int]:
    """The pipeline shape (pp, vp, micro-batches): candidates of one shape share their schedule simulation."""
    return config.pp, config.vp, config.num_microbatches


def evaluate(configs: list[TrainingConfig], cluster: Cluster, models, calibration=None, gpus: int = 1,
             price_per_gpu_hour: float | None = None, progress: Callable[[int], None] | None = None,
             keep_all: bool = False) -> tuple[list[dict[str, Any]], dict[str, int], dict[str, str]]:
    """One shard of the work: the memory check of every candidate; for those that fit, in chunks of about CHUNK
    candidates of whole pipeline shapes, graphs and operator estimates (one batched model call per chunk, for the
    operator rows not estimated before) and the schedule simulations (one shape's together). Returns (candidate
    rows, {"memory": pruned, "failed": unpredictable, "implausible": above the GPU's peak}, {kind: first message}).
    `progress(n)` is told of every n candidates done; `keep_all` predicts those that do not fit too (their rows say
    `fits` False). The local executor runs it on everything, the Ray one per shard."""
    spec = hardware_spec(cluster.hardware)
    fitting, too_big = [], 0
    for config in configs:  # the memory check needs no operator graph: prune before building any
        memory, _ = config_memory(config, cluster.hardware)
        if spec is not None and memory["total"] > spec.memory_gb and not keep_all:
            too_big += 1
        else:
            fitting.append((config, memory))
    if progress and too_big:
        progress(too_big)
    fitting.sort(key=lambda item: shape(item[0]))
    rows: list[dict[str, Any]] = []
    counts = {"failed": 0, "implausible": 0}
    problems: dict[str, str] = {}

    def problem(exc: Exception) -> None:
        kind = "implausible" if isinstance(exc, PlausibilityError) else "failed"
        counts[kind] += 1
        problems.setdefault(kind, str(exc))

    start = 0
    while start < len(fitting):
        end = min(start + CHUNK, len(fitting))
        while end < len(fitting) and shape(fitting[end][0]) == shape(fitting[end - 1][0]):
            end += 1
        part, start = fitting[start:end], end
        prepared, kept = [], []
        for (config, memory), item in zip(part, prepare_many([c for c, _ in part], cluster, models)):
            if isinstance(item, Exception):
                problem(item)
            else:
                prepared.append(item)
                kept.append((config, memory))
        for (config, memory), prediction in zip(kept, compose_many(prepared, calibration)):
            if isinstance(prediction, Exception):
                problem(prediction)
            else:
                fits = spec is None or memory["total"] <= spec.memory_gb
                rows.append(_row(config, memory, prediction, gpus, price_per_gpu_hour, fits))
        if progress:
            progress(len(part))
    return rows, {"memory": too_big, **counts}, problems


def _row(config: TrainingConfig, memory: dict, prediction, gpus: int, price_per_gpu_hour: float | None,
         fits: bool = True) -> dict:
    seconds = prediction.iteration_time_s
    return {
        "config": split_of(config),
        "iteration_time_s": seconds, "tokens_per_s": prediction.tokens_per_s, "mfu": prediction.mfu,
        "tflops_per_gpu": prediction.tflops_per_gpu, "memory_gb_per_gpu": memory["total"], "fits": fits,
        "cost_per_iteration": seconds * gpus * price_per_gpu_hour / 3600 if price_per_gpu_hour else None,
        "breakdown": prediction.breakdown, "warnings": prediction.warnings,
    }


def search(base: dict[str, Any], gpus: int, cluster: Cluster, models, fixed: set[str] | None = None,
           calibration=None, objective: str = "time", price_per_gpu_hour: float | None = None,
           executor=None, context_parallel: bool = False, progress: Callable[[int, int], None] | None = None
           ) -> SearchResult:
    """Enumerate, prune by memory, predict in batched calls, rank, with the input's own configuration evaluated
    beside the candidates (see the module docstring). `executor` (default: this process) is anything with
    `run(configs, cluster, models, calibration, gpus, price, progress=None)` returning what `evaluate` returns, e.g.
    `predictor.sweeps.ray_executor.RayExecutor`. `progress(done, total)` follows the candidates."""
    objective = objective.replace("-", "_")  # tokens-per-s or tokens_per_s
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective must be one of {', '.join(OBJECTIVES)}, not {objective!r}")
    if objective == "cost" and not price_per_gpu_hour:
        raise ConfigError("the cost objective needs a price per GPU-hour (--price-per-gpu-hour)")
    start = time.perf_counter()
    fixed = {setting_name(k) for k in (fixed or set())}
    configs, rejected = enumerate_configs(base, gpus, fixed, context_parallel)
    own, own_error = None, None
    try:
        own = input_config(base, gpus)
    except ConfigError as exc:
        own_error = str(exc)
    if own is not None:  # evaluated on its own below, whether or not it fits or is a candidate
        configs = [c for c in configs if split_of(c) != split_of(own)]
    total, done = len(configs) + (own is not None), 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(done, total)

    if executor is None:
        candidates, pruned, problems = evaluate(configs, cluster, models, calibration, gpus, price_per_gpu_hour,
                                                advance)
    else:
        candidates, pruned, problems = executor.run(configs, cluster, models, calibration, gpus,
                                                    price_per_gpu_hour, advance)
    mine = None
    if own is not None:
        rows, own_pruned, own_problems = evaluate([own], cluster, models, calibration, gpus, price_per_gpu_hour,
                                                  advance, keep_all=True)
        if rows:
            mine = {**rows[0], "input": True}
            if mine["fits"]:
                candidates.append(mine)
            else:
                pruned["memory"] += 1
        else:
            own_error = "its prediction failed: " + next(iter(own_problems.values()), "no prediction")
            for kind, count in own_pruned.items():
                pruned[kind] = pruned.get(kind, 0) + count
            for kind, message in own_problems.items():
                problems.setdefault(kind, message)
    key = {"time": lambda c: c["iteration_time_s"], "tokens_per_s": lambda c: -c["tokens_per_s"],
           "cost": lambda c: c["cost_per_iteration"]}[objective]
    candidates.sort(key=lambda c: (key(c), split_name(c["config"])))  # ties: one order whatever the executor
    if mine is not None:
        mine["rank"] = next((i for i, c in enumerate(candidates, start=1) if c is mine), None)
    notes = [separation(candidates[0], candidates[1])] if len(candidates) >= 2 else []
    warnings = list(dict.fromkeys(candidates[0]["warnings"])) if candidates else []
    return SearchResult(candidates, len(candidates) + pruned["failed"] + pruned["implausible"],
                        {"invalid": rejected, **pruned}, time.perf_counter() - start, objective, notes, mine,
                        own_error, warnings, [k for k in SEARCH_KEYS if k in fixed], problems)


def nothing_fits(result: SearchResult, gpus: int, framework: str = "Megatron") -> str:
    """Why a search ranked no configuration: how many splits were refused (by `framework`'s rules), too big or
    unpredictable, and the input's own split's fate."""
    p = result.pruned
    parts = [f"{p['invalid']} split(s) {framework} would refuse", f"{p['memory']} too big for the GPU's memory"]
    parts += [f"{p[k]} {k}" for k in ("failed", "implausible") if p.get(k)]
    why = f"no configuration of {gpus} GPUs fits: " + ", ".join(parts)
    if result.input_error:
        why += f"; {result.input_error}"
    elif result.input is not None and not result.input["fits"]:
        why += f"; the input's own split needs {result.input['memory_gb_per_gpu']:.1f} GB per GPU"
    return why + "".join(f" ({kind}: {message})" for kind, message in result.problems.items())


SHORT = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp", "context_parallel_size": "cp",
         "data_parallel_size": "dp", "micro_batch_size": "mb", "virtual_pipeline_model_parallel_size": "vp",
         "sequence_parallel": "sp", "recompute_granularity": "recompute", "use_distributed_optimizer": "dist-opt",
         "expert_model_parallel_size": "ep", "expert_tensor_parallel_size": "etp", "sharding": "sharding"}


def split_name(config: dict[str, Any]) -> str:
    """`tp2 pp4 dp8 mb1 vp2 sp recompute-full dist-opt`: a candidate's settings, defaults left out."""
    parts = [f"{SHORT[k]}{config[k]}" for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                                 "data_parallel_size", "micro_batch_size")]
    if config["context_parallel_size"] > 1:
        parts.append(f"cp{config['context_parallel_size']}")
    if config["virtual_pipeline_model_parallel_size"] > 1:
        parts.append(f"vp{config['virtual_pipeline_model_parallel_size']}")
    if config.get("expert_model_parallel_size"):
        parts.append(f"ep{config['expert_model_parallel_size']}")
        if config.get("expert_tensor_parallel_size") != config["tensor_model_parallel_size"]:
            parts.append(f"etp{config['expert_tensor_parallel_size']}")
    parts += ["sp"] if config["sequence_parallel"] else []
    parts += [f"recompute-{config['recompute_granularity']}"] if config["recompute_granularity"] != "none" else []
    parts += [config["sharding"].replace(" ", "")] if config.get("sharding") else []
    return " ".join(parts + (["dist-opt"] if config["use_distributed_optimizer"] else []))


def separation(first: dict[str, Any], second: dict[str, Any]) -> str:
    """What separates the best candidate from the next: the settings that differ and the largest breakdown gap."""
    diff = [f"{SHORT[k]} {first['config'][k]} vs {second['config'][k]}" for k in SHORT
            if first["config"].get(k) != second["config"].get(k)]
    gaps = {k: first["breakdown"][k] - second["breakdown"][k] for k in first["breakdown"]}
    part = max(gaps, key=lambda k: abs(gaps[k]))
    return (f"best vs next: {', '.join(diff) or 'same settings'}: {part.replace('_', ' ')} {gaps[part]:+.3g} s, "
            f"iteration {first['iteration_time_s'] - second['iteration_time_s']:+.3g} s")
