"""Settings a published row states outside its configuration columns (predictor.batch reads the columns):

- `megatron_args`: the run's exact Megatron command line (Megatron-LM's CI rows), read as `--megatron-args` would be;
  it wins over the columns derived from it (the world size stays the `num_gpus` column's: the launcher decides it).
- `activation_recompute`: `name=value` pairs inside the cell (`full (recompute_method=block, recompute_num_layers=5)`),
  read like the notes' below.
- `notes`: the recipe the row's compiler found (`recipe preset ...: cuda_graph_impl=full_iteration,
  moe_token_dispatcher_type=flex, ...`): `name=value` pairs whose name is a setting in `NOTE_SETTINGS` are read
  (a column that states the setting wins); `force-balance` routing; `sliding window N`; MTP stated per row
  (`w/o MTP` in the model name or the notes turns the recipe's MTP layer off); a token-drop run takes what
  Megatron-Bridge's `apply_moe_token_drop` (`src/megatron/bridge/training/utils/moe_token_drop.py`, which the perf
  scripts call for their token-drop runs) sets where the row states nothing else (`TOKEN_DROP`); the launch
  environment's variables of `ENV_SETTINGS` (`NCCL_ALGO=Ring`, `NCCL_NVLS_ENABLE=0`,
  `CUBLAS_WORKSPACE_CONFIG=:4096:8`); the architecture of the Megatron-Bridge model provider its
  `arch:` names (extractors.jobs.bridge.providers); what the Megatron-Bridge performance launcher its recipe preset
  comes from sets over the model recipe (extractors.jobs.bridge.perf_launch); the precision recipe its Megatron-Bridge
  recipe preset names and what Bridge's configuration for that recipe sets (extractors.jobs.bridge.precision); what the
  model recipe that preset names sets beyond them (extractors.jobs.bridge.recipes: Llama 3 70B's tensor-parallel
  communication overlap).
Every value read this way is named in the row's `prediction_notes`. A row whose notes say its model is not a
transformer (`HYBRID (not a pure transformer)`, `not a transformer`, `Mamba`, `state-space`) is one tracekit prices
only from a layer pattern (`not_a_transformer`: extractors.jobs.rows refuses it without one).
"""
from __future__ import annotations

import re
from typing import Any

from extractors.jobs.bridge.perf_launch import launcher_settings
from extractors.jobs.bridge.precision import cell_recipe, precision_settings
from extractors.jobs.bridge.providers import provider_settings
from extractors.jobs.bridge.recipes import recipe_settings
from extractors.jobs.megatron import parse_megatron_argv

#: Settings a row's notes may state, with the setting name tracekit reads them as.
NOTE_SETTINGS = {
    "moe_token_dispatcher_type": "moe_token_dispatcher_type",
    "moe_flex_dispatcher_backend": "moe_flex_dispatcher_backend",
    "moe_router_force_load_balancing": "moe_router_force_load_balancing",
    "overlap_moe_expert_parallel_comm": "overlap_moe_expert_parallel_comm",
    "moe_a2a_overlap": "overlap_moe_expert_parallel_comm",
    "moe_shared_expert_overlap": "moe_shared_expert_overlap",
    "expert_tensor_parallel_size": "expert_tensor_parallel_size",
    "recompute_granularity": "recompute_granularity",
    "recompute_modules": "recompute_modules",
    "recompute_num_layers": "recompute_num_layers",
    "recompute_method": "recompute_method",
    "mtp_num_layers": "mtp_num_layers",
    "window_attn_skip_freq": "window_attn_skip_freq",
    "fp8_dot_product_attention": "fp8_dot_product_attention",
    "cuda_graph_impl": "cuda_graph_impl",
    "cuda_graph_scope": "cuda_graph_scope",
    "pp_layout": "pipeline_model_parallel_layout",
    "tp_comm_overlap": "tp_comm_overlap",
    "use_megatron_fsdp": "use_megatron_fsdp",
    "cpu_offloading_num_layers": "cpu_offloading_num_layers",
    "use_transformer_engine_op_fuser": "use_transformer_engine_op_fuser",
    "cutedsl_fused_grouped_mlp": "use_transformer_engine_op_fuser",  # Bridge runs the CuTe DSL kernel in TE's fuser
    # Bridge r0.1.0's perf_matrix key: `set_cuda_graph_overrides` (scripts/performance/utils/helpers.py) sets
    # `model.enable_cuda_graph` (and the TE RNG tracker) to it: Megatron-core's per-layer graphs of the whole layer
    "cuda_graphs": "enable_cuda_graph",
}
#: What Megatron-Bridge's `apply_moe_token_drop` sets (its defaults: capacity factor 1.0, each expert's input padded
#: to its capacity) and requires (it asserts the all-to-all token dispatcher) for a token-drop run.
TOKEN_DROP = {"moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True,
              "moe_token_dispatcher_type": "alltoall"}
#: The launch environment's variables a row's notes may state (`run settings: ... NCCL_ALGO=Ring ...`).
ENV_SETTINGS = {"NCCL_ALGO": "nccl_algo", "NCCL_NVLS_ENABLE": "nccl_nvls_enable",
                "CUBLAS_WORKSPACE_CONFIG": "cublas_workspace_config"}
_ENV = re.compile(r"\b(" + "|".join(ENV_SETTINGS) + r")=([^\s,;|()]+)")
_NOT_TRANSFORMER = re.compile(r"not a (?:pure )?transformer|\bhybrid\b[^|]*\b(?:mamba\d*|ssm|state[- ]space)\b|"
                              r"\bstate[- ]space model\b", re.I)
_PAIR = re.compile(r"\b(pp_layout)=(\S+)|\b([a-z][a-z0-9_]*)=(\[[^\]]*\]|\"[^\"]*\"|'[^']*'|[^\s,;|()]+)")


def not_a_transformer(notes: str) -> str | None:
    """The words of a row's notes that say its model is not a (pure) transformer, None when they say nothing so."""
    found = _NOT_TRANSFORMER.search(notes or "")
    return found.group(0) if found else None


def _value(text: str) -> Any:
    text = text.strip().rstrip(":").strip("'\"")  # `recompute_num_layers=5: the perf overrides ...`
    if text.startswith("["):
        return [v.strip().strip("'\"") for v in text.strip("[]").split(",") if v.strip().strip("'\"")]
    if text in ("None", "none", "null"):
        return None
    return text


def note_settings(cells: dict[str, str], stated: set[str]) -> tuple[dict[str, Any], list[str]]:
    """(settings, notes) a row's notes and model name state (module docstring); `stated`: settings the row's
    columns give, which win."""
    notes_text = cells.get("notes", "") or ""
    name = cells.get("model_name", "") or ""
    out: dict[str, Any] = {}
    # the activation_recompute cell's own `name=value` pairs (`full (recompute_method=block, recompute_num_layers=5
    # ...)`) first: the column states them; then the notes'
    recompute_cell = cells.get("activation_recompute", "") or ""
    from_cell: list[str] = []
    for text in (recompute_cell, notes_text):
        for layout_key, layout, other_key, other in _PAIR.findall(text):
            key, raw = (layout_key, layout) if layout_key else (other_key, other)
            target = NOTE_SETTINGS.get(key)
            if target and target not in stated and target not in out:
                out[target] = _value(raw)
                if text is recompute_cell:
                    from_cell.append(target)
    for env, raw in _ENV.findall(notes_text):
        if ENV_SETTINGS[env] not in stated:
            out.setdefault(ENV_SETTINGS[env], raw)
    if re.search(r"force[- ]balanc", notes_text, re.I) and "moe_router_force_load_balancing" not in stated:
        out["moe_router_force_load_balancing"] = True
    window = re.search(r"sliding window (\d+)", notes_text, re.I)
    if window and "window_size" not in stated:
        out["window_size"] = int(window.group(1))
    if re.search(r"w/o MTP", name + " " + notes_text, re.I):
        out["mtp_num_layers"] = 0
    elif re.search(r"w/ MTP", name, re.I) and not out.get("mtp_num_layers"):
        out["mtp_num_layers"] = 1
    if (re.search(r"token[- ]?drop(?!less)", name + " " + notes_text, re.I) and "moe_expert_capacity_factor" not in
            stated and not re.search(r"dropless", name, re.I)):
        flex = "moe_flex_dispatcher_backend" in out  # a flex backend named: the flex dispatcher, as the rule below
        for key, value in TOKEN_DROP.items():
            if key not in stated and not (flex and key == "moe_token_dispatcher_type"):
                out.setdefault(key, value)
        out.pop("moe_router_force_load_balancing", None)
    if "moe_flex_dispatcher_backend" in out and "moe_token_dispatcher_type" not in out | dict.fromkeys(stated):
        out["moe_token_dispatcher_type"] = "flex"  # a flex backend is named only for the flex dispatcher
    if "recompute_granularity" in out and out["recompute_granularity"] is None:  # stated off: no modules either
        out.pop("recompute_granularity")
        out.pop("recompute_modules", None)
    cell = [f"{k}={out[k]}" for k in from_cell if k in out]
    read = [f"{k}={v}" for k, v in out.items() if k not in from_cell]
    notes = [f"read from the row's activation_recompute cell: {', '.join(cell)}"] if cell else []
    notes += [f"read from the row's notes: {', '.join(read)}"] if read else []
    provider, fixed = provider_settings(notes_text)
    fixed = {k: v for k, v in fixed.items() if k not in stated and k not in out}
    if fixed:
        out.update(fixed)
        notes.append(f"{provider} (Megatron-Bridge): {', '.join(f'{k}={v}' for k, v in fixed.items())}")
    launcher, launched = launcher_settings(notes_text)
    launched = {k: v for k, v in launched.items()
                if k not in stated and (k not in out or (k in fixed and fixed[k] != v))}
    if launched:  # the launcher sets these after the model provider: its values win over the provider's
        out.update(launched)
        notes.append(f"Megatron-Bridge's performance launcher ({launcher}): "
                     f"{', '.join(f'{k}={v}' for k, v in launched.items())}")
    preset, note = precision_settings(notes_text, cells.get("precision"), stated | set(out))
    if note:
        out.update(preset)
        notes.append(note)
    recipe, note = recipe_settings(notes_text, _int_cell(cells.get("tp")), _true_cell(cells.get("sequence_parallel")),
                                   cell_recipe(out.get("precision") or cells.get("precision")), stated | set(out))
    if note:
        out.update(recipe)
        notes.append(note)
    return out, notes


def _int_cell(text: str | None) -> int:
    try:
        return int(float(text)) if text and text.strip() else 1
    except ValueError:
        return 1  # the column's own error is reported where the column is read


def _true_cell(text: str | None) -> bool:
    return (text or "").strip().lower() in ("true", "yes", "1")


def argument_settings(cells: dict[str, str]) -> dict[str, Any]:
    """The row's `megatron_args` cell as Megatron settings ({} when the row has none)."""
    text = (cells.get("megatron_args") or "").strip()
    if not text:
        return {}
    settings = parse_megatron_argv(text)
    settings.pop("world_size", None)
    return settings
