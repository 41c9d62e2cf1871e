"""The precision recipe a Megatron-Bridge performance run used, as the recipe preset its row's notes name spells it,
and what Bridge's precision configurations set beside the GEMM recipe.

Bridge's performance scripts name a preset by its precision (`QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1`,
`LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_MX_V2`, `perf_matrix[gb200][num_gpus_8][common+fp8_cs]`,
`deepseek_v3_pretrain_256gpu_gb200_fp8mx_config()`), and pick the mixed-precision configuration from it
(`get_precision_config` in `scripts/performance/utils`, `_perf_precision` in the flat performance recipes):
`fp8_cs` → `bf16_with_fp8_current_scaling_mixed`, `fp8_ds` → `bf16_with_fp8_delayed_scaling_mixed`, `fp8_mx` →
`bf16_with_mxfp8_mixed`, `fp8_ss` → `bf16_with_fp8_subchannel_scaling_mixed` (blockwise), `nvfp4` →
`bf16_with_nvfp4_mixed`. Published tables write some of these only as "FP8"; the preset says which scaling ran.

What those configurations set (`src/megatron/bridge/training/mixed_precision.py`, every version read):
- current and delayed scaling gather fp8 parameters (`fp8_param_gather=True`: the distributed optimizer's
  all-gather moves 1-byte weights and the quantised weight replaces the bf16 copy); the performance scripts turn the
  current-scaling preset's bf16 first and last layers off (`first_last_layers_bf16=False`, tracekit's default);
- blockwise scaling does not (`fp8_param_gather=False`, Megatron's default);
- MXFP8 keeps its parameters as MXFP8 tensors (`fp8_param_gather=True`, `reuse_grad_buf_for_mxfp8_param_ag=True`)
  from Megatron-Bridge PR #450 (merged 2025-08-22 for release r0.1.0, NeMo 25.09: the oldest release with performance
  presets, so every row that names one); earlier Bridge code set `fp8_param_gather=False`. Megatron-core then gathers
  the parameters in bf16 into the gradient buffer and quantises them in place (predictor.parallel.data_parallel): the
  quantised tensors replace the bf16 weights in memory, the all-gather still moves 2 bytes a parameter;
- the NVFP4 configuration was not read: it keeps Megatron's default here (a row or launch line that states
  `fp8_param_gather` sets it).

A setting the row states itself (a column other than the generic "fp8", a `name=value` of its notes) wins.
"""
from __future__ import annotations

import re
from typing import Any

from extractors.jobs.bridge.recipes import preset_clause
from tracekit.core.errors import ConfigError
from tracekit.core.precision import recipe_name

#: How a preset's name spells its precision (case-insensitive, `_` or nothing before it) → tracekit's recipe.
_PRESET = re.compile(r"(?:^|[_+\[\s])(fp8_?cs|fp8_?ds|fp8_?mx|fp8_?ss|nvfp4|bf16)(?=$|[_\]\s(])", re.I)
PRESET_RECIPES = {"fp8cs": "fp8-cs", "fp8ds": "fp8", "fp8mx": "mxfp8", "fp8ss": "fp8-block", "nvfp4": "nvfp4",
                  "bf16": "bf16"}
#: Recipe → what Bridge's mixed-precision configuration for it sets beside the GEMM recipe (module docstring).
RECIPE_SETTINGS: dict[str, dict[str, Any]] = {
    "fp8-cs": {"fp8_param_gather": True},
    "fp8": {"fp8_param_gather": True},
    "mxfp8": {"fp8_param_gather": True},
}


def cell_recipe(text: str | None) -> str | None:
    """The precision recipe a `precision` cell names, None when it is empty or not a recipe (the column's own error is
    reported where the column is read)."""
    try:
        return recipe_name(text) if text and text.strip() else None
    except ConfigError:
        return None


def preset_recipe(notes: str) -> str | None:
    """The recipe the notes' `recipe preset NAME` spells, None when the notes name no preset or its name no
    precision."""
    clause = preset_clause(notes)
    if clause is None:
        return None
    found = _PRESET.search(clause[0])
    return PRESET_RECIPES[found.group(1).lower().replace("_", "")] if found else None


def precision_settings(notes: str, precision_cell: str | None, stated: set[str]) -> tuple[dict[str, Any], str | None]:
    """(settings, a note naming them) for a row whose notes name a Bridge recipe preset: its recipe where the
    `precision` column says only "fp8", and what Bridge's configuration for that recipe sets; settings in `stated`
    are left to the row. ({}, None) for a row without a preset or a precision the preset contradicts."""
    preset = preset_recipe(notes)
    if preset is None:
        return {}, None
    column = cell_recipe(precision_cell)
    if column is None and precision_cell and precision_cell.strip():
        return {}, None  # the column's own error is reported where the column is read
    out: dict[str, Any] = {}
    recipe = column or preset
    if column == "fp8" and preset in ("fp8-cs", "fp8-block", "mxfp8"):
        recipe = out["precision"] = preset
    elif column is not None and column != preset:
        return {}, None
    out.update({k: v for k, v in RECIPE_SETTINGS.get(recipe, {}).items() if k not in stated})
    if not out:
        return {}, None
    return out, f"Megatron-Bridge's {recipe} precision preset: {', '.join(f'{k}={v}' for k, v in out.items())}"
