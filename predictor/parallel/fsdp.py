"""Sharded data parallelism as the frameworks run it (tracekit.core.sharding): the collectives of each FSDP unit,
where they sit in a micro-batch's forward and backward, what compute hides of them, and the memory they leave.

Units: one per decoder layer (torchtitan, Composer and Megatron-FSDP wrap each transformer block), and the root —
the parameters of a model chunk outside its layers (embedding, final norm, output layer), gathered once per
micro-batch and kept until its backward. Per unit and micro-batch, over the shard group (the data- and context-
parallel ranks, or with HSDP each replica's `dp·cp / replicas` of them):
- ZeRO-3 (`optim_grads_params`): an all-gather of the unit's parameters before its forward, and again before its
  backward unless it keeps them (`torch_fsdp2_reshard_after_forward` False: FSDP1 SHARD_GRAD_OP); a reduce-scatter
  of its gradients after its backward; with HSDP, an all-reduce of the gradient shard across the replicas.
  Bytes per rank: parameters · dtype · (N − 1)/N per all-gather (the message is the 1/N shard each rank holds), the
  same per reduce-scatter in the reduction dtype (fp32 unless the job reduces in bf16): FULL_SHARD moves 1.5× the
  bytes of DDP's all-reduce, SHARD_GRAD_OP the same.
- ZeRO-2 (`optim_grads`): the reduce-scatter per micro-batch; the updated parameters are all-gathered once per
  iteration after the optimizer step.
- FSDP's NO_SHARD: an all-reduce per unit and micro-batch.
- PyTorch's DDP (`torch-ddp`: torchtitan's `replicate`, whose loop reduces every micro-batch): the same all-reduce per
  unit — its 100 MB buckets fill in backward order as the units' gradients arrive —, the reducer copying each
  gradient into its bucket, divided by the ranks (one pass), and the reduced bucket back into the gradient (another);
  the buckets are a second copy of the gradients in memory (`gradient_as_bucket_view` off, the default). Its
  parameters stay fp32 and autocast computes in 16 bits: each forward casts every layer's weights (and the output
  layer's) once — a read of 4 bytes and a write of 2 per parameter — and a replayed forward (full recompute) again;
  the cast copies are kept for the backward (2 bytes per parameter in memory) where the layer is not recomputed.
PyTorch FSDP2 also copies each unit's shards into the gather buffer and out of it, and the gradients into the
reduce-scatter buffer (memory-bound copies on the compute stream), each estimated as its own op in the pass it runs in
(`tracekit sample` times them; a hardware without their samples answers them by its elementwise model). The
optimizer steps over 1/N of the parameters.
An MoE layer's experts are a unit of their own, sharded over the expert data-parallel ranks (the ranks holding the
same experts: torchtitan's `fully_shard` of the experts on the data-parallel mesh without the EP dimension,
Megatron-FSDP's and DeepSpeed's expert data-parallel group): the same collectives over that group, no HSDP replicas.

Overlap: FSDP issues the next unit's all-gather while the current unit computes (FSDP2's prefetch, FSDP1's
BACKWARD_PRE and the CPU running ahead), and the reduce-scatter of a unit beside the next unit's backward, on one
network: per layer the pass exposes max(0, its FSDP traffic − the layer's compute), the first unit's gather whole,
and the root's collectives whole. On a CPU the collectives' work runs on the cores that compute (gloo's threads): none
of it is hidden.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from predictor.architecture.params import chunk_params, layer_params
from predictor.ir.graph import Segment
from predictor.ir.ops import OpBuilder, OpUse
from predictor.ir.placement import group_placement
from predictor.layers.block import Block
from predictor.layers.decoder import blocks_named, layer_blocks
from predictor.layers.local_kernels import RES_ADD_MOVES
from predictor.parallel.grad_buckets import chunk_tag
from tracekit.core.pipeline_layout import chunks
from tracekit.core.samples import FSDP_COPY_IN, FSDP_COPY_OUT, FSDP_GRAD_COPY_IN
from tracekit.core.sharding import Sharding, sharding_of

if TYPE_CHECKING:
    from tracekit.core.config import TrainingConfig

#: The groups of FSDP's collectives: the shard group, (HSDP) the replicas of one shard, the experts' shard group.
SHARD, REPLICA, EXPERT_SHARD = "fsdp", "fsdp_replica", "efsdp"
GROUPS = (SHARD, REPLICA, EXPERT_SHARD)


def gather_bytes(c: TrainingConfig) -> int:
    """Bytes per parameter an all-gather moves: the compute dtype (fp8 with Megatron's fp8 parameter gather)."""
    if c.lowp is not None and c.lowp.fp8_param_gather and c.recipe.low_precision:
        return 1
    return c.dtype_bytes


def reduce_bytes(c: TrainingConfig) -> int:
    """Bytes per gradient a reduction moves: fp32 unless the job reduces in its 16-bit dtype
    (`accumulate_allreduce_grads_in_fp32` False: FSDP's mixed precision with a bf16 reduce dtype, Composer's PURE)."""
    if c.accumulate_allreduce_grads_in_fp32 is False and c.precision != "fp32":
        return 2
    return c.grad_bytes


def add_groups(b: OpBuilder, s: Sharding) -> None:
    """The shard group (consecutive data/context-parallel ranks, stride tp) and the replica group of the builder's
    configuration, as placements beside Megatron's."""
    c = b.c
    world = c.world_size
    b.groups[SHARD] = group_placement(SHARD, s.shard_size, c.tp, b.gpn, world)
    b.groups[REPLICA] = group_placement(REPLICA, s.replicas, c.tp * s.shard_size, b.gpn, world)
    if "edp" in b.groups:
        b.groups[EXPERT_SHARD] = b.groups["edp"]


def expert_shard_size(c: TrainingConfig) -> int:
    """Ranks an MoE layer's experts are sharded over: the expert data-parallel ranks."""
    return c.moe.expert_dp(c.world_size, c.pp, c.tp) if c.moe is not None else 1


def unit_ops(b: OpBuilder, s: Sharding, params: float, name: str, per_layer: bool, root: bool,
             experts: bool = False) -> tuple[list[OpUse], list[OpUse], list[OpUse]]:
    """(forward ops before the unit, backward ops before it, backward ops after it) of one unit holding `params`
    parameters on this GPU, per micro-batch (module docstring); `experts`: an MoE layer's experts, over their shard
    group."""
    c = b.c
    group = EXPERT_SHARD if experts else SHARD
    n = expert_shard_size(c) if experts else s.shard_size
    if params <= 0:
        return [], [], []
    before_fwd: list[OpUse] = []
    before_bwd: list[OpUse] = []
    after_bwd: list[OpUse] = []
    copies = s.implementation == "torch-fsdp2"
    ddp = s.implementation == "torch-ddp"

    def copy(label: str, variant: str, numel: float, pass_: str) -> OpUse:
        """One of FSDP2's copies, estimated as its op in the pass it runs in (tracekit.core.samples.FSDP_COPIES)."""
        return _flat(b, f"{name}.fsdp.{label}", variant, numel, pass_, per_layer)

    if s.params_sharded:
        gathers = 1 if root else s.parameter_gathers_per_microbatch
        for i, (where, pass_) in enumerate(((before_fwd, "fwd"), (before_bwd, "bwd"))[:gathers]):
            op = b.collective(f"{name}.fsdp.all_gather" + ("" if i == 0 else "_backward"), "all_gather", group,
                              params * gather_bytes(c) / n, per_layer)
            if op is None:
                continue
            if copies:
                where.append(copy("all_gather_copy_in", FSDP_COPY_IN, params / n, pass_))
            where.append(op)
            if copies:
                where.append(copy("all_gather_copy_out", FSDP_COPY_OUT, params, pass_))
    if s.reduce_every_microbatch:
        if s.grads_sharded:
            if copies:
                after_bwd.append(copy("reduce_scatter_copy_in", FSDP_GRAD_COPY_IN, params, "bwd"))
            op = b.collective(f"{name}.fsdp.reduce_scatter", "reduce_scatter", group, params * reduce_bytes(c) / n,
                              per_layer)
            if op is not None:
                after_bwd.append(op)
            across = None if experts else b.collective(f"{name}.fsdp.replica_all_reduce", "all_reduce", REPLICA,
                                                       params * reduce_bytes(c) / n, per_layer)
        else:  # NO_SHARD: DDP by FSDP, an all-reduce per unit
            label = "ddp" if ddp else "fsdp"
            across = b.collective(f"{name}.{label}.all_reduce", "all_reduce", group, params * reduce_bytes(c),
                                  per_layer)
        if across is not None:  # DDP's reducer copies the gradients into the bucket (scaled) and back around it
            if ddp:
                after_bwd.append(_bucket_copy(b, f"{name}.ddp.bucket_copy_in", params, per_layer))
            after_bwd.append(across)
            if ddp:
                after_bwd.append(_bucket_copy(b, f"{name}.ddp.bucket_copy_out", params, per_layer))
    return before_fwd, before_bwd, after_bwd


def _flat(b: OpBuilder, name: str, variant: str, numel: float, pass_: str, per_layer: bool,
          recompute: bool = False) -> OpUse:
    """An element-wise op over one flat buffer of `numel` elements (`rows` = numel, `width` 1), in pass `pass_`."""
    spec = b.spec("elementwise", pass_, variant, None, None, rows=numel, width=1.0, numel=numel)
    return OpUse(name, spec, per_layer=per_layer, recompute=recompute)


def _bucket_copy(b: OpBuilder, name: str, params: float, per_layer: bool) -> OpUse:
    """One pass of PyTorch DDP's reducer over `params` gradients in the reduction dtype (a read and a write), asked
    of the element-wise kernel's model at the numel that moves as much (predictor.layers.local_kernels.streaming)."""
    moves = 2.0 * params * reduce_bytes(b.c) / b.bytes
    return _flat(b, name, "ddp_bucket_copy", moves / RES_ADD_MOVES, "bwd", per_layer)


def autocast_casts(c: TrainingConfig, s: Sharding) -> bool:
    """Whether the job keeps fp32 parameters and casts them for 16-bit compute in each forward (PyTorch's DDP under
    autocast, torchtitan's: module docstring)."""
    return s.implementation == "torch-ddp" and c.precision in ("bf16", "fp16")


def weight_cast(b: OpBuilder, name: str, params: float, per_layer: bool, recompute: bool = False) -> OpUse:
    """Autocast's cast of `params` fp32 weights to the 16-bit compute dtype (a read of 4 bytes and a write of 2 each),
    asked of the element-wise kernel's model at the numel that moves as much; `recompute`: the replayed forward's, in
    the backward."""
    return _flat(b, name, "autocast_cast", params * (4 + 2) / b.bytes / RES_ADD_MOVES, "fwd", per_layer, recompute)


def pays_unit_hooks(c: TrainingConfig) -> bool:
    """Whether `c` runs torch FSDP2's hooks around each unit in every micro-batch (the host time `tracekit sample`
    measures per unit on a CPU: `framework` samples of variant `fsdp2_unit`)."""
    s = sharding_of(c)
    return s.implementation == "torch-fsdp2" and s.per_unit and not s.once_per_iteration(c.pp)


def hooked_units(ops: list[OpUse], forward: bool) -> int:
    """Units a forward or backward pass of `ops` runs FSDP's hooks for, per micro-batch: one per unit's forward
    all-gather, and in the backward one per unit's gradient reduction (its reduce-scatter, or NO_SHARD's all-reduce)."""
    ends = (".fsdp.all_gather",) if forward else (".fsdp.reduce_scatter", ".fsdp.all_reduce")
    return sum(op.count for op in ops if op.group in (SHARD, EXPERT_SHARD) and op.name.endswith(ends))


def insert_unit_ops(b: OpBuilder, segments: list[Segment]) -> None:
    """Put each unit's collectives into the segments' forward and backward (per layer beside the layer's ops, the
    root's at the ends of the chunk)."""
    c = b.c
    s = sharding_of(c)
    add_groups(b, s)
    if s.once_per_iteration(c.pp):  # gathered and reduced once per iteration: stage_sync's
        return
    layout = chunks(c)
    for seg in segments:
        part = layout[seg.stage][seg.chunk]
        kinds: dict[tuple[Block, ...], tuple[float, float]] = {}
        layers_total = 0.0
        for layer in part.layers:
            dense, expert = layer_params(c, layer)
            kinds.setdefault(layer_blocks(c, layer), (float(dense), float(expert)))
            layers_total += dense
        dense_chunk, _ = chunk_params(c, seg.stage, seg.chunk)
        seg.fwd = _per_layer(b, s, seg.fwd, kinds, forward=True)
        seg.bwd = _per_layer(b, s, seg.bwd, kinds, forward=False)
        root = dense_chunk - layers_total
        if root > 0 and (part.embedding or part.loss):
            fwd, _, after = unit_ops(b, s, root, "root", False, True)
            seg.fwd = fwd + seg.fwd
            seg.bwd = seg.bwd + after
        if part.loss and autocast_casts(c, s):  # the output layer's weight (the embedding's, tied), cast for its GEMM
            seg.fwd = seg.fwd + [weight_cast(b, "output_layer.autocast_cast", b.v // b.t * c.hidden_size, False)]


def _per_layer(b: OpBuilder, s: Sharding, ops: list[OpUse], kinds: dict[tuple[Block, ...], tuple[float, float]],
               forward: bool) -> list[OpUse]:
    """`ops` with each run of one layer block's ops wrapped in its units' collectives (an MoE layer's: its dense
    parameters' unit and its experts')."""
    out: list[OpUse] = []
    i = 0
    while i < len(ops):
        op = ops[i]
        if not op.per_layer or op.block.startswith("mtp"):
            out.append(op)
            i += 1
            continue
        j = i
        while j < len(ops) and ops[j].per_layer and (ops[j].block, ops[j].count) == (op.block, op.count):
            j += 1
        dense, expert = kinds.get(blocks_named(op.block), next(iter(kinds.values()), (0.0, 0.0)))
        before_fwd, before_bwd, after_bwd = unit_ops(b, s, dense, "layer", True, False)
        e_fwd, e_bwd, e_after = unit_ops(b, s, expert, "layer.experts", True, False, experts=True)
        pre = before_fwd + e_fwd if forward else before_bwd + e_bwd
        post = [] if forward else after_bwd + e_after
        if autocast_casts(b.c, s) and (forward or any(o.recompute for o in ops[i:j])):
            pre = pre + [weight_cast(b, "layer.autocast_cast", dense + expert, True, recompute=not forward)]
        out.extend(u.placed(op.count, u.recompute, op.block) for u in pre)
        out.extend(ops[i:j])
        out.extend(u.placed(op.count, False, op.block) for u in post)
        i = j
    return out


def stage_sync(b: OpBuilder, stage: int, dense: int, param_gather: list[OpUse], grad_sync: list[OpUse]) -> int:
    """Per-iteration work of stage `stage`'s `dense` parameters under per-unit sharding: ZeRO-2's all-gather of the
    updated parameters after the optimizer step (to `param_gather`); with PyTorch's pipelining, each unit's one
    all-gather and one reduce-scatter (and HSDP all-reduce) of the iteration (to `param_gather` and `grad_sync`, the
    reductions beside the last micro-batch's backward). Returns how many ranks the optimizer state is spread over."""
    c = b.c
    s = sharding_of(c)
    if s.once_per_iteration(c.pp) and dense > 0:
        for index, part in enumerate(chunks(c)[stage]):
            units = [(float(layer_params(c, layer)[0]), "layer", False) for layer in part.layers]
            root = chunk_params(c, stage, index)[0] - sum(p for p, _, _ in units)
            if root > 0:
                units.append((float(root), "root", False))
            units.extend((float(layer_params(c, layer)[1]), "layer.experts", True) for layer in part.layers)
            for params, name, experts in units:
                fwd, _, after = unit_ops(b, s, params, name, False, True, experts)
                param_gather.extend(o for o in fwd if o.group in GROUPS)
                grad_sync.extend(o for o in after if o.group in GROUPS)
    elif s.grads_sharded and not s.params_sharded and dense > 0:
        op = b.bucket("optimizer.fsdp.param_all_gather", "all_gather", dense * gather_bytes(c) / s.shard_size, SHARD)
        if op is not None:
            param_gather.append(op)
        expert = sum(chunk_params(c, stage, index)[1] for index in range(len(chunks(c)[stage])))
        n = expert_shard_size(c)
        op = b.bucket("optimizer.fsdp.expert_param_all_gather", "all_gather", expert * gather_bytes(c) / n,
                      EXPERT_SHARD) if expert > 0 else None
        if op is not None:
            param_gather.append(op)
    return s.optimizer_shard


def instance_buckets(b: OpBuilder, chunk_buckets: list[list[int]], grad_sync: list[OpUse],
                     param_gather: list[OpUse]) -> int:
    """Megatron's distributed optimizer in `num_distributed_optimizer_instances` instances (no FSDP): each gradient
    bucket (`chunk_buckets`: per model chunk, the elements of each of its dense buckets, grad_buckets' cut) is
    reduce-scattered inside an instance's ranks, its shard all-reduced across the instances, and the updated shard
    all-gathered inside the instance again. Returns how many ranks the optimizer state is spread over (one
    instance's)."""
    c = b.c
    s = sharding_of(c)
    add_groups(b, s)
    n = s.shard_size
    for chunk, sizes in enumerate(chunk_buckets):
        tag = chunk_tag(chunk)
        for i, numel in enumerate(sizes):
            for op, where in ((b.bucket(f"ddp.{tag}bucket{i}.reduce_scatter", "reduce_scatter",
                                        numel * c.grad_bytes / n, SHARD, chunk), grad_sync),
                              (b.bucket(f"ddp.{tag}bucket{i}.instance_all_reduce", "all_reduce",
                                        numel * c.grad_bytes / n, REPLICA, chunk), grad_sync),
                              (b.bucket(f"optimizer.{tag}bucket{i}.param_all_gather", "all_gather",
                                        numel * gather_bytes(c) / n, SHARD, chunk), param_gather)):
                if op is not None:
                    where.append(op)
    return n


def exposed_us(blocks: list[tuple[float, float, int]], root_us: float, overlap: bool) -> float:
    """Exposed FSDP time of one pass of a segment: `blocks` = per layer block (its FSDP collectives, its compute,
    layers) in execution order, `root_us` the root unit's collectives (module docstring)."""
    if not overlap:
        return root_us + sum(comm * count for comm, _, count in blocks)
    exposed = root_us
    for comm, compute, count in blocks:
        exposed += max(0.0, comm - compute) * count
    if blocks:
        comm, compute, _ = blocks[0]
        exposed += min(comm, compute)  # the first unit's gather has no compute before it to hide under
    return exposed


def memory_parts(c: TrainingConfig, dense: int, expert: int, expert_shard: int, layer_dense: float,
                 layers: int, layer_expert: float = 0.0) -> dict[str, float]:
    """Bytes per GPU of a stage's parameters, gradients and optimizer state under per-unit sharding (`dense`,
    `expert` parameters; `layer_dense`, `layer_expert`: one layer's, `layers` the stage's layers):
    - weights: the sharded parameters (fp32 masters with torch FSDP's mixed precision, the training dtype otherwise)
      plus the gathered units in flight (the unit computing and the one prefetched; every layer between forward and
      backward when units keep their parameters; the root);
    - gradients: the sharded gradients (whole ones without ZeRO-2) plus the unsharded gradients of the units in
      flight;
    - optimizer state: Adam's m and v (and Megatron-FSDP's fp32 main parameters) over the optimizer's ranks.
    Experts shard over the expert data-parallel ranks (`expert_shard`), dense parameters over the shard group."""
    s = sharding_of(c)
    n = s.shard_size
    torch_fsdp = s.implementation.startswith("torch-")  # FSDP's and DDP's fp32 parameters
    compute = c.dtype_bytes
    store = 4 if torch_fsdp else compute  # torch FSDP keeps fp32 parameters and casts them for compute
    state = 8 if (torch_fsdp or c.precision == "fp32") else 12
    grad = 4 if torch_fsdp else c.grad_bytes
    root = max(0.0, dense - layer_dense * layers)
    weights = ((dense / n + expert / expert_shard) if s.params_sharded else dense + expert) * store
    if s.params_sharded:
        in_flight = (layer_dense + layer_expert) * (2 if s.reshard_after_forward else layers) + root
        weights += in_flight * compute
    gradients = ((dense / n + expert / expert_shard) if s.grads_sharded else dense + expert) * grad
    if s.implementation == "torch-ddp":  # the reducer's buckets: a second copy of every gradient
        gradients *= 2
    if autocast_casts(c, s):  # the cast weights of the layers not replayed in full, kept for their backward
        kept = sum(not c.replays_in_full(position) for position in range(layers))
        weights += (layer_dense + layer_expert) * kept * compute
    if s.once_per_iteration(c.pp):  # pipelined: gradients accumulate unsharded until the last micro-batch
        gradients = (dense + expert) * grad
    elif s.grads_sharded:
        gradients += 2 * (layer_dense + layer_expert) * reduce_bytes(c)
    optimizer = dense / s.optimizer_shard * state + expert / expert_shard * state
    return {"weights": weights, "gradients": gradients, "optimizer_state": optimizer}


def shards(c: TrainingConfig) -> bool:
    """Whether `c` shards its gradients or parameters with FSDP/ZeRO (a search then splits its shard groups and
    leaves Megatron's distributed optimizer alone)."""
    s = sharding_of(c)
    return s.fsdp and s.stage >= 2


def shard_splits(c: TrainingConfig) -> list[TrainingConfig]:
    """`c` with each way FSDP can split its dp·cp ranks into HSDP replicas of a shard group (replicas dividing the
    ranks; 1 replica is plain FSDP), not validated, for a search; `[c]` when it does not shard with FSDP."""
    import dataclasses

    from tracekit.core.sharding import ShardingSettings

    if not shards(c):
        return [c]
    ranks = c.dp * c.cp
    base = c.sharding or ShardingSettings()
    return [dataclasses.replace(c, sharding=dataclasses.replace(base, num_distributed_optimizer_instances=r))
            for r in range(1, ranks + 1) if ranks % r == 0]
