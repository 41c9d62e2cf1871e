"""Megatron-core's own costs around the operator graph (settings: `tracekit.core.runtime`), as
`predictor.schedule.stage_work` adds them to the schedule's work:

- **CUDA graphs** take the host out of what they capture: a captured op costs no host time per op (`host_op_us`,
  `op_overhead_us` of the calibration), a captured region costs one graph launch instead (a host op's time: one
  Python call and one `cudaGraphLaunch`). Per-layer graphs (`local`, `transformer_engine`) capture, per decoder layer
  and pass, the modules `cuda_graph_modules` names — attn: the input norm and self-attention with its residual; mlp
  (dense layers) and moe (MoE layers): the pre-MLP norm and the MLP or MoE block; moe_router: the pre-MLP norm,
  the router and shared experts not overlapped with the dispatch, extended by moe_preprocess to the latent projection
  and the dispatcher's permute (MoELayer.preprocess); mamba: a Mamba layer (its ops `mixer.*` and residual) — or the
  whole layer. `full_iteration` captures every forward and backward of the iteration, so the per-micro-batch host
  time goes too (`microbatch_overhead_us`); the optimizer step and the per-iteration host time stay.
- **Per-parameter passes**, each a Python step and a kernel (or three) per parameter tensor — host time
  `tensor_op_us` of the calibration per tensor visited — and bytes moved at the GPU's memory bandwidth: without
  gradient-accumulation fusion, per micro-batch and weight, the weight gradient is added into the fp32 main gradient
  (reads the gradient and the main gradient, writes the main gradient); `log_num_zeros_in_grad` counts the zeros of
  every gradient the optimizer holds (sharded with the distributed optimizer), `log_params_norm` loops over every
  parameter and reads the optimizer's copy of its data; each ends in all-reduces of a scalar and a read on the host.
  Without apex's or Transformer Engine's multi-tensor kernels, the gradient norm reads each tensor's norm on the host
  and the parameter copy is two kernels a tensor (`predictor.layers.local_kernels.optimizer_loops`). Megatron's DDP
  (not the FSDPs, which reduce per unit) scales its gradient buffers in place once per iteration
  (`predictor.parallel.grad_buckets.scaled_elements`: read and written), PyTorch's DDP (`torch_ddp_reducer`) copies
  every gradient into its bucket, divided, and back (two such passes); with `calculate_per_token_loss` the token
  count is broadcast over the pipeline stages and all-reduced over the data- and context-parallel ranks first; with
  Megatron-LM's result checks (`tracekit.core.runtime.result_checks`) each bucket's norm is read before its collective
  and checked on the host, the device idle for each synchronisation's return and the next issue (`SYNC_US` +
  `host_op_us`). A pass takes the longer of its host and device time.
- **Timers** (`timing_log_level` ≥ 1): each timer start and stop synchronises the device (`SYNC_US`); at level 1 the
  optimizer's and gradient sync's phases (`LEVEL_1_TIMERS`, `LEVEL_1_BARRIERS` of them behind a barrier over all
  ranks unless `--no-barrier-with-level-1-timing`), at level 2 also each micro-batch's forward and backward call
  and, with a pipeline, its P2P calls.

Deterministic mode's NCCL_ALGO=Ring (no in-network reduction) is applied to the cluster (`cluster_for`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from predictor.architecture.tensors import chunk_tensors
from predictor.costs.physics.collectives import BASE_US
from predictor.costs.physics.roofline import MEMORY_EFFICIENCY, rates
from predictor.ir.graph import Graph
from predictor.ir.ops import OpUse
from predictor.layers.decoder import blocks_named
from predictor.layers.local_kernels import optimizer_loops
from predictor.parallel import grad_buckets, muon
from tracekit.core.cluster import Cluster
from tracekit.core.config import TrainingConfig
from tracekit.core.hardware import hardware_spec
from tracekit.core.runtime import RuntimeSettings, result_checks
from tracekit.core.sharding import sharding_of

#: One device synchronisation seen from the host (cudaDeviceSynchronize of an idle stream and the Python around it).
SYNC_US = 10.0
#: Latency of one step of a scalar collective inside an NVLink domain and across the network (the cluster presets'
#: defaults, `tracekit.core.cluster.Cluster`).
STEP_US = {"intra": 2.0, "inter": 8.0}
#: Level-1 timers per iteration (forward-backward, all-grads-sync, the optimizer and its copy, clip, count-zeros,
#: inner-step, copy-back phases, embedding and non-TP gradient all-reduces, parameter all-gather) and those whose
#: start waits on a barrier (forward-backward, all-grads-sync, optimizer, parameter all-gather).
LEVEL_1_TIMERS = 11
LEVEL_1_BARRIERS = 4
#: Tensors a multi-tensor-apply kernel takes per launch (apex / Transformer Engine's chunking).
MULTI_TENSOR_CHUNK = 110
#: Scalar all-reduces of the parameter norm (sharded, expert and model-parallel groups) and of the zero count.
NORM_ALLREDUCES = 7
ZEROS_ALLREDUCES = 1
#: The optimizer's own per-parameter loops every iteration (Megatron's mixed-precision optimizers: copy the model
#: gradients to the main gradients, copy the main parameters back, zero the gradients), over the tensors it holds.
OPTIMIZER_LOOPS = 3


def runtime(config: TrainingConfig) -> RuntimeSettings:
    return config.run or RuntimeSettings()


def cluster_for(config: TrainingConfig, cluster: Cluster) -> Cluster:
    """The cluster as NCCL sees it under the run's settings: without in-network reduction (NVLS, SHARP) where
    deterministic mode or NCCL_ALGO rules it out; without NVLS (SHARP over the network kept) under
    NCCL_NVLS_ENABLE=0."""
    run = runtime(config)
    if cluster.in_network_reduction == "none":
        return cluster
    if not run.in_network_reduction:
        return dataclasses.replace(cluster, in_network_reduction="none")
    if run.nvls_off and "nvls" in cluster.in_network_reduction:
        kept = "sharp" if "sharp" in cluster.in_network_reduction else "none"
        return dataclasses.replace(cluster, in_network_reduction=kept)
    return cluster


# -- CUDA graphs ------------------------------------------------------------------------------------------------
_ATTN = ("input_layernorm", "self_attention.")
_MLP = ("pre_mlp_layernorm", "mlp.")
_ROUTER = ("pre_mlp_layernorm", "mlp.router")
_PREPROCESS = ("mlp.fc1_latent_proj", "mlp.token_dispatcher.permute")
_MAMBA = ("mixer.", "mamba_bda")


@dataclass(frozen=True)
class Capture:
    """What CUDA graphs capture: `full` (the whole forward-backward), or per decoder layer the op-name prefixes of
    each captured region (`regions`: one tuple of prefixes per region; `whole_layer`: every op of the layer is one
    region)."""

    full: bool = False
    whole_layer: bool = False
    regions: tuple[tuple[str, ...], ...] = ()
    moe_only: tuple[bool, ...] = ()  # per region: only in MoE layers (moe) / only in dense layers (mlp: False)
    dense_only: tuple[bool, ...] = ()

    @property
    def any(self) -> bool:
        return self.full or self.whole_layer or bool(self.regions)

    def region(self, op: OpUse) -> int | None:
        """Index of the captured region a per-layer op belongs to (0 for the whole layer), or None."""
        if not op.per_layer:
            return None
        if self.whole_layer:
            return 0
        moe_layer = any(block.name == "moe" for block in blocks_named(op.block))
        for i, prefixes in enumerate(self.regions):
            if (self.moe_only[i] and not moe_layer) or (self.dense_only[i] and moe_layer):
                continue
            if op.name.startswith(prefixes):
                return i
        return None


def capture(config: TrainingConfig) -> Capture:
    """The CUDA-graph capture of a configuration (module docstring)."""
    run = runtime(config)
    impl = run.graph_impl
    if impl == "none":
        return Capture()
    if impl == "full_iteration":
        return Capture(full=True)
    modules = run.graph_modules
    if not modules:
        return Capture(whole_layer=True)
    regions: list[tuple[str, ...]] = []
    moe_only: list[bool] = []
    dense_only: list[bool] = []
    moe = config.moe
    shared_overlapped = bool(moe and moe.moe_shared_expert_overlap)
    if "attn" in modules:
        regions.append(_ATTN)
        moe_only.append(False)
        dense_only.append(False)
    if "mlp" in modules:
        regions.append(_MLP)
        moe_only.append(False)
        dense_only.append(True)
    if "moe" in modules:
        regions.append(_MLP)
        moe_only.append(True)
        dense_only.append(False)
    elif "moe_router" in modules:
        regions.append(_ROUTER + (() if shared_overlapped else ("mlp.shared_experts",))
                       + (_PREPROCESS if "moe_preprocess" in modules else ()))
        moe_only.append(True)
        dense_only.append(False)
    if "mamba" in modules:
        regions.append(_MAMBA)
        moe_only.append(False)
        dense_only.append(False)
    return Capture(regions=tuple(regions), moe_only=tuple(moe_only), dense_only=tuple(dense_only))


# -- per-parameter passes and timers ------------------------------------------------------------------------------
@dataclass
class PassCosts:
    """Per stage: host steps (× `tensor_op_us`) and device µs of the per-iteration passes, their fixed µs
    (collectives, synchronisations); per stage and chunk, the same of one micro-batch's backward."""

    iteration_steps: list[float] = field(default_factory=list)
    iteration_device_us: list[float] = field(default_factory=list)
    iteration_fixed_us: list[float] = field(default_factory=list)
    iteration_syncs: list[float] = field(default_factory=list)  # host synchronisations (the buckets' checks)
    backward_steps: list[list[float]] = field(default_factory=list)
    backward_device_us: list[list[float]] = field(default_factory=list)
    call_fixed_us: float = 0.0  # per forward or backward call (level-2 timers)

    def iteration_us(self, stage: int, tensor_op_us: float, host_op_us: float) -> float:
        return max(self.iteration_steps[stage] * tensor_op_us, self.iteration_device_us[stage]) \
            + self.iteration_fixed_us[stage] + self.iteration_syncs[stage] * (SYNC_US + host_op_us)

    def backward_us(self, stage: int, chunk: int, tensor_op_us: float) -> tuple[float, float]:
        """(device µs, host µs beyond it) of one micro-batch's backward passes on a chunk."""
        device = self.backward_device_us[stage][chunk]
        return device, max(0.0, self.backward_steps[stage][chunk] * tensor_op_us - device)


def _scalar_allreduce_us(graph: Graph, group: str) -> float:
    place = graph.groups.get(group)
    n = place.size if place is not None else 1
    if n <= 1:
        return 0.0
    step = STEP_US["inter"] if place is not None and place.nodes > 1 else STEP_US["intra"]
    return BASE_US + 2 * (n - 1) * step


def _bandwidth(hardware: str) -> float:
    """Achievable memory bandwidth (bytes/µs) of a hardware id; 0 when unknown."""
    r = rates(hardware)
    if r is None:
        spec = hardware_spec(hardware)
        return spec.mem_bw_gbs * 1e3 * MEMORY_EFFICIENCY if spec else 0.0
    return r.mem_bw / 1e6 * MEMORY_EFFICIENCY


def pass_costs(graph: Graph) -> PassCosts:
    """What the run's per-parameter passes and timers cost on each stage (module docstring)."""
    c = graph.config
    run = runtime(c)
    bw = _bandwidth(graph.hardware)

    def moved(nbytes: float) -> float:
        return nbytes / bw if bw > 0 else 0.0

    shard = graph.groups["dpcp"].size if c.use_distributed_optimizer else 1
    main = 4  # the optimizer's fp32 main gradients and parameters (fp16 and bf16 mixed precision)
    ddp = not sharding_of(c).per_unit  # Megatron's DDP buffers (ZeRO-0/1 of DeepSpeed, Megatron-FSDP alike)
    checks = result_checks(c)
    out = PassCosts()
    for stage in range(c.pp):
        per_chunk = [chunk_tensors(c, stage, k) for k in range(c.vp)]
        tensors = sum(t.tensors for t in per_chunk)
        elements = sum(t.elements for t in per_chunk)
        steps, device, fixed = float(OPTIMIZER_LOOPS * math.ceil(tensors / shard)), 0.0, 0.0
        steps += muon.host_steps(c, stage)  # Muon's Newton-Schulz calls (predictor.parallel.muon)
        loops, reads = optimizer_loops(c, math.ceil(tensors / shard))  # no multi-tensor kernels (local_kernels)
        steps += loops
        fixed += reads * SYNC_US
        syncs = 0.0
        if ddp:
            buckets = graph.buckets[stage]
            if run.torch_ddp_reducer:  # PyTorch's reducer: into the bucket (divided) and back, every gradient
                reduced = sum(sum(d) + sum(e) for d, e in buckets) if graph.groups["dpcp"].size > 1 else 0
                device += moved(4 * reduced * c.grad_bytes)
            else:
                scaled = grad_buckets.scaled_elements(c, buckets, graph.groups["dpcp"].size, graph.groups["edp"].size)
                device += moved(2 * scaled * c.grad_bytes)
            if checks.bucket_norm:  # each bucket's norm read, its checks on the host (runtime.result_checks)
                device += moved(elements * c.grad_bytes)
                syncs += checks.bucket_syncs * sum(len(d) + len(e) for d, e in buckets)
            if run.per_token_loss:  # the token count from the last stage, then summed over the data-parallel ranks
                fixed += _scalar_allreduce_us(graph, "pp") + _scalar_allreduce_us(graph, "dpcp")
        if run.log_num_zeros_in_grad:  # count_nonzero, subtract, add per gradient the optimizer holds
            held = math.ceil(tensors / shard)
            steps += held
            device += moved(elements / shard * main)
            fixed += ZEROS_ALLREDUCES * _scalar_allreduce_us(graph, "dpcp") + SYNC_US
        if run.log_params_norm:  # a Python step per parameter, multi-tensor L2 norms over the optimizer's data
            steps += tensors
            data = main if c.use_distributed_optimizer or c.precision == "fp32" else c.dtype_bytes
            device += moved(elements / shard * data)
            fixed += NORM_ALLREDUCES * max(_scalar_allreduce_us(graph, "dpcp"), _scalar_allreduce_us(graph, "tp")) \
                + math.ceil(tensors / MULTI_TENSOR_CHUNK) * SYNC_US + SYNC_US
        if run.timing_level >= 1:
            fixed += 2 * LEVEL_1_TIMERS * SYNC_US
            if run.level_1_barriers:
                fixed += LEVEL_1_BARRIERS * (_scalar_allreduce_us(graph, "dpcp") + SYNC_US)
        out.iteration_steps.append(steps)
        out.iteration_device_us.append(device)
        out.iteration_fixed_us.append(fixed)
        out.iteration_syncs.append(syncs)
        # DDP's gradient hook runs once per parameter and micro-batch; without fusion it launches main_grad += grad
        # per weight: read the gradient and the main gradient, write the main gradient
        fused = run.accumulation_fused
        per_element = c.dtype_bytes + 2 * c.grad_bytes
        out.backward_steps.append([float(t.tensors + (0 if fused else t.linear_weights)) for t in per_chunk])
        out.backward_device_us.append([0.0 if fused else moved(t.linear_elements * per_element) for t in per_chunk])
    if run.timing_level >= 2:  # forward/backward-compute timers, and with a pipeline the P2P timers of each call
        out.call_fixed_us = 2 * SYNC_US * (2 if c.pp > 1 else 1)
    return out
