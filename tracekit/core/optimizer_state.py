"""Adam's state as Megatron keeps it: what each parameter costs the optimizer in memory and what its step moves, with
Transformer Engine's precision-aware FusedAdam (`--use-precision-aware-optimizer`) and its dtypes
(`--main-grads-dtype`, `--main-params-dtype`, `--exp-avg-dtype`, `--exp-avg-sq-dtype`), read from the pinned
Megatron-LM (`megatron/core/optimizer/optimizer_config.py`, `distrib_optimizer.py`, `training/arguments.py`).

- **Default** (mixed precision): fp32 main parameters and fp32 moments, 12 bytes a parameter (8 in fp32 training,
  whose parameters are their own main copy); the gradients the optimizer reads are fp32 main gradients.
- **Precision-aware**: the moments in their dtypes (fp8: one byte); the main parameters fp16 (2 bytes), or, in bf16
  training with fp32 main parameters, the 16 bits an fp32 value has beyond its bf16 parameter
  (`store_param_remainders`, Megatron's default with Transformer Engine ≥ 2.1: 2 bytes). Unless the recipe is an fp8
  one other than delayed scaling with fp32 main parameters, the optimizer reads the gradient buffer itself
  (`decoupled_grad`): no fp32 copy of 16-bit gradients. `--main-grads-dtype bf16` keeps and reduces the gradients in
  bf16 (Megatron then turns `accumulate_allreduce_grads_in_fp32` off).
- **The step** reads the gradient and reads and writes the main parameter and both moments: 28 bytes a parameter by
  default (`FUSED_ADAM_BYTES`); `step_bytes` counts them in the configured dtypes, and the optimizer's model is asked
  at the parameter count that moves as much (predictor.parallel.data_parallel).

Megatron's refusals, in its words: a dtype other than fp32 without the precision-aware optimizer; the precision-aware
optimizer with another optimizer than Adam, without the distributed optimizer, or without Transformer Engine;
bf16 main gradients with fp32 gradient accumulation asked for.
"""
from __future__ import annotations

from dataclasses import dataclass

from tracekit.core.errors import ConfigError

#: Megatron arguments read here (kept in `extra`).
SETTINGS = ("use_precision_aware_optimizer", "main_grads_dtype", "main_params_dtype", "exp_avg_dtype",
            "exp_avg_sq_dtype")
DTYPES = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
#: A fused Adam step's bytes per parameter in fp32: the gradient read, the main parameter and both moments read and
#: written.
FUSED_ADAM_BYTES = 28.0


@dataclass(frozen=True)
class AdamState:
    """Bytes per parameter of the optimizer's state (`master`: its main parameter, 0 where the parameter is its own
    main copy), the gradient it reads, and whether it reads the gradient buffer itself (no fp32 copy of it)."""

    master: float
    exp_avg: float
    exp_avg_sq: float
    grad: float
    decoupled_grads: bool

    @property
    def state_bytes(self) -> float:
        return self.master + self.exp_avg + self.exp_avg_sq


def _dtype(c, name: str) -> str:
    return str(c.extra.get(name) or "fp32")


def precision_aware(c) -> bool:
    return bool(c.extra.get("use_precision_aware_optimizer"))


def adam_state(c) -> AdamState:
    """The optimizer state of configuration `c` (a TrainingConfig; module docstring)."""
    fp32, bf16 = c.precision == "fp32", c.precision not in ("fp32", "fp16")  # fp8/fp4 recipes train on bf16
    if not precision_aware(c):
        return AdamState(0.0 if fp32 else 4.0, 4.0, 4.0, 4.0, False)
    main = _dtype(c, "main_params_dtype")
    recipe = c.recipe.name if c.recipe.low_precision else None
    decoupled = main != "fp32" or recipe in (None, "fp8")  # fp8: delayed scaling (tracekit.core.precision)
    if fp32:
        master = 0.0
    elif main == "fp32" and decoupled and bf16:
        master = 2.0  # the remainders beside the bf16 parameters
    else:
        master = float(BYTES[main])
    return AdamState(master, float(BYTES[_dtype(c, "exp_avg_dtype")]), float(BYTES[_dtype(c, "exp_avg_sq_dtype")]),
                     float(c.grad_bytes) if decoupled else 4.0, decoupled)


def step_bytes(c) -> float:
    """Bytes a fused Adam step moves per parameter (module docstring): FUSED_ADAM_BYTES by default. Remainders are
    read and written with their bf16 parameters (4 bytes, as an fp32 main parameter); fp16 main parameters move 2."""
    s = adam_state(c)
    master = 2.0 if precision_aware(c) and _dtype(c, "main_params_dtype") == "fp16" else 4.0
    return s.grad + 2.0 * (master + s.exp_avg + s.exp_avg_sq)


def check(c) -> None:
    """ConfigError where Megatron refuses these settings with configuration `c`."""
    if not precision_aware(c):
        for name in DTYPES:
            if _dtype(c, name) != "fp32":
                raise ConfigError(f"{name} can only be fp32 when not using precision-aware optimizer "
                                  "(--use-precision-aware-optimizer; Megatron stops on it)")
        return
    optimizer = str(c.extra.get("optimizer") or "adam")
    if optimizer != "adam":
        raise ConfigError(f"--use-precision-aware-optimizer only supported with adam, not {optimizer} (Megatron "
                          "stops on it)")
    if not c.use_distributed_optimizer and (c.sharding is None or c.sharding.sharded_data_parallel == "none"):
        raise ConfigError("--use-precision-aware-optimizer only supported with distributed optimizer "
                          "(--use-distributed-optimizer; Megatron stops on it)")
    if c.extra.get("te_available") is False:
        raise ConfigError("--use-precision-aware-optimizer requires FusedAdam from TransformerEngine "
                          "(te_available is false)")
    if _dtype(c, "main_grads_dtype") == "bf16" and c.accumulate_allreduce_grads_in_fp32:
        raise ConfigError("--main-grads-dtype can only be fp32 when --accumulate-allreduce-grads-in-fp32 is set")
