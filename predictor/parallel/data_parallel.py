"""What each pipeline stage does once per iteration after its last backward: the data-parallel gradient reduction,
the distributed optimizer's parameter all-gather, the tied embedding's gradient all-reduce, the optimizer step, and
the low-precision recipe's weight casts, Muon's orthogonalisation (predictor.parallel.muon), and the loss report and
logging barrier (predictor.parallel.iteration_syncs).

Megatron's DDP keeps each model chunk's gradients in buckets (predictor.parallel.grad_buckets: max(40M, 1M · ranks)
elements on the first stage's first chunk with `overlap_grad_reduce`, else one per buffer): dense parameters are reduced
over the data- and context-parallel ranks (`dpcp`), expert parameters over the expert data-parallel ranks (`edp`), each
in buckets of their own: an all-reduce of the bucket, or with the distributed optimizer a reduce-scatter of it and,
after the step, an all-gather of the updated parameters (1/ranks of the bucket each; fp8 parameters with
`fp8_param_gather`, MXFP8 ones in bf16: `param_gather_bytes`; under FSDP/ZeRO-2+ the experts are sharded per unit
instead, predictor.parallel.fsdp). The optimizer step updates the stage's dense parameters / dpcp (sharded) plus its
expert parameters / edp, asked of the fused step's model at the parameters that move as many bytes where Adam's state is
in other dtypes (the precision-aware optimizer: tracekit.core.optimizer_state.step_bytes); under torch FSDP2 they are
DTensors, whose step is sampled of its own (`tracekit sample`: every op dispatched through DTensor; models without such
samples answer with the plain step, what a GPU's kernels take while its host dispatches ahead); without apex and
Transformer Engine, torch AdamW's foreach passes beyond the fused step's (predictor.layers.local_kernels). Weights cast
by the recipe (tracekit.core.precision) are cast once per iteration.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from predictor.ir.ops import OpBuilder, OpUse
from predictor.layers.local_kernels import optimizer_ops
from predictor.parallel import fsdp, iteration_syncs, muon
from predictor.parallel.grad_buckets import StageBuckets, chunk_tag, stage_buckets
from tracekit.core.config import TrainingConfig
from tracekit.core.optimizer_state import FUSED_ADAM_BYTES, step_bytes
from tracekit.core.samples import DTENSOR_SUFFIX


@dataclass
class StageSync:
    grad_sync: list[OpUse] = field(default_factory=list)  # DP buckets (dpcp, edp) and the embedding sync (embd)
    param_gather: list[OpUse] = field(default_factory=list)  # distributed optimizer's all-gathers
    optimizer: OpUse | None = None
    casts: list[OpUse] = field(default_factory=list)  # compute once per iteration beside the step (weight casts)
    reports: list[tuple[OpUse, float]] = field(default_factory=list)  # (op, per iteration) after it, exposed
    buckets: StageBuckets = field(default_factory=list)  # the stage's gradient buffers as cut (grad_buckets)


def param_gather_bytes(c: TrainingConfig) -> int:
    """Bytes per parameter the distributed optimizer's all-gather moves: the training dtype's, one with fp8
    parameters — except MXFP8's, which Megatron-core gathers in bf16 into the bucket's gradient buffer and quantises
    in place after (`param_and_grad_buffer.py`: a buffer with MXFP8 parameters under the distributed optimizer shares
    one storage between the param all-gather and the gradient reduce-scatter, `_post_param_sync` copies it into the
    MXFP8 tensors)."""
    lowp = c.lowp is not None and c.lowp.fp8_param_gather and c.recipe.low_precision
    return 1 if (lowp and c.recipe.name != "mxfp8") else c.dtype_bytes


def _buckets(b: OpBuilder, sizes: list[int], group: str, chunk: int, sync: StageSync) -> None:
    """The collectives of one buffer's buckets (`sizes`: elements each) of model chunk `chunk` on data-parallel group
    `group` (named `ddp.bucket3.all_reduce`, `ddp.chunk1.expert_bucket0.reduce_scatter`)."""
    c = b.c
    tag = chunk_tag(chunk) + ("expert_" if group == "edp" else "")
    ranks = b.groups[group].size
    grad_bytes = c.grad_bytes  # fp32 main grads with bf16 (Megatron's rule), or when the stack/config asks
    gather_bytes = param_gather_bytes(c)
    for i, numel in enumerate(sizes):
        if c.use_distributed_optimizer:
            op = b.bucket(f"ddp.{tag}bucket{i}.reduce_scatter", "reduce_scatter", numel * grad_bytes / ranks, group,
                          chunk)
            gather = b.bucket(f"optimizer.{tag}bucket{i}.param_all_gather", "all_gather",
                              numel * gather_bytes / ranks, group, chunk)
            if gather:
                sync.param_gather.append(gather)
        else:
            op = b.bucket(f"ddp.{tag}bucket{i}.all_reduce", "all_reduce", numel * grad_bytes, group, chunk)
        if op:
            sync.grad_sync.append(op)


def stage_sync(b: OpBuilder, stage: int, weight_cast_elements: float) -> StageSync:
    """The per-iteration ops of pipeline stage `stage` (`weight_cast_elements`: the weights the recipe casts on it)."""
    c = b.c
    pp = c.pp
    sync = StageSync()
    sharding = fsdp.sharding_of(c)
    buckets = sync.buckets = stage_buckets(c, stage, sharding.dp)  # [(dense sizes, expert sizes)] per chunk
    dense, expert = sum(sum(d) for d, _ in buckets), sum(sum(e) for _, e in buckets)
    if sharding.per_unit:  # FSDP reduces each unit's gradients in the backward (predictor.parallel.fsdp)
        shard_dense = fsdp.stage_sync(b, stage, dense, sync.param_gather, sync.grad_sync)
    elif sharding.replicas > 1:  # the distributed optimizer in instances (predictor.parallel.fsdp)
        shard_dense = fsdp.instance_buckets(b, [sizes for sizes, _ in buckets], sync.grad_sync, sync.param_gather)
    else:
        for chunk, (sizes, _) in enumerate(buckets):
            _buckets(b, sizes, "dpcp", chunk, sync)
        shard_dense = b.groups["dpcp"].size if c.use_distributed_optimizer else 1
    if not sharding.per_unit:  # per-unit sharding (and PyTorch's DDP) reduces the experts per unit too
        for chunk, (_, sizes) in enumerate(buckets):
            _buckets(b, sizes, "edp", chunk, sync)
    tied = pp > 1 and not c.untie_embeddings_and_output_weights and stage in (0, pp - 1)
    if tied:  # word-embedding gradient shared by the first and last stage
        place = b.groups["p2p"]
        numel = b.v // b.t * c.hidden_size
        spec = b.spec("all_reduce", "comm", "allreduce", None, None, bytes=numel * c.grad_bytes, group_size=2,
                      ranks_per_node=place.ranks_per_node, nodes=place.nodes, numel=numel)
        sync.grad_sync.append(OpUse("embedding.grad_all_reduce", spec, group="embd"))
    kind = "firstStage" if stage == 0 else "lastStage" if stage == pp - 1 else "middleStage"
    layers = sum(len(part.layers) for part in _stage_chunks(c, stage))
    shard_expert = b.groups["edp"].size if (c.use_distributed_optimizer or sharding.fsdp) else 1
    params = -(-dense // shard_dense) + -(-expert // shard_expert)
    dtensor = DTENSOR_SUFFIX if sharding.implementation == "torch-fsdp2" else ""  # FSDP2's parameters are DTensors
    moved = step_bytes(c) / FUSED_ADAM_BYTES  # Adam's state in other dtypes: the parameters that move as many bytes
    spec = b.spec("optimizer", "optimizer", f"{kind}_optimizer{dtensor}", None, None, layers=layers,
                  width=c.hidden_size, tp=c.tp, params=params * moved)
    sync.optimizer = OpUse("optimizer.step", spec)
    sync.casts.extend(optimizer_ops(b, params))  # torch AdamW's foreach passes without apex or TE (local_kernels)
    if weight_cast_elements:
        sync.casts.append(b.quantize("optimizer.quantize_weights", weight_cast_elements, per_layer=False)[0])
    sync.casts.extend(muon.stage_ops(b, stage))  # Muon's Newton-Schulz iterations (predictor.parallel.muon)
    sync.reports = iteration_syncs.stage_ops(b, stage)
    return sync


def _stage_chunks(c, stage: int):
    from tracekit.core.pipeline_layout import chunks

    return chunks(c)[stage]
