"""Sharded data parallelism: which of the data-parallel ranks' parameters, gradients and optimizer state each rank
keeps only a shard of, across how many ranks, and which framework does it.

The settings are a section of TrainingConfig (`TrainingConfig.sharding`, a `ShardingSettings`; None when none is
stated: Megatron's DDP), in Megatron's words where Megatron has them; the Composer and torchtitan readers and the e2e
CSV columns write the same settings:

- `sharded_data_parallel`: who shards — `none` (Megatron's DDP, with or without the distributed optimizer),
  `megatron-fsdp` (Megatron's `--use-megatron-fsdp`), `torch-fsdp2` (`--use-torch-fsdp2`; torchtitan's
  `fully_shard`), `torch-fsdp1` (`FullyShardedDataParallel`: Composer/llm-foundry), `deepspeed` (ZeRO), `torch-ddp`
  (PyTorch's `DistributedDataParallel` as torchtitan runs it, `replicate` over the data-parallel ranks: it shards
  nothing, and reduces each micro-batch's gradients in 100 MB buckets while that backward runs, the loop having no
  `no_sync`).
- `data_parallel_sharding_strategy` (Megatron's `--data-parallel-sharding-strategy`): `no_shard` (ZeRO-0, DDP),
  `optim` (ZeRO-1: optimizer state), `optim_grads` (ZeRO-2: and gradients), `optim_grads_params` (ZeRO-3, FSDP
  FULL_SHARD: and parameters). Derived when not given: `optim_grads_params` for the torch FSDPs, `optim` with
  Megatron's distributed optimizer, else `no_shard` (Megatron-FSDP's own default).
- `num_distributed_optimizer_instances` (Megatron's): HSDP. The data-parallel ranks form this many replicas; each
  shards over dp / instances consecutive ranks (inside a node or NVLink domain when it fits) and the replicas
  all-reduce the sharded gradients.
- `torch_fsdp2_reshard_after_forward` (Megatron's `--torch-fsdp2-no-reshard-after-forward` turns it off): a ZeRO-3
  unit frees its gathered parameters after forward and gathers them again for backward. Off: FSDP1 SHARD_GRAD_OP,
  FSDP2 `reshard_after_forward=False`, DeepSpeed ZeRO-3 with parameters kept (one all-gather per micro-batch).
- `outer_dp_sharding_strategy` (Megatron's): `no_shard`, or `optim` to shard the optimizer state across the HSDP
  replicas as well.

`sharding_of(config)` gives the effective `Sharding`; what a published table's cells say is
`extractors.jobs.sharding_cells`'s reading; what the collectives cost is `predictor.parallel.fsdp`'s.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

from tracekit.core.errors import ConfigError, did_you_mean


class ShardedJob(Protocol):
    """What sharding reads of a configuration (a `TrainingConfig`, which holds this section: typed here by what is
    read, so that this module does not import the configuration that imports it)."""

    use_distributed_optimizer: bool
    sharding: ShardingSettings | None

    @property
    def dp(self) -> int: ...

    @property
    def cp(self) -> int: ...

    @property
    def tp(self) -> int: ...

    @property
    def pp(self) -> int: ...

#: PyTorch DDP's gradient bucket (`bucket_cap_mb` 25, its default; Composer and Megatron-LM's `--DDP-impl torch` pass
#: no other).
TORCH_DDP_BUCKET_BYTES = 25 * 1024 * 1024
IMPLEMENTATIONS = ("none", "megatron-fsdp", "torch-fsdp2", "torch-fsdp1", "deepspeed", "torch-ddp")
#: Megatron's strategy names, in ZeRO-stage order (index = ZeRO stage).
STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
OUTER_STRATEGIES = ("no_shard", "optim")
#: Megatron flags (dest form) read into the settings above; `_apply` of tracekit.core.config hands them here.
FLAGS = ("use_megatron_fsdp", "use_torch_fsdp2", "torch_fsdp2_no_reshard_after_forward")
#: The settings of the section (TrainingConfig.sharding).
FIELDS = ("sharded_data_parallel", "data_parallel_sharding_strategy", "num_distributed_optimizer_instances",
          "torch_fsdp2_reshard_after_forward", "outer_dp_sharding_strategy")
_ALIASES = {"fsdp": "torch-fsdp1", "fsdp1": "torch-fsdp1", "fsdp2": "torch-fsdp2", "torch_fsdp2": "torch-fsdp2",
            "torch_fsdp1": "torch-fsdp1", "megatron_fsdp": "megatron-fsdp", "zero": "deepspeed", "false": "none",
            "torch_ddp": "torch-ddp", "replicate": "torch-ddp",
            "no": "none", "off": "none"}


@dataclass(frozen=True)
class Sharding:
    """The effective sharding of one configuration's data-parallel ranks."""

    implementation: str  # one of IMPLEMENTATIONS
    strategy: str  # one of STRATEGIES
    dp: int  # ranks one set of parameters is spread over: dp·cp
    replicas: int  # HSDP replicas (1: one shard group of all those ranks)
    reshard_after_forward: bool
    outer_optim: bool  # optimizer state also sharded across the replicas

    @property
    def stage(self) -> int:
        """ZeRO stage: 0 nothing sharded, 1 optimizer state, 2 and gradients, 3 and parameters."""
        return STRATEGIES.index(self.strategy)

    @property
    def shard_size(self) -> int:
        """Ranks one shard group spans (dp / replicas)."""
        return self.dp // self.replicas

    @property
    def fsdp(self) -> bool:
        """Sharded by an FSDP/ZeRO implementation rather than Megatron's DDP (with or without its distributed
        optimizer, and PyTorch's DDP, which shards nothing)."""
        return self.implementation not in ("none", "torch-ddp")

    @property
    def per_unit(self) -> bool:
        """Collectives per unit (one transformer block) inside each micro-batch's forward and backward — ZeRO-2/3
        by any framework, the torch FSDPs at any strategy — rather than gradient buckets after the last backward
        (Megatron's DDP and distributed optimizer; ZeRO-0/1 of DeepSpeed and Megatron-FSDP work the same way). PyTorch's
        DDP reduces its buckets as the backward fills them, as a unit's: priced per unit."""
        return self.implementation == "torch-ddp" or (
            self.fsdp and (self.stage >= 2 or self.implementation.startswith("torch-fsdp")))

    def once_per_iteration(self, pp: int) -> bool:
        """PyTorch's pipelining (torchtitan's PP) keeps an FSDP2 stage's parameters gathered across its micro-batches
        and reduces the gradients after the last one: one all-gather and one reduce-scatter per unit and iteration."""
        return self.implementation == "torch-fsdp2" and pp > 1 and self.stage >= 2

    @property
    def params_sharded(self) -> bool:
        return self.stage >= 3

    @property
    def grads_sharded(self) -> bool:
        return self.stage >= 2

    @property
    def parameter_gathers_per_microbatch(self) -> int:
        """All-gathers of each unit's parameters per micro-batch: forward, and again before backward unless the
        unit keeps them after forward."""
        if not self.params_sharded:
            return 0
        return 2 if self.reshard_after_forward else 1

    @property
    def reduce_every_microbatch(self) -> bool:
        """Gradients reduced after every micro-batch's backward (sharded gradients cannot be accumulated whole;
        FSDP1/FSDP2 without no_sync also reduce unsharded ones each time, and torchtitan's DDP), else once per
        iteration."""
        return self.grads_sharded or self.implementation in ("torch-fsdp1", "torch-fsdp2", "torch-ddp")

    @property
    def optimizer_shard(self) -> int:
        """Ranks the optimizer state is spread over."""
        if self.stage < 1:
            return 1
        return self.shard_size * (self.replicas if self.outer_optim else 1)

    @property
    def name(self) -> str:
        """FSDP, HSDP, ZeRO-N or DDP, as people call the split (`HSDP 4×8` = 4 replicas of 8-rank shards)."""
        if not self.fsdp:
            return "distributed optimizer" if self.stage == 1 else "DDP"
        if self.stage == 3 and self.replicas > 1:
            return f"HSDP {self.replicas}×{self.shard_size}"
        if self.implementation == "deepspeed" or self.stage < 3:
            return f"ZeRO-{self.stage}" + (f" ({self.replicas} replicas)" if self.replicas > 1 else "")
        return "FSDP" + ("" if self.reshard_after_forward else " (no reshard after forward)")


def implementation_name(value: Any) -> str:
    """A `sharded_data_parallel` value (or one of its spellings) as one of IMPLEMENTATIONS; ConfigError otherwise."""
    text = str(value).strip().lower().replace("_", "-") if value not in (None, False) else "none"
    if text in ("true", "yes", "1"):
        return "torch-fsdp2"
    text = _ALIASES.get(text.replace("-", "_"), _ALIASES.get(text, text))
    if text not in IMPLEMENTATIONS:
        raise ConfigError(f"sharded_data_parallel must be one of {', '.join(IMPLEMENTATIONS)}, not {value!r}"
                          f"{did_you_mean(str(value), IMPLEMENTATIONS)}")
    return text


def apply_flag(key: str, value: Any, values: dict[str, Any]) -> bool:
    """Read one of Megatron's sharding flags into the settings `values`; False when `key` is not one of FLAGS."""
    if key not in FLAGS:
        return False
    on = value is True or str(value).strip().lower() in ("true", "1", "yes")
    if key == "use_megatron_fsdp" and on:
        values["sharded_data_parallel"] = "megatron-fsdp"
    elif key == "use_torch_fsdp2" and on:
        values["sharded_data_parallel"] = "torch-fsdp2"
    elif key == "torch_fsdp2_no_reshard_after_forward" and on:
        values["torch_fsdp2_reshard_after_forward"] = False
    return True


@dataclass(frozen=True)
class ShardingSettings:
    """The sharding settings a configuration states (TrainingConfig.sharding; None: Megatron's DDP, with or without
    its distributed optimizer)."""

    sharded_data_parallel: str = "none"
    data_parallel_sharding_strategy: str | None = None  # None: the implementation's default (module docstring)
    num_distributed_optimizer_instances: int = 1
    torch_fsdp2_reshard_after_forward: bool = True
    outer_dp_sharding_strategy: str = "no_shard"

    def __post_init__(self) -> None:
        object.__setattr__(self, "sharded_data_parallel", implementation_name(self.sharded_data_parallel))
        if self.data_parallel_sharding_strategy is not None:
            object.__setattr__(self, "data_parallel_sharding_strategy",
                               str(self.data_parallel_sharding_strategy).strip().lower())
        object.__setattr__(self, "outer_dp_sharding_strategy", str(self.outer_dp_sharding_strategy).strip().lower())

    def strategy(self, use_distributed_optimizer: bool) -> str:
        """The effective strategy: stated, or the implementation's default."""
        if self.data_parallel_sharding_strategy is not None:
            return self.data_parallel_sharding_strategy
        if self.sharded_data_parallel in ("torch-fsdp2", "torch-fsdp1"):
            return "optim_grads_params"
        if self.sharded_data_parallel == "torch-ddp":
            return "no_shard"
        return "optim" if use_distributed_optimizer else "no_shard"

    def validate(self, c: ShardedJob) -> None:
        """ConfigError naming the first sharding setting that cannot be used as given."""
        strategy = self.strategy(c.use_distributed_optimizer)
        if strategy not in STRATEGIES:
            raise ConfigError(f"data_parallel_sharding_strategy must be one of {', '.join(STRATEGIES)}, not "
                              f"{strategy!r}{did_you_mean(strategy, STRATEGIES)}")
        if self.outer_dp_sharding_strategy not in OUTER_STRATEGIES:
            raise ConfigError(f"outer_dp_sharding_strategy must be no_shard or optim, not "
                              f"{self.outer_dp_sharding_strategy!r}")
        stage = STRATEGIES.index(strategy)
        if self.sharded_data_parallel == "torch-ddp" and (stage > 0 or c.use_distributed_optimizer):
            raise ConfigError("sharded_data_parallel torch-ddp (PyTorch's DistributedDataParallel) shards nothing: "
                              f"data_parallel_sharding_strategy must be no_shard, not {strategy}, and without "
                              "use_distributed_optimizer")
        if self.sharded_data_parallel == "torch-ddp" and max(c.tp, c.pp, c.cp) > 1:
            raise ConfigError("sharded_data_parallel torch-ddp is torchtitan's DDP (`replicate`), which runs on the "
                              "data-parallel ranks alone and refuses tp, pp or cp > 1 (\"DDP has not supported > 1D "
                              f"parallelism\"), got tp {c.tp}, pp {c.pp}, cp {c.cp}")
        if self.sharded_data_parallel == "none":
            if stage > 1:
                raise ConfigError(f"data_parallel_sharding_strategy {strategy} shards gradients or parameters: it "
                                  "needs a sharded data-parallel implementation (--use-megatron-fsdp, "
                                  "--use-torch-fsdp2, or sharded_data_parallel)")
            if stage == 1 and not c.use_distributed_optimizer:
                raise ConfigError("data_parallel_sharding_strategy optim without FSDP is Megatron's distributed "
                                  "optimizer: set use_distributed_optimizer")
        instances = int(self.num_distributed_optimizer_instances)
        if instances < 1:
            raise ConfigError(f"num_distributed_optimizer_instances must be ≥ 1, got {instances}")
        dpcp = c.dp * c.cp
        if dpcp % instances:
            raise ConfigError(f"data-parallel size {dpcp} (dp·cp) is not divisible by "
                              f"num_distributed_optimizer_instances {instances} (HSDP replicas)")
        if instances > 1 and stage == 0:
            raise ConfigError("num_distributed_optimizer_instances > 1 (replicas of a sharded group) needs sharding: "
                              "a distributed optimizer or an FSDP strategy")
        if self.outer_dp_sharding_strategy == "optim" and instances == 1:
            raise ConfigError("outer_dp_sharding_strategy optim shards across HSDP replicas: it needs "
                              "num_distributed_optimizer_instances > 1")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def sharding_of(c: ShardedJob) -> Sharding:
    """The effective sharding of a (validated) configuration; the shard groups span dp·cp ranks (the context-parallel
    ranks hold the same parameters: FSDP and Megatron's distributed optimizer shard across them too)."""
    s = c.sharding or ShardingSettings()
    return Sharding(s.sharded_data_parallel, s.strategy(c.use_distributed_optimizer), c.dp * c.cp,
                    int(s.num_distributed_optimizer_instances), bool(s.torch_fsdp2_reshard_after_forward),
                    s.outer_dp_sharding_strategy == "optim")
