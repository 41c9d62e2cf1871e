"""Setting names and values as TrainingConfig reads them: Megatron's argument names (dest or flag form) and the aliases
tables and files use (`tp`, `num_gpus`, ...), the sections that hold their own settings (MoE, attention, sharding,
...), and each value coerced to its field's type (CSV cells and log values are strings). `TrainingConfig.from_mapping`
(tracekit.core.config) assembles a configuration from them; reading files, command lines and logs is
`extractors.jobs`'."""
from __future__ import annotations

import dataclasses
from typing import Any

from tracekit.core import (
    activation as activation_settings,
    attention as attention_settings,
    choices,
    hybrid as hybrid_settings,
    layer_impl,
    legacy_arguments,
    moe as moe_settings,
    optimizer_state,
    pipeline_layout,
    precision as precision_recipes,
    runtime as runtime_settings,
    sharding as sharding_settings,
)
from tracekit.core.activation import ActivationSettings
from tracekit.core.attention import AttentionSettings
from tracekit.core.errors import ConfigError, did_you_mean
from tracekit.core.hybrid import HybridSettings
from tracekit.core.megatron_arguments import dest_form, list_words
from tracekit.core.moe import MoESettings
from tracekit.core.pipeline_layout import LayoutSettings
from tracekit.core.precision import LowPrecisionSettings
from tracekit.core.runtime import RuntimeSettings
from tracekit.core.sharding import ShardingSettings

#: Short and foreign names accepted for Megatron's argument names (CSV columns, YAML keys).
ALIASES = {
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "cp": "context_parallel_size",
    "dp": "data_parallel_size",
    "vp": "virtual_pipeline_model_parallel_size",
    "virtual_pipeline_stages": "virtual_pipeline_model_parallel_size",
    "num_gpus": "world_size",
    "activation_recompute": "recompute_granularity",
    "attention_backend": "attention",
    "heads": "num_attention_heads",
    "layers": "num_layers",
    "hidden": "hidden_size",
    "seq_len": "seq_length",
    "overlap_p2p_communication": "overlap_p2p_comm",  # Megatron's flag is --no-overlap-p2p-communication
    "rope_fusion": "apply_rope_fusion",  # Megatron's flag is --no-rope-fusion
    "fp8": "fp8_format",  # the argparse destinations of --fp8-format and --fp4-format (what a log's block prints)
    "fp4": "fp4_format",
    "num_virtual_stages_per_pipeline_rank": "virtual_pipeline_model_parallel_size",
    "microbatch_group_size_per_virtual_pipeline_stage": "microbatch_group_size_per_vp_stage",
    **moe_settings.ALIASES,
    **runtime_settings.ALIASES,
}

#: Settings kept in a section of their own (a module each, holding their rules): section name → (type, fields).
SECTIONS: dict[str, tuple[type, tuple[str, ...]]] = {
    "moe": (MoESettings, moe_settings.FIELDS),
    "attn": (AttentionSettings, attention_settings.FIELDS),
    "act": (ActivationSettings, activation_settings.FIELDS),
    "layout": (LayoutSettings, pipeline_layout.FIELDS),
    "lowp": (LowPrecisionSettings, precision_recipes.LOWP_FIELDS),
    "run": (RuntimeSettings, runtime_settings.FIELDS),
    "sharding": (ShardingSettings, sharding_settings.FIELDS),
    "hybrid": (HybridSettings, hybrid_settings.FIELDS),
}
SECTION_OF = {name: section for section, (_, names) in SECTIONS.items() for name in names}



def setting_name(key: str) -> str:
    """A Megatron argument name (flag or dest form, or an alias such as `tp`) as TrainingConfig's field name."""
    return ALIASES.get(dest_form(key), dest_form(key))


def scalar(raw: Any) -> Any:
    """Strings from logs/CSV cells → Python values; a note after the value ('full (use_checkpoint=true)') is cut."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    if text == "" or text in ("None", "null", "nan", "NaN"):
        return None
    token = text.split()[0] if not text.startswith("[") else text
    lowered = token.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(token)
        except ValueError:
            pass
    return token


#: Megatron arguments `_apply` reads besides TrainingConfig's fields and ALIASES.
READ = ("fp16", "bf16", "fp8_format", "fp8_recipe", "fp4_format", "fp4_recipe", "params_dtype",
         "recompute_activations", "use_flash_attn", "transformer_impl", "disable_bias_linear",
         "num_layers_per_virtual_pipeline_stage", "group_query_attention", "moe_first_k_dense",
         *sharding_settings.FLAGS,
         # kept in `extra` and read there: fine-grained activation offloading (predictor.schedule.activation_offload,
         # predictor.memory.stages), the optimizer (predictor.parallel.muon), the launch environment's
         # CUBLAS_WORKSPACE_CONFIG (predictor.memory.workspaces), the MoE layer's host calls
         # (predictor.layers.moe.host_calls), the unfused bias-dropout-add (predictor.layers.mlp.bias_dropout_add), the
         # fused loss (predictor.layers.embedding.cross_entropy: its time; predictor.memory.stages: the logits it keeps,
         # by implementation), the logging barrier's interval (predictor.parallel.iteration_syncs) and the activation
         # of a non-gated MLP (predictor.layers.mlp.activation), the gradient buckets (predictor.parallel.grad_buckets)
         "fine_grained_activation_offloading", "offload_modules", "min_offloaded_tensor_size",
         "activation_offload_fraction", "optimizer", "muon_num_ns_steps", "muon_tp_mode", "muon_split_qkv",
         "cublas_workspace_config", "moe_aux_loss_coeff", "moe_z_loss_coeff", "moe_router_enable_expert_bias",
         "bias_dropout_fusion", "cross_entropy_loss_fusion", "cross_entropy_fusion_impl", "log_interval",
         "squared_relu", "ddp_bucket_size", "ddp_num_buckets",
         # the rank order (predictor.ir.placement.order_of)
         "use_tp_pp_dp_mapping",
         # Adam's state and the precision-aware optimizer (tracekit.core.optimizer_state)
         *optimizer_state.SETTINGS,
         # the static loss scale: with fp16, Megatron's result checks run only with one (tracekit.core.runtime)
         "loss_scale",
         # Megatron's deprecated flags, refused or translated (tracekit.core.legacy_arguments)
         *legacy_arguments.SETTINGS,
         # the layer implementation's kernels and what is installed (tracekit.core.layer_impl)
         *layer_impl.SETTINGS,
         # a hybrid model's: Megatron's negated switch (tracekit.core.hybrid.NEGATED) and the layer spec, kept in
         # `extra` and checked against the layer specs tracekit prices (tracekit.core.hybrid.check_spec)
         *hybrid_settings.NEGATED, "spec")
#: Megatron's flags that pick a low-precision recipe (tracekit.core.precision.from_megatron reads them together).
LOWP_FLAGS = ("fp8_format", "fp8_recipe", "fp4_format", "fp4_recipe")


def apply_setting(key: str, value: Any, values: dict, extra: dict, known: set[str]) -> None:
    """Read one setting into `values` (TrainingConfig's fields and sections) or `extra`, its value checked against
    the setting's choices first (tracekit.core.choices)."""
    value = choices.checked(key, value)
    if sharding_settings.apply_flag(key, value, values):
        return
    if key in ("fp16", "bf16"):
        if value is True:  # the base dtype; --fp8-format / --fp4-format, read after every key, may lower the GEMMs
            values.setdefault("_base_precision", key)
        return
    if key in LOWP_FLAGS:  # Megatron/TE: --fp8-format e4m3|hybrid (--fp8-recipe ...), --fp4-format e2m1
        values.setdefault("_lowp", {})[key] = value
        return
    if key == "recompute_modules":
        values[key] = list_words(value)
        return
    if key == "moe_first_k_dense":  # published tables: the first k layers dense, the rest MoE
        values["_first_k_dense"] = value
        return
    if key == "params_dtype":
        values.setdefault("precision", value)
        return
    if key == "precision":
        values["precision"] = value
        return
    if key == "recompute_activations" and value is True:
        values.setdefault("recompute_granularity", "selective")
        return
    if key == "use_flash_attn":
        values["attention"] = "flash" if value else values.get("attention", "unfused")
        return
    if key == "attention":
        values["attention"] = value
        return
    if key == "transformer_impl":  # Megatron-core's local layer spec runs core attention unfused (DotProductAttention)
        values.setdefault("attention", "unfused" if str(value) == "local" else "flash")
        extra[key] = value
        return
    if key == "disable_bias_linear":
        values["add_bias_linear"] = not value
        return
    if key == "num_layers_per_virtual_pipeline_stage":
        values["_layers_per_virtual_stage"] = value
        return
    if key in hybrid_settings.NEGATED:  # --disable-mamba-mem-eff-path: use_mamba_mem_eff_path False
        values[hybrid_settings.NEGATED[key]] = not value
        return
    if key == "group_query_attention":
        extra[key] = value
        return
    if key in known:
        values[key] = value
    else:
        extra[key] = value


def coerce(cls, name: str, value: Any) -> Any:
    """A field's value as its type; ConfigError naming the field for a value that is not one."""
    kind = {f.name: f.type for f in dataclasses.fields(cls)}[name]
    if "bool" in str(kind):
        return choices.flag(name, value)
    if "int" in str(kind):
        return choices.number(name, value, whole=True)
    if "float" in str(kind):
        return float(choices.number(name, value))
    return value


def build_sections(values: dict[str, Any], sections: dict[str, dict[str, Any]]) -> None:
    """The section objects of the settings collected per section (`values[name]` = the section, or absent): MoE only
    with experts, MLA/window attention only when asked for. Every stated value is checked, a section built or not."""
    sections = {name: typed(SECTIONS[name][0], settings) for name, settings in sections.items()}
    moe = sections.get("moe", {})
    if moe.get("num_experts") not in (None, 0, False):
        values["moe"] = build_section(MoESettings, moe)
    attn = sections.get("attn", {})
    if attn.get("multi_latent_attention") or attn.get("window_size") not in (None, False, "None") or \
            attn.get("qk_layernorm") or attn.get("fp8_dot_product_attention"):
        values["attn"] = build_section(AttentionSettings, attn)
    for name in ("layout", "lowp"):
        if any(v not in (None, False) for v in sections.get(name, {}).values()):
            values[name] = build_section(SECTIONS[name][0], sections[name])
    if activation_settings.stated(sections.get("act", {})):
        values["act"] = build_section(ActivationSettings, sections["act"])
    if runtime_settings.stated(sections.get("run", {})):
        values["run"] = build_section(RuntimeSettings, sections["run"])
    hybrid = sections.get("hybrid", {})
    if hybrid_settings.stated(hybrid):  # a layer pattern, the ratios, or a linear/sparse attention variant
        values["hybrid"] = build_section(HybridSettings, hybrid)
    elif str(hybrid.get("is_hybrid_model", False)).strip().lower() in ("true", "1", "yes"):
        raise ConfigError("--is-hybrid-model without --hybrid-layer-pattern: Megatron builds a hybrid model only from "
                          "its layer pattern (one symbol per layer: M Mamba2, G Gated DeltaNet, * attention, D DSA, "
                          "+ MLA, - MLP, E MoE)")
    if sections.get("sharding"):  # stated sharding settings other than Megatron's defaults (plain DDP)
        sharding = build_section(ShardingSettings, sections["sharding"])
        if sharding != ShardingSettings():
            values["sharding"] = sharding


def build_section(kind: type, settings: dict[str, Any]) -> Any:
    """A section from its settings, each coerced to its field's type (CSV cells and log values are strings)."""
    try:
        return kind(**typed(kind, settings))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid {kind.__name__} value: {exc}") from exc


def typed(kind: type, settings: dict[str, Any]) -> dict[str, Any]:
    """A section's stated settings, each as its field's type; ConfigError naming the key for a value that is not."""
    types = {f.name: str(f.type) for f in dataclasses.fields(kind)}
    out: dict[str, Any] = {}
    for key, value in settings.items():
        kind_text = types[key]
        if value is None:
            continue
        if "bool" in kind_text:
            value = choices.flag(key, value)
        elif kind_text.startswith("int"):
            value = choices.number(key, value, whole=True)
        elif kind_text.startswith("float"):
            value = float(choices.number(key, value))
        elif kind_text.startswith("str") and isinstance(value, (int, float)) is False:
            value = str(value) if not isinstance(value, (list, tuple)) else value
        out[key] = value
    return out


def recompute_name(value: Any) -> str:
    text = str(value or "none").strip().lower()
    if text in ("none", "false", "no", "0", "off"):
        return "none"
    if text in ("full", "true", "yes", "1", "uniform", "block"):
        return "full"
    if text == "selective":
        return "selective"
    raise ConfigError(f"recompute_granularity: {value!r} is not one of none, selective, full"
                      f"{did_you_mean(text, ('none', 'selective', 'full'))}")


def precision_name(value: Any) -> str:
    return precision_recipes.recipe_name(value)

