"""Configuration search: the splits Megatron accepts for a model on N GPUs, pruned by memory, predicted in one batched
model call (`predict.prepare_many`), ranked.

Public API:

    enumerate_configs(base: dict, gpus: int, fixed: set[str], context_parallel=False) -> (configs, rejected)
    evaluate(configs, cluster, models, calibration, gpus, price) -> (candidate rows, {"memory", "failed"})
    search(base, gpus, cluster, models, fixed, calibration=None, objective="time", price_per_gpu_hour=None,
           executor=None, context_parallel=False) -> SearchResult

`base` is the job as Megatron argument names (the model, the global batch, whatever else the input states); keys in
`fixed` keep the input's value, the others of SEARCH_KEYS are varied: tensor parallelism (divides the heads and the
query groups), pipeline parallelism (divides the layers), context parallelism (only when `context_parallel` opens it:
2·cp divides the sequence), data parallelism (the rest of the GPUs), micro-batch size (divides the per-replica batch, at
most MAX_MICRO_BATCH), interleaving (virtual stages that divide a stage's layers, when the micro-batches divide by pp),
sequence parallelism (with tp > 1), activation recompute (none, selective, full) and the distributed optimizer (with
dp > 1). A job that shards with FSDP/ZeRO-2/3 (tracekit.core.sharding) keeps its strategy and varies its shard group
instead: every number of HSDP replicas dividing the dp·cp ranks (1: FSDP over all of them; the setting
`num_distributed_optimizer_instances`). A candidate Megatron would refuse (`TrainingConfig.validate`) is counted
under `pruned["invalid"]`; one whose memory per GPU exceeds the GPU's under `pruned["memory"]`. Ranking: iteration
time (`time`), tokens per second (`tokens_per_s`) or cost per iteration (`cost`, with a price per GPU-hour).
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from tracekit.core.cluster import Cluster
from tracekit.core.config import TrainingConfig, setting_name
from tracekit.core.errors import ConfigError
from tracekit.core.hardware import hardware_spec
from tracekit.core.sharding import sharding_of

from .fsdp import shard_splits, shards
from .memory import config_memory
from .predict import compose_many, prepare_many

SEARCH_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
               "micro_batch_size", "virtual_pipeline_model_parallel_size", "sequence_parallel",
               "recompute_granularity", "use_distributed_optimizer")
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

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        return {"candidates": self.candidates[:top] if top else self.candidates, "evaluated": self.evaluated,
                "pruned": self.pruned, "seconds": self.seconds, "objective": self.objective, "notes": self.notes}


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

    heads, groups, layers = model.num_attention_heads, model.num_query_groups, model.num_layers
    tps = options("tensor_model_parallel_size", [t for t in _divisors(gpus) if heads % t == 0 and groups % t == 0])
    pps = options("pipeline_model_parallel_size", [p for p in _divisors(gpus) if layers % p == 0])
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
        sps = options("sequence_parallel", [tp > 1])
        dist = options("use_distributed_optimizer", [False, True] if dp > 1 and not shards(model) else
                       [model.use_distributed_optimizer])  # FSDP/ZeRO-2/3 jobs shard without it
        for mb, sp, distributed in itertools.product(mbs, sps, dist):
            m = per_replica // mb if per_replica and per_replica % mb == 0 else 0
            vps = options("virtual_pipeline_model_parallel_size",
                          [1] + ([v for v in _divisors(layers // pp)[1:] if m and m % pp == 0] if pp > 1 else []))
            for vp in vps:
                split = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                         "context_parallel_size": cp, "data_parallel_size": dp, "micro_batch_size": mb,
                         "virtual_pipeline_model_parallel_size": vp or 1, "sequence_parallel": sp,
                         "recompute_granularity": recompute, "use_distributed_optimizer": distributed}
                candidate = dataclasses.replace(model, extra=dict(model.extra), **split)
                # an FSDP job's shard groups: FSDP over every data-parallel rank, or HSDP replicas of smaller ones
                for variant in shard_splits(candidate) if "num_distributed_optimizer_instances" not in fixed \
                        else [candidate]:
                    try:  # the job's parsed settings with this split (what parsing them all again would give)
                        configs.append(variant.validate())
                    except ConfigError:
                        rejected += 1
    return configs, rejected


#: Candidates prepared and composed at a time: bounds the graphs and timelines held in memory at once.
CHUNK = 1024


def shape(config: TrainingConfig) -> tuple[int, int, int]:
    """The pipeline shape (pp, vp, micro-batches): candidates of one shape share their schedule simulation."""
    return config.pp, config.vp, config.num_microbatches


def evaluate(configs: list[TrainingConfig], cluster: Cluster, models, calibration=None, gpus: int = 1,
             price_per_gpu_hour: float | None = None) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """One shard of the work: the memory check of every candidate; for those that fit, in chunks of about CHUNK
    candidates of whole pipeline shapes, graphs and operator estimates (one batched model call per chunk, for the
    operator rows not estimated before) and the schedule simulations (one shape's together). Returns (candidate
    rows, {"memory": pruned, "failed": unpredictable}). The local executor runs it on everything, the Ray one per
    shard."""
    spec = hardware_spec(cluster.hardware)
    fitting, too_big = [], 0
    for config in configs:  # the memory check needs no operator graph: prune before building any
        memory, _ = config_memory(config, cluster.hardware)
        if spec is not None and memory["total"] > spec.memory_gb:
            too_big += 1
        else:
            fitting.append((config, memory))
    fitting.sort(key=lambda item: shape(item[0]))
    rows: list[dict[str, Any]] = []
    failed, start = 0, 0
    while start < len(fitting):
        end = min(start + CHUNK, len(fitting))
        while end < len(fitting) and shape(fitting[end][0]) == shape(fitting[end - 1][0]):
            end += 1
        part, start = fitting[start:end], end
        prepared, kept = [], []
        for (config, memory), item in zip(part, prepare_many([c for c, _ in part], cluster, models)):
            if isinstance(item, Exception):
                failed += 1
            else:
                prepared.append(item)
                kept.append((config, memory))
        for (config, memory), prediction in zip(kept, compose_many(prepared, calibration)):
            if isinstance(prediction, Exception):
                failed += 1
            else:
                rows.append(_row(config, memory, prediction, gpus, price_per_gpu_hour))
    return rows, {"memory": too_big, "failed": failed}


def _row(config: TrainingConfig, memory: dict, prediction, gpus: int, price_per_gpu_hour: float | None) -> dict:
    seconds = prediction.iteration_time_s
    return {
        "config": {**{k: getattr(config, k) for k in SEARCH_KEYS}, "data_parallel_size": config.dp,
                   "virtual_pipeline_model_parallel_size": config.vp,
                   **({"sharding": sharding_of(config).name} if shards(config) else {})},
        "iteration_time_s": seconds, "tokens_per_s": prediction.tokens_per_s, "mfu": prediction.mfu,
        "tflops_per_gpu": prediction.tflops_per_gpu, "memory_gb_per_gpu": memory["total"], "fits": True,
        "cost_per_iteration": seconds * gpus * price_per_gpu_hour / 3600 if price_per_gpu_hour else None,
        "breakdown": prediction.breakdown,
    }


def search(base: dict[str, Any], gpus: int, cluster: Cluster, models, fixed: set[str] | None = None,
           calibration=None, objective: str = "time", price_per_gpu_hour: float | None = None,
           executor=None, context_parallel: bool = False) -> SearchResult:
    """Enumerate, prune by memory, predict in one batched call, rank (see the module docstring). `executor`
    (default: this process) is anything with `run(configs, cluster, models, calibration, gpus, price)` returning
    what `evaluate` returns, e.g. `predictor.ray_executor.RayExecutor`."""
    objective = objective.replace("-", "_")  # tokens-per-s or tokens_per_s
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective must be one of {', '.join(OBJECTIVES)}, not {objective!r}")
    if objective == "cost" and not price_per_gpu_hour:
        raise ConfigError("the cost objective needs a price per GPU-hour (--price-per-gpu-hour)")
    start = time.perf_counter()
    fixed = {setting_name(k) for k in (fixed or set())}
    configs, rejected = enumerate_configs(base, gpus, fixed, context_parallel)
    if executor is None:
        candidates, pruned = evaluate(configs, cluster, models, calibration, gpus, price_per_gpu_hour)
    else:
        candidates, pruned = executor.run(configs, cluster, models, calibration, gpus, price_per_gpu_hour)
    key = {"time": lambda c: c["iteration_time_s"], "tokens_per_s": lambda c: -c["tokens_per_s"],
           "cost": lambda c: c["cost_per_iteration"]}[objective]
    candidates.sort(key=lambda c: (key(c), split_name(c["config"])))  # ties: one order whatever the executor
    notes = [separation(candidates[0], candidates[1])] if len(candidates) >= 2 else []
    return SearchResult(candidates, len(candidates) + pruned["failed"], {"invalid": rejected, **pruned},
                        time.perf_counter() - start, objective, notes)


SHORT = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp", "context_parallel_size": "cp",
         "data_parallel_size": "dp", "micro_batch_size": "mb", "virtual_pipeline_model_parallel_size": "vp",
         "sequence_parallel": "sp", "recompute_granularity": "recompute", "use_distributed_optimizer": "dist-opt",
         "sharding": "sharding"}


def split_name(config: dict[str, Any]) -> str:
    """`tp2 pp4 dp8 mb1 vp2 sp recompute-full dist-opt`: a candidate's settings, defaults left out."""
    parts = [f"{SHORT[k]}{config[k]}" for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                                 "data_parallel_size", "micro_batch_size")]
    if config["context_parallel_size"] > 1:
        parts.append(f"cp{config['context_parallel_size']}")
    if config["virtual_pipeline_model_parallel_size"] > 1:
        parts.append(f"vp{config['virtual_pipeline_model_parallel_size']}")
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
