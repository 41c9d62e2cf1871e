"""What Megatron-core does around the model that costs time: CUDA graphs, deterministic mode, the per-iteration
logging passes, timers, gradient-accumulation fusion, gradient clipping. Settings by Megatron's argument names
(the vendored snapshot's `megatron/training/arguments.py`, `megatron/core/transformer/transformer_config.py`,
`megatron/training/determinism.py`); `predictor.schedule.framework_costs` turns them into time.

- CUDA graphs: `cuda_graph_impl` none | local | transformer_engine | full_iteration. `local` and
  `transformer_engine` capture per-layer graphs whose coverage `cuda_graph_modules` names (attn, mlp, moe,
  moe_router, moe_preprocess — with moe_router only —, mamba: a hybrid model's Mamba layers; empty or `full`: the
  whole layer); `full_iteration` captures the whole forward-backward
  (not the optimizer step). The older spellings are read as Megatron migrates them: `--enable-cuda-graph` is
  `local`, `--external-cuda-graph` is `transformer_engine`, `--cuda-graph-scope` is `--cuda-graph-modules` (its
  value `full_iteration` is `--cuda-graph-impl full_iteration`).
- `deterministic_mode`: Megatron sets NCCL_ALGO=Ring (no NVLS or SHARP in-network reduction) unless the launch sets
  another accepted NCCL_ALGO (`nccl_algo`, the launch environment's NCCL_ALGO).
- `nccl_nvls_enable` (the launch environment's NCCL_NVLS_ENABLE): 0 turns NCCL's NVLink SHARP (NVLS) algorithms
  off, the switch's in-network reduction inside the node; SHARP over the network (CollNet) is another setting.
- `log_params_norm`: an L2 norm over every parameter each iteration, all-reduced, read on the host;
  `log_num_zeros_in_grad`: a count of the zeros of every gradient each iteration, all-reduced, read on the host;
  `clip_grad` (Megatron's default 1.0; 0 turns it off): the gradient norm and clipping each iteration.
- `gradient_accumulation_fusion` (Megatron's default on; `--no-gradient-accumulation-fusion`): off, each weight
  gradient goes to a buffer of its own and is then added to the fp32 main gradient, per micro-batch.
- `timing_log_level` (0–2) with `barrier_with_level_1_timing` (Megatron's `barrier_with_L1_time`, default on): level
  ≥ 1 times the optimizer's and gradient sync's phases, each timer a device synchronisation (and a barrier at
  level 1 when asked), level 2 every micro-batch's forward, backward and P2P calls too.
- `calculate_per_token_loss`: the loss summed over tokens and the gradients divided by the global batch's token
  count after their reduction (a broadcast of the count over the pipeline stages, an all-reduce over the data- and
  context-parallel ranks, one pass over every gradient buffer); `ddp_average_in_collective`: the data-parallel
  collective averages (NCCL's AVG) instead of Megatron's DDP scaling each bucket by 1/ranks before it
  (`predictor.parallel.grad_buckets.scaled_elements`). Megatron refuses the two together.
- `check_for_nan_in_loss_and_grad` (Megatron-LM's default on; `--no-check-for-nan-in-loss-and-grad`; off by itself
  under fp16 with a dynamic loss scale, i.e. without `loss_scale`): each micro-batch's loss is checked for NaN and
  Inf on the host (two device synchronisations on the last stage, `pretrain_gpt.py: loss_func`), and each gradient
  bucket's norm before its collective (the bucket read, two synchronisations: `param_and_grad_buffer.py:
  check_grads`); `check_for_large_grads` checks that norm once more, `check_for_spiky_loss` the loss
  (`result_checks`). Megatron allows `cuda_graph_impl full_iteration` only without the NaN/Inf checks: a run with it
  ran without them (a table's row, a log), so they are off there.
- `defer_embedding_wgrad_compute` with `wgrad_deferral_limit` (0: every call): the last pipeline stage's output layer
  keeps each call's input and output gradient and computes its weight gradients after the last backward, in the
  pipeline flush, instead of in each backward (the first `wgrad_deferral_limit` calls; one per micro-batch and MTP
  depth). Megatron refuses it without a pipeline and without gradient-accumulation fusion (`deferred_share`).
- `overlap_p2p_comm_warmup_flush` (`--overlap-p2p-communication-warmup-flush`): the interleaved schedule's P2P
  transfers run beside compute in its warm-up and flush too; without it only the steady state's do, and each warm-up
  forward and flush backward waits for its send (`predictor.schedule.pipeline`). Megatron refuses it without the
  interleaved schedule's P2P overlap.
- `scatter_gather_tensors_in_pipeline` (Megatron-LM 2020–2022's, not the pinned snapshot's: on by default there,
  `--no-scatter-gather-tensors-in-pipeline`; DeepSpeed's pipeline engine partitions the same way by default; the
  `megatron-lm-2021`, `megatron-deepspeed-2023` and `gpt-neox` stack profiles set it): without sequence
  parallelism each tensor-parallel rank sends 1/tp of the activation to the next pipeline stage and the receivers
  all-gather it (`predictor.parallel.pipeline_p2p`).
- `async_tensor_model_parallel_allreduce` (Megatron-LM 2022–2023's, `--no-async-tensor-model-parallel-allreduce`; the
  pinned snapshot always does it, and so does Transformer Engine's linear): a column-parallel linear's backward
  issues its collectives beside its own GEMMs — the input gradient's all-reduce (with sequence parallelism its
  reduce-scatter) beside the weight-gradient GEMM, sequence parallelism's re-gather of the input beside the
  input-gradient GEMM (`predictor.schedule.tp_overlap`). On unless false; the `megatron-lm-2021` (no such code),
  `gpt-neox` (its linears reduce after their backward) and `torchtitan` (eager DTensor reduces after the matmul's
  backward) profiles set it false. Megatron-LM 2022–2023 turned the setting off under sequence parallelism and
  overlapped that path's collectives anyway: a run's record that states it false with sequence parallelism keeps
  the overlap (tracekit.core.legacy_arguments).
- `torch_ddp_reducer` (not a Megatron flag: Megatron-LM 2020–2023's `--DDP-impl torch`, Composer's DDP): the gradients
  are reduced by PyTorch's DistributedDataParallel, whose reducer copies each gradient into its bucket (dividing it by
  the ranks) before the bucket's all-reduce and back after it — two passes over every gradient in the backward that
  reduces, in place of Megatron's DDP scaling its buffers once (`predictor.schedule.framework_costs`).
- `torch_compile` (not a Megatron flag: torchtitan's `[compile] enable`, Composer's `compile_config`): each
  transformer block compiled by TorchInductor, its memory-bound ops run as fused kernels
  (`predictor.layers.compile_fusion`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tracekit.core.errors import ConfigError, did_you_mean
from tracekit.core.megatron_arguments import list_words
from tracekit.core.pipeline_layout import torch_schedule

IMPLS = ("none", "local", "transformer_engine", "full_iteration")
MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
#: NCCL_ALGO tokens that keep in-network reduction (NVLS on NVSwitch, CollNet = SHARP) available.
_IN_NETWORK = ("nvls", "collnet", "collnetdirect", "collnetchain")


@dataclass(frozen=True)
class RuntimeSettings:
    cuda_graph_impl: str | None = None
    cuda_graph_modules: tuple[str, ...] | None = None
    cuda_graph_scope: tuple[str, ...] | None = None  # deprecated spelling of cuda_graph_modules
    enable_cuda_graph: bool | None = None  # deprecated: cuda_graph_impl local
    external_cuda_graph: bool | None = None  # deprecated: cuda_graph_impl transformer_engine
    deterministic_mode: bool | None = None
    nccl_algo: str | None = None  # the launch environment's NCCL_ALGO
    nccl_nvls_enable: str | None = None  # the launch environment's NCCL_NVLS_ENABLE
    log_params_norm: bool | None = None
    log_num_zeros_in_grad: bool | None = None
    gradient_accumulation_fusion: bool | None = None
    timing_log_level: int | None = None
    barrier_with_level_1_timing: bool | None = None
    clip_grad: float | None = None
    calculate_per_token_loss: bool | None = None
    ddp_average_in_collective: bool | None = None
    check_for_nan_in_loss_and_grad: bool | None = None
    check_for_large_grads: bool | None = None
    check_for_spiky_loss: bool | None = None
    scatter_gather_tensors_in_pipeline: bool | None = None  # Megatron-LM 2020–2022 (module docstring)
    defer_embedding_wgrad_compute: bool | None = None
    overlap_p2p_comm_warmup_flush: bool | None = None
    wgrad_deferral_limit: int | None = None
    torch_ddp_reducer: bool | None = None  # PyTorch's DDP reduces the gradients (module docstring)
    async_tensor_model_parallel_allreduce: bool | None = None  # the linears' backward overlap (module docstring)
    torch_compile: bool | None = None

    def __post_init__(self) -> None:
        for name in ("cuda_graph_modules", "cuda_graph_scope"):
            object.__setattr__(self, name, list_words(getattr(self, name)))
        impl = self.cuda_graph_impl
        if impl is not None:
            impl = str(impl).strip().lower()
            if impl not in IMPLS:
                raise ConfigError(f"cuda_graph_impl must be one of {', '.join(IMPLS)}, not {impl!r}"
                                  f"{did_you_mean(impl, IMPLS)}")
            object.__setattr__(self, "cuda_graph_impl", impl)
        unknown = [m for m in self._stated_modules() if m not in MODULES + ("full", "full_iteration")]
        if unknown:
            raise ConfigError(f"cuda_graph_modules: unknown module {unknown[0]!r}{did_you_mean(unknown[0], MODULES)} "
                              f"(Megatron's are {', '.join(MODULES)}, or none for the whole layer)")
        if self.timing_log_level is not None and self.timing_log_level not in (0, 1, 2):
            raise ConfigError(f"timing_log_level must be 0, 1 or 2, not {self.timing_log_level}")
        if self.clip_grad is not None and self.clip_grad < 0:
            raise ConfigError(f"clip_grad must be ≥ 0, not {self.clip_grad}")
        if self.wgrad_deferral_limit is not None and self.wgrad_deferral_limit < 0:
            raise ConfigError("Wgrad deferral limit should be greater than or equal to 0 when it is enabled! "
                              f"(wgrad_deferral_limit {self.wgrad_deferral_limit})")

    def _stated_modules(self) -> tuple[str, ...]:
        return (self.cuda_graph_modules or ()) + (self.cuda_graph_scope or ())

    # -- as Megatron resolves them ------------------------------------------------------------------------------
    @property
    def graph_impl(self) -> str:
        """The CUDA graph implementation Megatron runs (the deprecated flags and scope migrated)."""
        if self.enable_cuda_graph:
            return "local"
        if self.external_cuda_graph:
            return "transformer_engine"
        if "full_iteration" in (self.cuda_graph_scope or ()) + (self.cuda_graph_modules or ()):
            return "full_iteration"
        return self.cuda_graph_impl or "none"

    @property
    def graph_modules(self) -> frozenset[str]:
        """The modules a per-layer graph captures; empty: the whole layer."""
        return frozenset(m for m in self._stated_modules() if m not in ("full", "full_iteration"))

    @property
    def accumulation_fused(self) -> bool:
        return self.gradient_accumulation_fusion is not False

    @property
    def clip(self) -> float:
        return 1.0 if self.clip_grad is None else float(self.clip_grad)

    @property
    def per_token_loss(self) -> bool:
        return bool(self.calculate_per_token_loss)

    @property
    def average_in_collective(self) -> bool:
        return bool(self.ddp_average_in_collective)

    @property
    def tp_backward_overlap(self) -> bool:
        """Whether a column-parallel linear's backward collectives run beside its GEMMs (module docstring)."""
        return self.async_tensor_model_parallel_allreduce is not False

    @property
    def compiled(self) -> bool:
        return bool(self.torch_compile)

    @property
    def timing_level(self) -> int:
        return int(self.timing_log_level or 0)

    @property
    def level_1_barriers(self) -> bool:
        return self.barrier_with_level_1_timing is not False

    @property
    def in_network_reduction(self) -> bool:
        """Whether NCCL may use NVLS / SHARP reduction: not under deterministic mode (NCCL_ALGO=Ring unless the
        launch names another algorithm), nor when NCCL_ALGO names algorithms without them."""
        if self.nccl_algo:
            tokens = [t.strip().lower() for t in str(self.nccl_algo).split(",") if t.strip()]
            if any(t.startswith("^") for t in tokens):  # an exclusion list: the rest stays available
                return not any(t.lstrip("^") == "nvls" for t in tokens)
            return any(t in _IN_NETWORK for t in tokens)
        return not self.deterministic_mode

    @property
    def nvls_off(self) -> bool:
        """Whether the launch turned NCCL's NVLS algorithms off (NCCL_NVLS_ENABLE=0)."""
        return self.nccl_nvls_enable is not None and str(self.nccl_nvls_enable).strip() == "0"

    def validate(self, config) -> None:
        """ConfigError naming the first way Megatron would refuse these settings with `config` (a TrainingConfig)."""
        if (self.enable_cuda_graph or self.external_cuda_graph) and self.cuda_graph_impl not in (None, "none"):
            raise ConfigError("Megatron refuses --enable-cuda-graph or --external-cuda-graph with --cuda-graph-impl")
        if self.enable_cuda_graph and self.external_cuda_graph:
            raise ConfigError("Megatron refuses --enable-cuda-graph together with --external-cuda-graph")
        if self.per_token_loss and self.average_in_collective:  # distributed_data_parallel.py asserts it
            raise ConfigError("Megatron refuses --ddp-average-in-collective with --calculate-per-token-loss (the "
                              "gradients are divided by the token count after the reduction, not averaged in it)")
        modules = self.graph_modules
        if "moe" in modules and "moe_router" in modules:
            raise ConfigError("cuda_graph_modules must not contain both moe and moe_router.")
        if self.graph_impl == "transformer_engine" and "moe_preprocess" in modules and "moe_router" not in modules:
            raise ConfigError("moe_preprocess cuda graph is only supported with moe_router cuda graph.")
        if self.defer_embedding_wgrad_compute and config.pp == 1:  # model_parallel_config.py's checks
            raise ConfigError("Cannot defer embedding wgrad compute when pipeline model parallel is not used")
        if self.defer_embedding_wgrad_compute and not self.accumulation_fused:
            raise ConfigError("Cannot defer embedding wgrad compute when gradient accumulation fusion is not used")
        schedule = torch_schedule(config)
        if self.defer_embedding_wgrad_compute and schedule:
            raise ConfigError(f"defer_embedding_wgrad_compute is Megatron's schedules' (their pipeline flush): "
                              f"PyTorch's {schedule} has none")
        if self.overlap_p2p_comm_warmup_flush and not (config.overlap_p2p_comm and config.vp > 1):
            raise ConfigError("Pipeline parallel communication overlapping in warmup and flush is only compatible "
                              "with overlap_p2p_comm but not batch_p2p_comm (the interleaved schedule with P2P "
                              "overlap)")
        if self.graph_impl == "full_iteration" and self.graph_modules:
            raise ConfigError("Megatron refuses --cuda-graph-modules with --cuda-graph-impl full_iteration (it "
                              f"captures the whole iteration), got {', '.join(sorted(self.graph_modules))}")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for name in ("cuda_graph_modules", "cuda_graph_scope"):
            if data[name] is not None:
                data[name] = list(data[name])
        return data


FIELDS = tuple(f.name for f in dataclasses.fields(RuntimeSettings))
#: Megatron's argparse destination for a flag whose dest differs from its name.
ALIASES = {"barrier_with_l1_time": "barrier_with_level_1_timing",
           "overlap_p2p_communication_warmup_flush": "overlap_p2p_comm_warmup_flush"}


def stated(settings: dict[str, Any]) -> bool:
    """Whether a configuration states any of these settings (then the section exists; `False` is a statement too:
    `--no-gradient-accumulation-fusion`)."""
    return any(v is not None for v in settings.values())


@dataclass(frozen=True)
class ResultChecks:
    """What Megatron-LM's result checks cost (module docstring): host synchronisations per micro-batch on the stage
    with the loss, host synchronisations per gradient bucket, and whether each bucket's norm is computed (a read of
    the bucket); `nan`: whether the NaN/Inf checks run (`check_for_nan_in_loss_and_grad` as Megatron resolves it)."""

    loss_syncs: int = 0
    bucket_syncs: int = 0
    bucket_norm: bool = False
    nan: bool = False


def result_checks(config) -> ResultChecks:
    """The checks a configuration (a TrainingConfig) runs: NaN and Inf of the loss and of each bucket's gradient norm
    unless turned off — or off by Megatron under fp16 with a dynamic loss scale — plus the large-gradient and
    spiky-loss checks where asked."""
    run = config.run or RuntimeSettings()
    nan = run.check_for_nan_in_loss_and_grad is not False
    if config.precision == "fp16" and not config.extra.get("loss_scale"):
        nan = False  # validate_args: the dynamic loss scaler reads NaNs as its signal
    if run.graph_impl == "full_iteration":
        nan = False  # validate_args asserts them off: a run that captured the iteration ran without them
    large, spiky = bool(run.check_for_large_grads), bool(run.check_for_spiky_loss)
    return ResultChecks(2 * nan + spiky, 2 * nan + large, nan or large, nan)


def deferred_share(config) -> float:
    """The share of an iteration's output-layer calls (a TrainingConfig's: one per micro-batch and model output, the
    MTP depths' included) that leave their weight gradient to the pipeline flush under
    `defer_embedding_wgrad_compute`: all of them with `wgrad_deferral_limit` 0, else the first that many; 0 without
    the setting. The schedule takes it as the same share of every micro-batch's (the deferred calls are the first
    ones: an average over the iteration)."""
    run = config.run or RuntimeSettings()
    if not run.defer_embedding_wgrad_compute:
        return 0.0
    calls = output_layer_calls(config)
    limit = int(run.wgrad_deferral_limit or 0)
    return 1.0 if limit == 0 else min(limit, calls) / calls


def output_layer_calls(config) -> int:
    """The output layer's calls in an iteration of a TrainingConfig: one per micro-batch and model output (the main
    one and each MTP depth's)."""
    mtp = (config.layout.mtp_num_layers or 0) if config.layout else 0
    return config.num_microbatches * (1 + mtp)
