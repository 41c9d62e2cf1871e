"""Training configurations of Megatron-style GPT jobs: the settings (Megatron's argument names), their derived
defaults as Megatron computes them, and validation of the parallel split. Setting names and values are
`tracekit.core.settings`'; reading them from files, command lines and logs is `extractors.jobs`'."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tracekit.core import (
    choices,
    hybrid as hybrid_settings,
    hybrid_pattern,
    layer_impl,
    legacy_arguments,
    moe as moe_settings,
    optimizer_state,
    pipeline_layout,
    precision as precision_recipes,
)
from tracekit.core.activation import ActivationSettings
from tracekit.core.attention import AttentionSettings
from tracekit.core.errors import ConfigError, did_you_mean
from tracekit.core.hybrid import HybridSettings
from tracekit.core.megatron_arguments import dest_form, refuse_unknown
from tracekit.core.megatron_defaults import (
    VOCAB_MULTIPLE,
    VOCAB_SIZE,
    data_parallel_size,
    default_ffn_hidden_size,
    default_kv_channels,
    num_microbatches,
    padded_vocab_size,
)
from tracekit.core.moe import MoESettings
from tracekit.core.pipeline_layout import LayoutSettings
from tracekit.core.precision import LowPrecisionSettings
from tracekit.core.runtime import RuntimeSettings
from tracekit.core.settings import (
    ALIASES,
    READ,
    SECTION_OF,
    SECTIONS,
    apply_setting,
    build_sections,
    coerce,
    precision_name,
    recompute_name,
    scalar,
    setting_name,
)
from tracekit.core.sharding import ShardingSettings

#: Sizes past any real training job (the largest published: ~200 layers, ~100k GPUs, hidden ~50k, a few thousand
#: micro-batches): a value beyond them is a typo, and simulating it would run for hours.
LIMITS = {"num_layers": 10_000, "world_size": 1_000_000, "hidden_size": 1_000_000, "seq_length": 10_000_000,
          "global_batch_size": 100_000_000, "microbatches": 100_000}


#: The default of the settings Megatron derives when they are not given (ffn_hidden_size, num_query_groups,
#: global_batch_size, data_parallel_size, world_size): None, which `TrainingConfig.__post_init__` replaces by the
#: derived value. Typed Any so that those fields are typed by what they hold once the object exists (an int).
DERIVED: Any = None


@dataclass
class TrainingConfig:
    """One Megatron GPT training job. Field names are Megatron's argument names (dest form). Settings defaulting to
    DERIVED are computed as Megatron computes them; `kv_channels` too, unless num_attention_heads is 0 (then None,
    and `validate` refuses the configuration)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    ffn_hidden_size: int = DERIVED
    num_query_groups: int = DERIVED
    kv_channels: int | None = None
    vocab_size: int = VOCAB_SIZE
    make_vocab_size_divisible_by: int = VOCAB_MULTIPLE
    micro_batch_size: int = 1
    global_batch_size: int = DERIVED
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    data_parallel_size: int = DERIVED
    world_size: int = DERIVED
    virtual_pipeline_model_parallel_size: int | None = None
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    overlap_p2p_comm: bool = True  # Megatron-core: interleaved-schedule P2P overlapped (--no-overlap-p2p-communication)
    tp_comm_overlap: bool = False  # Transformer Engine userbuffers: TP all-gather/reduce-scatter under the GEMMs
    #: gradients kept and all-reduced in fp32 (Megatron's --accumulate-allreduce-grads-in-fp32); None: Megatron's
    #: rule, forced on for bf16 (and fp8, trained in bf16), off for fp16
    accumulate_allreduce_grads_in_fp32: bool | None = None
    recompute_granularity: str = "none"  # none | selective | full
    #: selective recompute: which modules are replayed (Megatron-core's `--recompute-modules`; default core_attn)
    recompute_modules: tuple[str, ...] | None = None
    recompute_method: str | None = None  # full recompute: uniform | block
    recompute_num_layers: int | None = None  # full recompute, block method: layers per chunk replayed
    precision: str = "bf16"  # a recipe of tracekit.core.precision: fp32 fp16 bf16 fp8 fp8-cs fp8-block mxfp8 nvfp4
    normalization: str = "LayerNorm"  # LayerNorm | RMSNorm (tracekit.core.choices: every enumerated setting's values)
    swiglu: bool = False
    attention: str = "flash"  # flash (flash/fused kernels) | unfused (baddbmm + masked softmax + bmm)
    position_embedding_type: str = "learned_absolute"  # learned_absolute | rope | yarn (RoPE's kernels) | none
    #: RoPE as Transformer Engine's fused kernels (Megatron's `--no-rope-fusion` turns it off; its TransformerConfig
    #: default is off, Megatron-LM's arguments' on); False: the unfused element-wise chain (predictor.layers.norm_rope)
    apply_rope_fusion: bool = False
    #: RMSNorm as one fused kernel (Transformer Engine's); False: an unfused module (GPT-NeoX's, the samples')
    fused_rmsnorm: bool = False
    add_bias_linear: bool = True
    add_qkv_bias: bool = False  # the QKV projection's bias alone (Qwen's); Megatron turns it on with add_bias_linear
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    untie_embeddings_and_output_weights: bool = False
    train_iters: int | None = None
    moe: MoESettings | None = None  # mixture of experts (tracekit.core.moe); None: a dense model
    attn: AttentionSettings | None = None  # MLA, sliding windows, fp8 attention (tracekit.core.attention)
    act: ActivationSettings | None = None  # the experts' clamped GLU, TE's op fuser (tracekit.core.activation)
    layout: LayoutSettings | None = None  # uneven pipelines, layouts, MTP (tracekit.core.pipeline_layout)
    lowp: LowPrecisionSettings | None = None  # bf16 first/last layers (tracekit.core.precision)
    run: RuntimeSettings | None = None  # CUDA graphs, determinism, logging passes, timers (tracekit.core.runtime)
    sharding: ShardingSettings | None = None  # FSDP, HSDP, ZeRO (tracekit.core.sharding); None: Megatron's DDP
    hybrid: HybridSettings | None = None  # hybrid layer patterns, Mamba2/GDN/DSA (tracekit.core.hybrid); None: GPT
    extra: dict[str, Any] = field(default_factory=dict)  # arguments tracekit does not model, kept verbatim

    # -- derived values (Megatron's defaults) -----------------------------------------------------------------
    def __post_init__(self) -> None:
        self.recompute_granularity = recompute_name(self.recompute_granularity)
        self.precision = precision_name(self.precision)
        for name in ("attention", "normalization", "position_embedding_type", "recompute_method"):
            setattr(self, name, choices.choice(name, getattr(self, name)))
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = default_ffn_hidden_size(self.hidden_size, self.swiglu)
        if self.num_query_groups is None:
            self.num_query_groups = self.num_attention_heads
        if self.kv_channels is None and self.num_attention_heads:
            if self.hidden_size % self.num_attention_heads:
                raise ConfigError(
                    f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}"
                )
            self.kv_channels = default_kv_channels(self.hidden_size, self.num_attention_heads)
        if self.virtual_pipeline_model_parallel_size in (0, 1):
            self.virtual_pipeline_model_parallel_size = None
        if self.tensor_model_parallel_size == 1:
            self.sequence_parallel = False  # Megatron turns SP off without TP
        model_parallel = (self.tensor_model_parallel_size * self.pipeline_model_parallel_size
                          * self.context_parallel_size)
        if self.data_parallel_size is None:
            if self.world_size is not None:
                if self.world_size % model_parallel:
                    raise ConfigError(
                        f"world size {self.world_size} is not divisible by tp·pp·cp = {model_parallel}"
                    )
                self.data_parallel_size = data_parallel_size(self.world_size, self.tensor_model_parallel_size,
                                                             self.pipeline_model_parallel_size,
                                                             self.context_parallel_size)
            else:
                self.data_parallel_size = 1
        if self.world_size is None:
            self.world_size = model_parallel * self.data_parallel_size
        if self.global_batch_size is None:
            self.global_batch_size = self.micro_batch_size * self.data_parallel_size

    @property
    def tp(self) -> int:
        return self.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.pipeline_model_parallel_size

    @property
    def cp(self) -> int:
        return self.context_parallel_size

    @property
    def dp(self) -> int:
        return int(self.data_parallel_size or 1)

    @property
    def vp(self) -> int:
        return self.virtual_pipeline_model_parallel_size or 1

    def replays_in_full(self, position: int) -> bool:
        """Whether full recompute replays the `position`-th layer of a model chunk: every layer with the uniform
        method, the first `recompute_num_layers` of each chunk with the block method."""
        return self.recompute_granularity == "full" and (
            self.recompute_method != "block" or self.recompute_num_layers is None
            or position < self.recompute_num_layers)

    @property
    def head_dim(self) -> int:
        """kv_channels: given, or Megatron's h / heads; ConfigError for a configuration without attention heads."""
        if self.kv_channels is None:
            raise ConfigError(f"num_attention_heads must be ≥ 1, got {self.num_attention_heads}")
        return self.kv_channels

    @property
    def qkv_bias(self) -> bool:
        """The QKV projection has a bias: Megatron's `bias=add_bias_linear or add_qkv_bias` (attention.py)."""
        return self.add_bias_linear or self.add_qkv_bias

    @property
    def learned_positions(self) -> bool:
        """A learned absolute position embedding (a table of seq_length × hidden and its lookup)."""
        return self.position_embedding_type == "learned_absolute"

    @property
    def rotary_positions(self) -> bool:
        """RoPE on queries and keys (`yarn` runs the same kernels on rescaled frequencies)."""
        return self.position_embedding_type in ("rope", "yarn")

    @property
    def num_microbatches(self) -> int:
        return num_microbatches(self.global_batch_size, self.micro_batch_size, self.dp)

    @property
    def padded_vocab_size(self) -> int:
        return padded_vocab_size(self.vocab_size, self.make_vocab_size_divisible_by, self.tp)

    @property
    def tokens_per_iteration(self) -> int:
        return self.global_batch_size * self.seq_length

    @property
    def gemm_dtype(self) -> str:
        """The input dtype of the tensor-core GEMMs (a key of tracekit.core.hardware.PEAK_KIND): what the dense peak
        of a prediction's FLOP rate is measured against."""
        return precision_recipes.recipe(self.precision).gemm_dtype

    @property
    def recipe(self) -> precision_recipes.Recipe:
        return precision_recipes.recipe(self.precision)

    @property
    def microbatch_group(self) -> int:
        """Micro-batches per model chunk in a row of the interleaved schedule (Megatron's default: pp)."""
        group = self.layout.microbatch_group_size_per_vp_stage if self.layout else None
        return int(group or self.pp)

    @property
    def dtype_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element kept and reduced across data-parallel ranks (fp32 main gradients except with
        fp16, Megatron's rule; in the training dtype where a configuration states fp32 accumulation off: Megatron-
        Bridge's `grad_reduce_in_fp32=False`, FSDP's 16-bit reduce dtype, bf16 main gradients of the precision-aware
        optimizer: tracekit.core.optimizer_state)."""
        if self.accumulate_allreduce_grads_in_fp32 is False or self.extra.get("main_grads_dtype") == "bf16":
            return self.dtype_bytes
        if self.precision != "fp16" or self.accumulate_allreduce_grads_in_fp32:
            return 4
        return 2

    # -- validation ---------------------------------------------------------------------------------------------
    def validate(self) -> "TrainingConfig":
        """Raise ConfigError naming the first way this configuration cannot be split as asked."""
        positive = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
                    "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        tp, pp, cp, dp, vp = self.tp, self.pp, self.cp, self.dp, self.vp
        for name, limit in LIMITS.items():
            value = getattr(self, name, None)  # micro-batches: checked below, once the split is known valid
            if value is not None and int(value) > limit:
                raise ConfigError(f"{name} {value} is beyond what tracekit simulates (at most {limit:,}); "
                                  "is it a typo?")
        if self.num_attention_heads % tp:
            raise ConfigError(f"num_attention_heads {self.num_attention_heads} is not divisible by tp {tp}")
        if self.num_query_groups % tp:
            raise ConfigError(f"num_query_groups {self.num_query_groups} is not divisible by tp {tp}")
        if self.num_attention_heads % self.num_query_groups:
            raise ConfigError(
                f"num_attention_heads {self.num_attention_heads} is not divisible by num_query_groups "
                f"{self.num_query_groups}"
            )
        if self.ffn_hidden_size % tp:
            raise ConfigError(f"ffn_hidden_size {self.ffn_hidden_size} is not divisible by tp {tp}")
        pipeline_layout.chunks(self)  # ConfigError where Megatron refuses the layer split
        if vp > 1 and pp < 2:
            raise ConfigError("an interleaved schedule (virtual pipeline stages > 1) needs pp ≥ 2")
        if self.world_size != tp * pp * cp * dp:
            raise ConfigError(f"world size {self.world_size} ≠ tp·pp·cp·dp = {tp}·{pp}·{cp}·{dp} = {tp * pp * cp * dp}")
        if self.global_batch_size % (self.micro_batch_size * dp):
            raise ConfigError(
                f"global_batch_size {self.global_batch_size} is not divisible by micro_batch_size·dp = "
                f"{self.micro_batch_size}·{dp}"
            )
        if self.num_microbatches * vp > LIMITS["microbatches"]:
            raise ConfigError(f"{self.num_microbatches} micro-batches per iteration (global_batch_size "
                              f"{self.global_batch_size} / micro_batch_size·dp) is beyond what tracekit simulates (at "
                              f"most {LIMITS['microbatches']:,} per stage); is it a typo?")
        pipeline_layout.check_microbatch_groups(self)
        if self.hybrid is not None:  # the layers and MTP depths of its pattern first: the rest reads them
            self.hybrid.check_derived(self)
        for section in (self.moe, self.attn, self.sharding, self.run, self.hybrid):
            if section is not None:
                section.validate(self)
        if cp > 1 and self.seq_length % (2 * cp):
            raise ConfigError(f"seq_length {self.seq_length} is not divisible by 2·cp = {2 * cp}")
        if self.sequence_parallel and self.seq_length % tp:
            raise ConfigError(f"seq_length {self.seq_length} is not divisible by tp {tp} (sequence parallel)")
        layer_impl.check(self)  # the layer implementation's kernels and what is installed
        optimizer_state.check(self)  # Adam's state dtypes (the precision-aware optimizer)
        return self

    # -- (de)serialization --------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Megatron argument names → values (sections flattened into their settings; `from_mapping` reads it back)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in SECTIONS}
        data["extra"] = dict(self.extra)
        if data["recompute_modules"] is not None:
            data["recompute_modules"] = list(data["recompute_modules"])
        for name in SECTIONS:
            section = getattr(self, name)
            if section is not None:
                data.update(section.to_dict())
        if not data["extra"]:
            data.pop("extra")
        return data

    @classmethod
    def from_mapping(cls, mapping: dict[str, Any], defaults: dict[str, Any] | None = None,
                     strict: bool = False, unknown: list[str] | None = None) -> "TrainingConfig":
        """Build from Megatron argument names (dest or flag form) or their aliases; keys tracekit does not read go
        to `extra`. `defaults` (e.g. a software stack's) fill the settings the mapping does not state. `strict` (a
        file or command line a person typed, not a Megatron log) refuses a key that is neither Megatron's nor
        tracekit's (`micro_bach_size`, `--sequence-paralel`) with a suggestion, as Megatron's argparse would; given
        an `unknown` list (the user's --allow-unknown), such keys are kept aside and a warning is appended to it."""
        known = ({f.name for f in dataclasses.fields(cls)} - {"extra"} - set(SECTIONS)) | set(SECTION_OF)
        if isinstance(mapping.get("extra"), dict):  # `to_dict`'s form: the settings kept aside, read as the others
            mapping = {**mapping["extra"], **{k: v for k, v in mapping.items() if k != "extra"}}
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        if strict:
            refuse_unknown(mapping, own_setting_names(), unknown)
        for raw_key, raw in mapping.items():
            key = setting_name(raw_key)
            value = scalar(raw)
            if value is None:
                continue
            apply_setting(key, value, values, extra, known)
        for raw_key, raw in (defaults or {}).items():
            key = setting_name(raw_key)
            if key not in values and key not in extra and scalar(raw) is not None:
                apply_setting(key, scalar(raw), values, extra, known)
        legacy_arguments.apply(values, extra, record=not strict,  # Megatron's deprecated flags
                               stated=frozenset(setting_name(k) for k, v in mapping.items() if scalar(v) is not None))
        pattern = values.get("hybrid_layer_pattern") or values.get("hybrid_override_pattern")
        if "num_layers" not in values and pattern:  # Megatron takes the layer count from the pattern
            values["num_layers"] = hybrid_pattern.layer_count(str(pattern))
        if str(extra.get("transformer_impl", "")).strip().lower() == "local":  # whatever --use-flash-attn or
            values["attention"] = "unfused"  # --attention-backend say: DotProductAttention (tracekit.core.layer_impl)
        missing = [n for n in ("num_layers", "hidden_size", "num_attention_heads", "seq_length") if n not in values]
        if missing:
            raise ConfigError(f"configuration lacks {', '.join(missing)}")
        lowp = precision_recipes.from_megatron(**values.pop("_lowp", {}))
        base = values.pop("_base_precision", None)
        if lowp is not None:
            values["precision"] = lowp
        elif base is not None:
            values.setdefault("precision", base)
        first_dense = values.pop("_first_k_dense", None)
        if first_dense not in (None, "") and values.get("num_experts") not in (None, 0) and \
                "moe_layer_freq" not in values:
            values["moe_layer_freq"] = moe_settings.first_k_dense(int(float(first_dense)), int(values["num_layers"]))
        sections: dict[str, dict[str, Any]] = {}
        for key in [k for k in values if k in SECTION_OF]:
            sections.setdefault(SECTION_OF[key], {})[key] = values.pop(key)
        if hybrid_settings.latent_attention(sections.get("hybrid", {})):  # `D`/`+` layers: MLA, at its stated sizes
            sections.setdefault("attn", {})["multi_latent_attention"] = True
        build_sections(values, sections)
        hybrid_settings.check_spec(extra.get("spec"), values.get("hybrid"))
        if values.get("hybrid") is not None:
            hybrid_settings.apply_pattern(values)
        layout = values.get("layout")
        if layout is not None and layout.pipeline_model_parallel_layout and \
                not values.get("virtual_pipeline_model_parallel_size"):
            values["virtual_pipeline_model_parallel_size"] = pipeline_layout.layout_vp(
                layout.pipeline_model_parallel_layout, int(values.get("pipeline_model_parallel_size", 1)))
        per_stage = values.pop("_layers_per_virtual_stage", None)
        if per_stage and not values.get("virtual_pipeline_model_parallel_size"):
            # Megatron: vp = num_layers / (pp · num_layers_per_virtual_pipeline_stage)
            stages = int(values.get("pipeline_model_parallel_size", 1)) * int(per_stage)
            if int(values["num_layers"]) % stages:
                raise ConfigError(f"num_layers {values['num_layers']} is not divisible by pp · "
                                  f"num_layers_per_virtual_pipeline_stage = {stages}")
            values["virtual_pipeline_model_parallel_size"] = int(values["num_layers"]) // stages
        try:
            config = cls(**{k: v if k in SECTIONS else coerce(cls, k, v) for k, v in values.items()}, extra=extra)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"invalid configuration value: {exc}") from exc
        return config

def own_setting_names() -> set[str]:
    """Every setting name tracekit reads itself: TrainingConfig's fields, their aliases, Megatron's it interprets."""
    return ({f.name for f in dataclasses.fields(TrainingConfig)} - {"extra"} - set(SECTIONS)) | set(ALIASES) \
        | set(READ) | set(SECTION_OF)


def check_settings(mapping: dict[str, Any]) -> None:
    """ConfigError unless every key is a setting tracekit reads (e.g. `--set KEY=VALUE` overrides)."""
    names = sorted(own_setting_names())
    for raw_key in mapping:
        if dest_form(raw_key) not in names:
            raise ConfigError(f"unknown setting {raw_key!r}{did_you_mean(dest_form(raw_key), names)}: "
                              f"tracekit reads {', '.join(names)}")
    legacy_arguments.refuse({setting_name(k): scalar(v) for k, v in mapping.items()})  # typed: Megatron stops


