"""What a Megatron-Bridge pretraining recipe sets beyond its model provider and precision, for a published row whose
notes name the recipe preset it ran (`recipe preset LLAMA3_70B_H100_FP8_CS_BASE_CONFIG in
scripts/performance/configs/llama3/workload_base_configs.py@v0.2.0`, `recipe preset
perf_matrix[h100][num_gpus_64][common+fp8_cs] in
scripts/performance/configs/llama3/llama3_70b_llm_pretrain.yaml@r0.1.0`): the model recipe is the one the preset's
name or file names.

- Llama 3 70B (`llama3_70b_pretrain_config`, `src/megatron/bridge/recipes/llama/llama3.py`): the recipe's
  `CommOverlapConfig(tp_comm_overlap=True, tp_comm_overlap_cfg=userbuffers_..._h8192_tp4_mbs1_seqlen8192)` runs the
  tensor-parallel all-gathers and reduce-scatters under the GEMMs (Transformer Engine's userbuffers). The performance
  scripts keep it and only choose the userbuffers configuration per GPU and precision (`COMM_OVERLAP_CONFIG_MAP` of
  the r0.1.0 scripts' `utils/helpers.py`; `cfg.comm_overlap.tp_comm_overlap_cfg = ...` in `llama3_70b_<gpu>_config`
  of the later `configs/llama3/llama3_llm_pretrain.py`).

Bridge turns tensor-parallel overlap off below TP 2 and without sequence parallelism
(`CommOverlapConfig._get_model_comm_overlap_cfgs` in `src/megatron/bridge/training/comm_overlap.py`), so a row with
TP 1 (the Megatron-FSDP 70B rows) keeps it off; the performance scripts turn it off for NVFP4
(`cfg.comm_overlap.tp_comm_overlap = False if precision == "nvfp4" else ...` in `llama3_70b_pretrain_config_<gpu>`
of `configs/llama/llama3_llm_pretrain.py`). A setting the row states itself wins.
"""
from __future__ import annotations

import re
from typing import Any

#: A model recipe as the preset's name or file spells it (case-insensitive) → what that recipe sets.
RECIPES: dict[str, dict[str, Any]] = {
    "llama3_70b": {"tp_comm_overlap": True},
}
_PRESET_CLAUSE = re.compile(r"recipe preset\s+(\S+)(?:\s+in\s+(\S+))?")


def preset_clause(notes: str) -> tuple[str, str | None] | None:
    """(NAME, FILE or None) of the notes' `recipe preset NAME [in FILE]`, None when the notes name no preset; the one
    reader of that clause (extractors.jobs.bridge.precision, extractors.jobs.bridge.perf_launch)."""
    clause = _PRESET_CLAUSE.search(notes or "")
    return (clause.group(1), clause.group(2)) if clause else None


def preset_model_recipe(notes: str) -> str | None:
    """The model recipe (a key of RECIPES) the notes' `recipe preset NAME in FILE` names, None otherwise."""
    clause = preset_clause(notes)
    if clause is None:
        return None
    text = " ".join(part for part in clause if part).lower()
    for recipe in RECIPES:
        if re.search(rf"(?:^|[^a-z0-9]){recipe}(?:$|[^a-z0-9])", text):
            return recipe
    return None


def recipe_settings(notes: str, tp: int, sequence_parallel: bool, precision: str | None, stated: set[str]
                    ) -> tuple[dict[str, Any], str | None]:
    """(settings, a note naming them) the Bridge recipe the notes' preset names sets, as Bridge and its performance
    scripts apply them to a run with tensor parallelism `tp`, `sequence_parallel` and the precision recipe
    `precision` (tracekit's name; module docstring); settings in `stated` are the row's. ({}, None) when the notes
    name no recipe tracekit knows or it sets nothing here."""
    recipe = preset_model_recipe(notes)
    if recipe is None:
        return {}, None
    out = {k: v for k, v in RECIPES[recipe].items() if k not in stated}
    if out.get("tp_comm_overlap") and (tp < 2 or not sequence_parallel or precision == "nvfp4"):
        out.pop("tp_comm_overlap")  # Bridge's CommOverlapConfig / the NVFP4 performance configs turn it off
    if not out:
        return {}, None
    return out, f"Megatron-Bridge's {recipe} recipe: {', '.join(f'{k}={v}' for k, v in out.items())}"
