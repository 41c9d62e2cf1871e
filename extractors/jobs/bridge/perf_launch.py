"""What Megatron-Bridge's performance launchers set on top of a model recipe, for a published row whose notes name
the launcher its preset comes from (`recipe preset ... in scripts/performance/configs/...`, `... in
src/megatron/bridge/perf_recipes/...`): settings the table's columns do not state and Megatron-core's defaults (the
megatron-bridge stack profile's) get wrong for these runs.

Read in Megatron-Bridge, every version the corpus rows name:

- the flat performance recipes (`src/megatron/bridge/perf_recipes/`, NeMo 26.08 on): each preset calls
  `_benchmark_common` (`perf_recipes/_common.py`), which sets `model.apply_rope_fusion = True`,
  `model.cross_entropy_fusion_impl = "te"` and `grad_reduce_in_fp32 = False` on both the mixed-precision and the
  DDP configuration; `_perf_precision`, which builds each preset's mixed-precision configuration, sets
  `grad_reduce_in_fp32 = False` again (Kimi K2's presets turn it back on after; no corpus row is Kimi K2);
- the performance scripts (`scripts/performance/`, NeMo 25.09 to 26.06): the YAML configurations of 25.09
  (`configs/<family>/*_llm_pretrain.yaml`) set `model.cross_entropy_fusion_impl: "te"` and
  `mixed_precision.grad_reduce_in_fp32: false`, and `run_script.py` sets `apply_rope_fusion = True` after them; the
  Python configurations after it set `grad_reduce_in_fp32 = False` in each family's common settings
  (`set_llama3_common_configs`, `set_deepseek_v3_common_configs`, `set_qwen3_common_configs`,
  `set_gpt_oss_common_configs`), and `_set_common_perf_overrides` (`utils/overrides.py`) sets
  `apply_rope_fusion = True` and `cross_entropy_fusion_impl = "te"` on every workload.

Bridge's mixed-precision configuration hands its `grad_reduce_in_fp32` to the DDP configuration: gradients are kept and
reduced in bf16 (tracekit's `accumulate_allreduce_grads_in_fp32` False: half the gradient buffer and half the
reduce-scatter / all-reduce bytes of fp32), and RoPE runs as Transformer Engine's fused kernel on every model,
DeepSeek-V3's MLA included (its provider's `apply_rope_fusion=False` is overridden).

A setting the row states itself (a column, a `name=value` of its notes, its launch line) wins.
"""
from __future__ import annotations

from typing import Any

from extractors.jobs.bridge.recipes import preset_clause

#: Launcher (as the notes' path names it) → what it sets over the model recipe (module docstring).
_COMMON = {"apply_rope_fusion": True, "accumulate_allreduce_grads_in_fp32": False, "cross_entropy_fusion_impl": "te"}
LAUNCHERS: dict[str, dict[str, Any]] = {
    "src/megatron/bridge/perf_recipes/": dict(_COMMON),
    "scripts/performance/": dict(_COMMON),
}


def launcher_settings(notes: str) -> tuple[str | None, dict[str, Any]]:
    """(the launcher directory the notes' `recipe preset NAME in PATH` names, the settings it sets); (None, {}) when
    the notes name no preset of a launcher tracekit knows."""
    clause = preset_clause(notes)
    path = clause[1] if clause else None
    if not path:
        return None, {}
    for launcher, settings in LAUNCHERS.items():
        if path.startswith(launcher):
            return launcher, dict(settings)
    return None, {}
