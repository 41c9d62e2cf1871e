"""How Megatron-core runs the experts' gated activation, by Megatron's argument names (`megatron/core/transformer/
transformer_config.py`, `megatron/core/transformer/moe/experts.py`, `megatron/core/fusions/fused_bias_geglu.py`);
`predictor.layers.moe.grouped_mlp` turns them into time.

- `activation_func_clamp_value` (`--activation-func-clamp-value`, GPT-OSS: 7.0): the gate half of a GLU is clamped
  from above and the linear half to ±value before the activation. Megatron's fused weighted GLU
  (`weighted_bias_quick_geglu_impl`, what `TEGroupedMLP` calls for GPT-OSS's quick-GELU experts) does it outside its
  fused kernel: two clamps and a concatenation of the [tokens, 2·ffn] FC1 output, each a pass over memory, and the
  clamps' gradient masks in backward.
- `use_transformer_engine_op_fuser` (`--use-transformer-engine-op-fuser`; Megatron-Bridge's `cutedsl_fused_grouped_mlp`
  runs the experts through it): the experts run as Transformer Engine's fused operation chain, whose kernels apply the
  biases, clamp and activation themselves, so neither the clamp passes nor `TEGroupedMLP`'s per-expert FC2 bias
  (`predictor.layers.moe.grouped_mlp`) run.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tracekit.core.errors import ConfigError


@dataclass(frozen=True)
class ActivationSettings:
    activation_func_clamp_value: float | None = None  # None: no clamp
    use_transformer_engine_op_fuser: bool = False

    def __post_init__(self) -> None:
        clamp = self.activation_func_clamp_value
        if clamp is not None and not clamp > 0:
            raise ConfigError(f"activation_func_clamp_value must be > 0 (or unset), got {clamp}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIELDS = tuple(f.name for f in dataclasses.fields(ActivationSettings))



def stated(settings: dict[str, Any]) -> bool:
    """Whether a configuration states any of these settings other than off (then the section exists and its values
    are checked: a clamp of 0 is refused, not dropped)."""
    return any(v is not None and v is not False for v in settings.values())
