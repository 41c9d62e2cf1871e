"""Memory per GPU: weights, gradients, optimizer state and activations of the most loaded pipeline stage.

Activations follow Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (2022), per
layer and micro-batch, generalised to the layers tracekit builds, each block of a layer answering for its own
(`predictor.layers.block.Block.saved`). What one layer keeps for its backward, in bytes per
token (2-byte activations, 1-byte dropout masks):
- replicated over TP without SP (Korthikanti's 10·s·b·h): the two norms' inputs (4h), the QKV and FC1 inputs (4h),
  the two dropout masks (2h);
- split over TP: attention's q, k, v (2·(heads + 2·groups)·d for MHA/GQA; MLA's down-projection outputs, up-projection
  outputs and q/k/v), its output (2·heads·d_v), the unfused attention's scores (5·heads·s: Korthikanti's 5as/h term);
  the MLP's activation input and FC2 input (2·f1 + 2·f: 16h for a 4h GeLU MLP, which with the above gives
  Korthikanti's 24h/t); an MoE layer instead keeps its routed copies (k per token, λ-weighted, on the experts' ETP
  ranks): FC1 input, activation input and FC2 input per copy, plus the shared experts like an MLP.
With SP every part is split over TP. Recompute drops what it replays and keeps what it replays from (Megatron-core's
CheckpointWithoutOutput and checkpoint): selective `core_attn` the scores (flash attention keeps none anyway),
`layernorm` the norms' outputs (QKV's, FC1's and the router's inputs; the norms' inputs stay), `moe_act` the
activation's output (FC2's input; the activation's input stays), `mla_up_proj` q, k, v, `mlp`/`moe`/`shared_experts`
everything inside the module but its input; full recompute keeps only each layer's input (2·h per token, /t with
SP) plus one layer's working set. 1F1B keeps min(pp − stage, m) micro-batches in flight on a stage (interleaved:
× (1 + (pp − 1)/(pp·vp))); PyTorch's zero-bubble schedules what their orders hold (predictor.memory.zero_bubble).
Megatron's CPU offloading (`--cpu-offloading-num-layers N`, activations only, its default) keeps the first N layers'
activations on the host: one such layer's stays on the GPU as a working set.
Parameters: bf16/fp16 weights (2 bytes), gradients in the main-gradient dtype, Adam state (fp32 master, m, v: 12 bytes,
8 in fp32 training; the precision-aware optimizer's dtypes: tracekit.core.optimizer_state), sharded over the
data-parallel ranks with the distributed optimizer — dense parameters over dp·cp, expert parameters over the expert
data-parallel ranks.
"""
from __future__ import annotations

from itertools import accumulate

from predictor.architecture.params import chunk_params, layer_params
from predictor.ir.graph import Graph
from predictor.layers.block import Saving
from predictor.layers.decoder import layer_blocks, mtp_layer
from predictor.memory.lowp_weights import extra_weight_bytes
from predictor.memory.workspaces import workspace_bytes
from predictor.memory.zero_bubble import gemm_input_share, in_flight
from predictor.parallel import fsdp
from predictor.schedule.activation_offload import offload_modules
from predictor.schedule.pipeline import stage_order
from tracekit.core.config import TrainingConfig
from tracekit.core.hardware import hardware_spec
from tracekit.core.optimizer_state import adam_state
from tracekit.core.pipeline_layout import chunks, torch_schedule
from tracekit.core.runtime import deferred_share, output_layer_calls

GB = 1e9


def _layer_bytes(c: TrainingConfig, layer: int, lowp: bool = True, host: frozenset[str] = frozenset()) -> float:
    """Bytes one layer keeps per micro-batch on one GPU: the sum of its blocks' (`predictor.layers.block.Block.saved`,
    module docstring); `lowp`: its GEMM inputs are kept in the precision recipe's format (Transformer Engine saves
    the quantised copy for the weight gradient); `host`: the modules whose saved tensors fine-grained activation
    offloading keeps on the host instead (`offload_modules`: what a module saves inside its offload group — its
    input, and core attention's unfused scores too)."""
    tokens = c.seq_length // c.cp * c.micro_batch_size
    t = c.tp
    q = c.recipe.out_bytes / 2.0 if (lowp and c.recipe.low_precision) else 1.0  # a GEMM input's bytes over bf16's
    modules = set(c.recompute_modules or ("core_attn",)) if c.recompute_granularity == "selective" else set()
    if "per_op" in modules:  # torchtitan's per-op policy replays the norms (what it keeps of the rest: as is)
        modules.add("layernorm")
    # `layernorm` replays the norms from their inputs (kept) and frees their outputs, the QKV/FC1/router inputs
    # (under fp8 those GEMMs save that bf16 output instead of an fp8 copy: Megatron's set_save_original_input)
    normed = 0.0 if "layernorm" in modules else 1.0
    saving = Saving(q, frozenset(modules), host, normed, tokens)
    replicated = split = extra = 0.0
    for block in layer_blocks(c, layer):
        saved = block.saved(c, saving)
        replicated += saved.replicated
        split += saved.split
        extra += saved.extra
    if c.sequence_parallel:
        return tokens * (replicated + split) / t + extra
    return tokens * (replicated + split / t) + extra


def _input_bytes(c: TrainingConfig) -> float:
    """One layer's input, what full recompute keeps."""
    tokens = c.seq_length // c.cp * c.micro_batch_size
    return 2.0 * tokens * c.hidden_size / (c.tp if c.sequence_parallel else 1)


#: Bytes per logit at the loss by cross-entropy implementation (`cross_entropy_fusion_impl` with
#: `cross_entropy_loss_fusion`): Transformer Engine's works in place on the 2-byte logits; flash-attn's (llm-foundry's
#: `fused_crossentropy`) keeps them and returns a 2-byte gradient; PyTorch's under autocast holds the 2-byte logits,
#: their fp32 cast and the fp32 log-softmax it saves (its backward: that output, its fp32 gradient and the 2-byte
#: one returned).
LOSS_BYTES = {"te": 2.0, "flash_attn": 4.0, "torch": 10.0}


def _loss_bytes(c: TrainingConfig) -> float:
    """Bytes per logit at the loss on top of the last stage's activations. Megatron's vocab-parallel cross entropy
    (unfused, or its `native` fusion) casts the logits to fp32 and keeps that copy as the softmax: its forward holds
    the 2-byte logits beside the 4-byte copy, its backward the fp32 softmax beside the 2-byte gradient it returns (6
    bytes either way). Other implementations: `LOSS_BYTES`."""
    impl = c.extra.get("cross_entropy_fusion_impl") if c.extra.get("cross_entropy_loss_fusion") else None
    return LOSS_BYTES.get(str(impl), 2.0 + 4.0)


def deferred_wgrad_bytes(c: TrainingConfig) -> float:
    """What `defer_embedding_wgrad_compute` keeps on the last stage until the pipeline flush: each deferred output-layer
    call's input (its [s, b, h] share of the rank: 1/tp with sequence parallelism) and output gradient ([s, b, V/tp]),
    both in the training dtype (tracekit.core.runtime.deferred_share of the iteration's calls)."""
    calls = deferred_share(c) * output_layer_calls(c)
    if not calls:
        return 0.0
    tokens = c.seq_length // c.cp * c.micro_batch_size
    width = c.hidden_size / (c.tp if c.sequence_parallel else 1) + c.padded_vocab_size / c.tp
    return calls * tokens * width * c.dtype_bytes


def _in_flight(c: TrainingConfig, stage: int) -> float:
    """Micro-batches whose activations `stage` holds at its peak: the most forwards its schedule has run ahead of
    their backwards (predictor.schedule.pipeline.stage_order, Megatron-core's order: 1F1B min(pp − stage, m);
    interleaved, (pp − stage − 1)·2 + (vp − 1)·g + 1 chunk forwards, one more with `overlap_moe_expert_parallel_comm`),
    in micro-batches of the whole stage (a chunk holds 1/vp of its layers). PyTorch's schedules (torchtitan's
    `pipeline_parallel_schedule`): the peak of their own orders, a split backward's weight part holding the GEMM
    inputs until its W (predictor.memory.zero_bubble)."""
    if c.pp == 1:
        return 1.0
    schedule = torch_schedule(c)
    if schedule is not None:
        tokens = c.seq_length // c.cp * c.micro_batch_size
        q = c.recipe.out_bytes / 2.0 if c.recipe.low_precision else 1.0
        return in_flight(schedule, c, stage, gemm_input_share(c, _layer_bytes(c, 0) / tokens, q))
    order = stage_order(stage, c.pp, c.vp, c.num_microbatches, c.microbatch_group)
    ahead = max(accumulate(1 if kind == "F" else -1 for kind, _, _ in order))
    if c.vp > 1 and c.moe is not None and c.moe.overlap_moe_expert_parallel_comm:
        ahead = min(ahead + 1, c.num_microbatches * c.vp)
    return ahead / c.vp


def memory_per_gpu(graph: Graph) -> tuple[dict[str, float], list[str]]:
    """({weights, gradients, optimizer_state, activations, total} in GB for the fullest stage, warnings)."""
    return config_memory(graph.config, graph.hardware)


def stage_memory(c: TrainingConfig, hardware: str | None = None) -> list[dict[str, float]]:
    """{weights, gradients, optimizer_state, activations, workspaces, total} in GB on a GPU of each pipeline stage,
    in stage order (the last stage holds the loss). `hardware`: the GPU, for what depends on it (the GEMM
    workspaces, predictor.memory.workspaces; the quantised weight copies a recipe keeps, predictor.memory.lowp_weights);
    without it no workspace is counted and weights keep the copies of Hopper and earlier."""
    weight_bytes = 4 if c.precision == "fp32" else 2
    grad_bytes = c.grad_bytes
    adam = adam_state(c)  # Adam's m, v and main parameters (tracekit.core.optimizer_state)
    state_bytes = adam.state_bytes
    distributed = c.use_distributed_optimizer
    dense_shard = c.dp * c.cp if distributed else 1
    sharded = fsdp.sharding_of(c)
    expert_shard = fsdp.expert_shard_size(c) if (distributed or sharded.fsdp) else 1
    if distributed and not sharded.per_unit:  # in instances: each shards over one instance's ranks
        dense_shard = sharded.optimizer_shard
    logits = c.seq_length // c.cp * c.micro_batch_size * c.padded_vocab_size / c.tp * _loss_bytes(c)
    layout = chunks(c)
    offloaded = int(c.extra.get("cpu_offloading_num_layers") or 0)  # Megatron's CPU offloading: activations on host
    host = frozenset(offload_modules(c))  # fine-grained activation offloading: these modules' inputs on the host
    per_lowp_weight = extra_weight_bytes(c, hardware)  # the recipe's quantised copies of a GEMM weight
    workspaces = workspace_bytes(c, hardware)
    cache: dict[tuple[tuple, bool], float] = {}
    kept: dict[tuple[tuple, bool], float] = {}
    rows: list[dict[str, float]] = []
    for stage in range(c.pp):
        dense = expert = 0
        lowp_params = 0
        acts = 0.0
        working = 0.0
        for index, part in enumerate(layout[stage]):
            d, e = chunk_params(c, stage, index)
            dense += d
            expert += e
            for position, layer in enumerate(part.layers):
                full = c.replays_in_full(position)
                bf16 = bool(c.lowp and c.lowp.bf16_layer(layer, c.num_layers))
                kind = (layer_blocks(c, layer), bf16)  # what a layer's activations depend on
                if per_lowp_weight and not bf16:  # its GEMM weights (its norms and router, < 1%, with them)
                    lowp_params += sum(layer_params(c, layer))
                if kind not in cache:
                    cache[kind] = _layer_bytes(c, layer, not bf16)
                    kept[kind] = _layer_bytes(c, layer, not bf16, host) if host else cache[kind]
                on_host = not full and position < offloaded
                acts += _input_bytes(c) if full else 0.0 if on_host else kept[kind]
                if full or on_host:  # a recomputed layer's, or an offloaded one's copy on its way in or out
                    working = max(working, cache[kind])
                elif host:  # one layer's offloaded inputs on their way out or back in
                    working = max(working, cache[kind] - kept[kind])
            if part.mtp:
                acts += part.mtp * _layer_bytes(c, mtp_layer(c))
        in_flight = _in_flight(c, stage)
        has_loss = any(part.loss for part in layout[stage])
        activations = acts * in_flight + working + (logits + deferred_wgrad_bytes(c) if has_loss else 0.0)
        params = dense + expert
        # 2-byte gradients (fp16, or bf16 reduced in bf16): Megatron's mixed-precision optimizer gives its fp32 main
        # parameters (a shard of them with the distributed optimizer) fp32 copies of the gradients, kept until the
        # next step's zero_grad; the precision-aware optimizer reads the gradient buffer itself
        copied = grad_bytes == 2 and not adam.decoupled_grads
        main_grads = (dense / dense_shard + expert / expert_shard) * 4 if copied else 0.0
        row = {
            "weights": (params * weight_bytes + lowp_params * per_lowp_weight) / GB,
            "gradients": (params * grad_bytes + main_grads) / GB,
            "optimizer_state": (dense / dense_shard + expert / expert_shard) * state_bytes / GB,
            "activations": activations / GB,
        }
        if sharded.per_unit:  # FSDP/ZeRO-2/3: shards plus the gathered units in flight (predictor.parallel.fsdp)
            stage_layers = [layer for part in layout[stage] for layer in part.layers]
            layer_dense = max((layer_params(c, layer)[0] for layer in stage_layers), default=0)
            layer_expert = max((layer_params(c, layer)[1] for layer in stage_layers), default=0)
            parts = fsdp.memory_parts(c, dense, expert, expert_shard, layer_dense, len(stage_layers), layer_expert)
            row.update({k: v / GB for k, v in parts.items()})
        row["workspaces"] = workspaces / GB
        row["total"] = sum(row.values())
        rows.append(row)
    return rows


def config_memory(c: TrainingConfig, hardware: str) -> tuple[dict[str, float], list[str]]:
    """`memory_per_gpu` from the configuration alone, without its operator graph (a search prunes with it before
    building graphs): the fullest stage's row of `stage_memory`, and a warning when it exceeds the GPU's memory."""
    best = max(stage_memory(c, hardware), key=lambda row: row["total"])
    warnings = []
    spec = hardware_spec(hardware)
    if spec is not None and best["total"] > spec.memory_gb:
        warnings.append(
            f"needs about {best['total']:.1f} GB per GPU on its fullest pipeline stage, more than the "
            f"{spec.memory_gb:g} GB of {spec.name}: it will not fit (add recompute, tp/pp or the distributed optimizer)"
        )
    return best, warnings
