"""The values each enumerated setting takes, and the check every value passes on its way into a TrainingConfig: a word
outside its setting's choices, a flag that is neither true nor false, a number that is not one — each refused in one
line that names the key (`normalization: 'RMSNom' is not one of LayerNorm, RMSNorm (did you mean 'RMSNorm'?)`,
`micro_batch_size: '4x' is not a number`).

The choices are Megatron-LM's: its argparse `choices` and its configurations' `Literal` types in the pinned snapshot
(`megatron/training/arguments.py`, `megatron/core/transformer/transformer_config.py`,
`megatron/core/model_parallel_config.py`), with the spellings tables, logs and other frameworks write beside them
(case does not matter; a log prints `--attention-backend` as `AttnBackend.auto`). A value Megatron accepts that
tracekit does not model is refused as such, never run as another: `position_embedding_type mrope`, `optimizer sgd`,
`moe_router_dtype fp64`, `recompute_modules mhc`. The settings whose section checks them itself are not repeated here
(`precision`, `recompute_granularity`, `sharded_data_parallel`, `cuda_graph_impl`, `cuda_graph_modules`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tracekit.core import legacy_arguments, moe, pipeline_layout, sharding
from tracekit.core.errors import ConfigError, did_you_mean
from tracekit.core.megatron_arguments import list_words


@dataclass(frozen=True)
class Choices:
    """One enumerated setting: the values tracekit keeps (their spelling), other spellings it reads as one of them,
    the values Megatron accepts that tracekit does not model, whether the setting is a list of such words, and whether
    it may be left unset (`none`)."""

    values: tuple[str, ...]
    spellings: dict[str, str] = field(default_factory=dict)
    unmodelled: tuple[str, ...] = ()
    words: bool = False
    optional: bool = False


_ATTN_BACKENDS = {"fused": "flash", "auto": "flash", "local": "unfused"}
_TORCH_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.uint8": "fp8"}
_ROUTER_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")

#: Setting name (TrainingConfig's field, a section's field, or a Megatron argument kept in `extra`) → its choices.
ENUMERATED: dict[str, Choices] = {
    # TrainingConfig's own
    "normalization": Choices(("LayerNorm", "RMSNorm")),
    # yarn: RoPE on rescaled frequencies, the same kernels; none: no position embedding at all (NoPE)
    "position_embedding_type": Choices(("learned_absolute", "rope", "yarn", "none"),
                                       unmodelled=("mrope", "relative")),
    # tracekit's flash | unfused, and Megatron's --attention-backend (flash and fused: TE's fused kernels; auto picks
    # one of them where Transformer Engine runs; local: Megatron-core's unfused DotProductAttention)
    "attention": Choices(("flash", "unfused"), spellings={
        **_ATTN_BACKENDS, **{f"attnbackend.{k}": v for k, v in (*_ATTN_BACKENDS.items(), ("flash", "flash"),
                                                                  ("unfused", "unfused"))}}),
    "recompute_method": Choices(("uniform", "block"), optional=True),
    # Megatron-LM 2021–2022's, in the record of a run (tracekit.core.legacy_arguments)
    "activations_checkpoint_method": Choices(("uniform", "block"), optional=True),
    "ddp_impl": Choices(("local", "torch")),
    "recompute_modules": Choices(("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
                                  "gdn_norm_out", "per_op"), unmodelled=("gdp_in_proj", "gdp_qkv", "mhc"),
                                 words=True),
    # the MoE section (tracekit.core.moe)
    "moe_token_dispatcher_type": Choices(moe.DISPATCHERS),
    "moe_flex_dispatcher_backend": Choices(moe.FLEX_BACKENDS),
    "moe_router_score_function": Choices(moe.SCORE_FUNCTIONS),
    "moe_router_load_balancing_type": Choices(_ROUTER_BALANCING, unmodelled=("quantile_balancing",), words=True),
    "moe_router_dtype": Choices(("fp32",), spellings={"float32": "fp32"}, unmodelled=("fp64",), optional=True),
    # the pipeline section (tracekit.core.pipeline_layout)
    "torch_pipeline_schedule": Choices(pipeline_layout.ZERO_BUBBLE, optional=True),
    # the sharding section (tracekit.core.sharding; sharded_data_parallel has its own spellings there)
    "data_parallel_sharding_strategy": Choices(sharding.STRATEGIES, optional=True),
    "outer_dp_sharding_strategy": Choices(sharding.OUTER_STRATEGIES),
    # the precision flags (tracekit.core.precision.from_megatron reads them together)
    "fp8_format": Choices(("e4m3", "hybrid"), optional=True),
    "fp8_recipe": Choices(("delayed", "tensorwise", "blockwise", "mxfp8"), unmodelled=("custom",), optional=True),
    "fp4_format": Choices(("e2m1",), optional=True),
    "fp4_recipe": Choices(("nvfp4",), unmodelled=("custom",), optional=True),
    "params_dtype": Choices(("fp32", "fp16", "bf16"), spellings={
        "torch.float32": "fp32", "float32": "fp32", "float": "fp32", "torch.float16": "fp16", "float16": "fp16",
        "half": "fp16", "torch.bfloat16": "bf16", "bfloat16": "bf16"}),
    # the launch environment (tracekit.core.runtime)
    "nccl_nvls_enable": Choices(("0", "1", "2")),
    # kept in `extra` and read there
    "transformer_impl": Choices(("transformer_engine", "local", "inference_optimized")),
    "cross_entropy_fusion_impl": Choices(("native", "te", "flash_attn", "torch")),  # the last two: llm-foundry's
    "optimizer": Choices(("adam", "muon", "dist_muon", "adaptive_muon"), unmodelled=("sgd", "lion", "soap")),
    # the precision-aware optimizer's dtypes (tracekit.core.optimizer_state; a log prints them as torch dtypes)
    "main_grads_dtype": Choices(("fp32", "bf16"), spellings=_TORCH_DTYPES),
    "main_params_dtype": Choices(("fp32", "fp16"), spellings=_TORCH_DTYPES),
    "exp_avg_dtype": Choices(("fp32", "fp16", "bf16", "fp8"), spellings=_TORCH_DTYPES),
    "exp_avg_sq_dtype": Choices(("fp32", "fp16", "bf16", "fp8"), spellings=_TORCH_DTYPES),
    "muon_tp_mode": Choices(("blockwise", "duplicated", "distributed")),
    "offload_modules": Choices(("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1",
                                "moe_act", "fused_group_mlp"), unmodelled=("gdp_qkv",), words=True),
}

#: NCCL_ALGO's algorithms (NCCL's environment variables): a comma-separated list, `^` before it excludes them.
NCCL_ALGOS = ("Tree", "Ring", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT")

#: Megatron arguments kept in `extra` that are switches (true or false).
FLAGS = ("fp16", "bf16", "use_flash_attn", "recompute_activations", "disable_bias_linear", "group_query_attention",
         "fine_grained_activation_offloading", "muon_split_qkv", "moe_router_enable_expert_bias", "bias_dropout_fusion",
         "cross_entropy_loss_fusion", "squared_relu", "use_tp_pp_dp_mapping", "use_precision_aware_optimizer",
         *sharding.FLAGS,
         *legacy_arguments.SWITCHES)
#: Megatron arguments kept in `extra` that are numbers: name → whole number or not. A list is allowed where Megatron
#: takes several (`--moe-aux-loss-coeff`, one per load-balancing type).
NUMBERS = {"muon_num_ns_steps": True, "log_interval": True, "min_offloaded_tensor_size": True,
           "activation_offload_fraction": False, "moe_aux_loss_coeff": False, "moe_z_loss_coeff": False,
           "cpu_offloading_num_layers": True, "moe_first_k_dense": True,
           "num_layers_per_virtual_pipeline_stage": True, "ddp_bucket_size": True, "ddp_num_buckets": True,
           "loss_scale": False,
           **dict.fromkeys(legacy_arguments.WHOLE_NUMBERS, True)}
_LISTS = ("moe_aux_loss_coeff",)

_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def choice(key: str, value: Any) -> Any:
    """`value` as `key`'s choice (its spelling; a list setting's words, one word as a string); ConfigError naming the
    key otherwise."""
    spec = ENUMERATED[key]
    if spec.optional and (value is None or str(value).strip().lower() in ("none", "")):
        return value
    if spec.words:
        words = tuple(_one(key, spec, word) for word in list_words(value) or ())
        return words[0] if len(words) == 1 and isinstance(value, str) else words
    return _one(key, spec, value)


def _one(key: str, spec: Choices, value: Any) -> str:
    text = str(value).strip().strip("'\"")
    folded = text.lower()
    known = {v.lower(): v for v in spec.values}
    known.update({k.lower(): v for k, v in spec.spellings.items()})
    if folded in known:
        return known[folded]
    if folded in (v.lower() for v in spec.unmodelled):
        raise ConfigError(f"{key}: {text!r} is not modelled (Megatron accepts it; tracekit models "
                          f"{', '.join(spec.values)})")
    what = "a word of" if spec.words else "one of"
    raise ConfigError(f"{key}: {text!r} is not {what} {', '.join(spec.values)}"
                      f"{did_you_mean(text, spec.values + tuple(spec.spellings) + spec.unmodelled)}")


def flag(key: str, value: Any) -> bool:
    """A switch's value (true/false, 1/0, yes/no); ConfigError naming the key otherwise."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{key}: {value!r} is not true or false{did_you_mean(text, ('true', 'false'))}")


def number(key: str, value: Any, whole: bool = False) -> int | float:
    """A number setting's value (a whole one where `whole`); ConfigError naming the key otherwise."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: {value!r} is not a number")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: {value!r} is not a number") from None
    if whole:
        if out != out or out in (float("inf"), float("-inf")) or out != int(out):
            raise ConfigError(f"{key}: {value!r} is not a whole number")
        return int(out)
    return out if isinstance(value, str) else value


def nccl_algo(value: Any) -> Any:
    """NCCL_ALGO as NCCL reads it: algorithm names separated by commas, `^` before the list to exclude them."""
    tokens = [t.strip() for t in str(value).split(",")]
    names = {a.lower(): a for a in NCCL_ALGOS}
    for token in tokens:
        word = token.lstrip("^")
        if word.lower() not in names:
            raise ConfigError(f"nccl_algo: {word!r} is not an NCCL algorithm ({', '.join(NCCL_ALGOS)})"
                              f"{did_you_mean(word, NCCL_ALGOS)}")
    return value


def checked(key: str, value: Any) -> Any:
    """`value` checked as setting `key` takes it (unchanged for settings checked elsewhere or not read)."""
    if key in ENUMERATED:
        return choice(key, value)
    if key in FLAGS:
        return flag(key, value)
    if key in NUMBERS:
        if key in _LISTS and (isinstance(value, (list, tuple)) or str(value).strip().startswith("[")):
            return [number(key, v, NUMBERS[key]) for v in list_words(value) or ()]
        return number(key, value, NUMBERS[key])
    if key == "nccl_algo":
        return nccl_algo(value)
    return value
