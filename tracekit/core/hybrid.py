"""Hybrid models of Megatron-core (the vendored snapshot's `megatron/core/models/hybrid/`, `megatron/core/ssm/`,
`megatron/core/transformer/experimental_attention_variant/`), by Megatron's argument names, with the rules and the
error messages Megatron applies to them. `predictor.layers` prices the layers.

Design note
-----------
- **Mamba2** (`MambaMixer` as `hybrid_stack_spec` builds it): `--mamba-state-dim` N (128), `--mamba-head-dim` P (64),
  `--mamba-num-groups` G (8), `--mamba-num-heads` H (None: d_inner / P with d_inner = expand · hidden), d_inner = H · P
  when H is given; the spec's constants, not flags: conv kernel 4, expand 2, chunk size 128, gated RMSNorm, conv bias,
  no linear bias, one D per head. TP splits heads and groups (H % tp, G % tp, H % G); CP (all-to-all from sequence to
  heads) needs H/tp % cp and G/tp dividing or divided by cp. fp8 needs the in-projection width 2·d_inner + 2·G·N + H
  a multiple of 16. `--disable-mamba-mem-eff-path` and `--mamba-training-ssm-states-dtype` are read too.
- **Gated DeltaNet** (`G` layers, or GPT linear-attention layers): `--linear-conv-kernel-dim` 4,
  `--linear-key-head-dim` 128, `--linear-value-head-dim` 128, `--linear-num-key-heads` 16, `--linear-num-value-heads`
  32 (a multiple of the key heads; both divisible by tp · cp); the FLA chunk size is 64. `gdn2` widens the in-projection
  by 2 · key dim + value dim (channel-wise gates).
- **DSA** (`D` layers): `--dsa-indexer-n-heads`, `--dsa-indexer-head-dim`, `--dsa-indexer-topk` (all needed),
  `--dsa-indexer-topk-freq` / `--dsa-indexer-skip-topk-offset` (layers that reuse an earlier layer's top-k: never
  across a pipeline stage), `--dsa-indexer-loss-coeff` (> 0: the indexer's KL loss and its backward),
  `--dsa-indexer-use-sparse-loss`, `--dsa-kernel-backend` none | tilelang | cudnn (none: PyTorch's dense masked path);
  no linear biases, no RoPE fusion, CP only with the all-gather exchange.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, did_you_mean
from .hybrid_pattern import (
    DS_ATTENTION,
    GDN,
    MAMBA,
    MLA,
    MTP_SEPARATOR,
    layer_count,
    linear_attention_pattern,
    parse,
    pattern_from_ratios,
    pattern_vp,
    validate_pipeline,
    validate_topk_sharing,
)
from .hybrid_shapes import (
    DSA_BACKENDS,
    MAMBA_EXPAND,
    SSM_STATE_DTYPES,
    VARIANTS,
    DSAShape,
    GDNShape,
    MambaShape,
)
from .moe import layer_freq
from .pipeline_layout import LayoutSettings


@dataclass(frozen=True)
class HybridSettings:
    hybrid_layer_pattern: str | None = None
    hybrid_override_pattern: str | None = None  # deprecated spelling; both at once refused
    mtp_hybrid_override_pattern: str | None = None  # legacy MTP pattern, repeated mtp_num_layers times
    hybrid_attention_ratio: float = 0.0  # HybridModelConfig's deprecated ratios (no flags)
    hybrid_mlp_ratio: float = 0.0
    is_hybrid_model: bool = False
    mamba_state_dim: int = 128
    mamba_head_dim: int = 64
    mamba_num_groups: int = 8
    mamba_num_heads: int | None = None
    use_mamba_mem_eff_path: bool = True  # --disable-mamba-mem-eff-path turns it off
    mamba_training_ssm_states_dtype: str | None = None  # None: the activation dtype
    experimental_attention_variant: str | None = None  # gdn | gdn2 | dsa ('gated_delta_net': gdn)
    linear_attention_freq: Any = None  # int N, or a 0/1 tuple per GPT layer (1: linear attention)
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    dsa_indexer_n_heads: int | None = None
    dsa_indexer_head_dim: int | None = None
    dsa_indexer_topk: int | None = None
    dsa_indexer_topk_freq: int = 1
    dsa_indexer_skip_topk_offset: int = 0
    dsa_indexer_loss_coeff: float | None = None
    dsa_indexer_use_sparse_loss: bool = False
    dsa_kernel_backend: str = "none"
    dsa_indexer_rotate_activation: bool = True
    dsa_indexer_scoring_relu: bool = True
    dsa_indexer_k_norm_fp32: bool = False
    #: --num-layers as stated before the pattern's count replaced it (Megatron's warning names it); not a setting
    stated_num_layers: int | None = dataclasses.field(default=None, compare=False, metadata={"derived": True})

    def __post_init__(self) -> None:
        variant = self.experimental_attention_variant
        if variant is not None:
            variant = str(variant).strip().lower()
            variant = "gdn" if variant == "gated_delta_net" else variant
            if variant not in VARIANTS:
                raise ConfigError(f"experimental_attention_variant must be one of {', '.join(VARIANTS)}, not "
                                  f"{variant!r}{did_you_mean(variant, VARIANTS)}")
            object.__setattr__(self, "experimental_attention_variant", variant)
        if self.linear_attention_freq is not None:
            freq = self.linear_attention_freq
            try:
                object.__setattr__(self, "linear_attention_freq", layer_freq(freq))
            except ConfigError as exc:
                raise ConfigError(str(exc).replace("moe_layer_freq", "linear_attention_freq")) from exc
        if self.dsa_kernel_backend not in DSA_BACKENDS:
            raise ConfigError("dsa_kernel_backend must be one of: none, tilelang, cudnn"
                              f"{did_you_mean(str(self.dsa_kernel_backend), DSA_BACKENDS)}")
        dtype = self.mamba_training_ssm_states_dtype
        if dtype is not None and dtype not in SSM_STATE_DTYPES:
            raise ConfigError(f"mamba_training_ssm_states_dtype must be fp32 or bf16, not {dtype!r}")
        for name in ("mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "linear_conv_kernel_dim",
                     "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                     "linear_num_value_heads"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.mamba_num_heads is not None and self.mamba_num_heads < 1:
            raise ConfigError(f"mamba_num_heads must be ≥ 1 (or unset), got {self.mamba_num_heads}")

    # -- the pattern --------------------------------------------------------------------------------------------
    def pattern(self, num_layers: int | None = None, mtp_num_layers: int | None = None) -> str | None:
        """The unified pattern Megatron runs: --hybrid-layer-pattern (or its deprecated spelling), the legacy MTP
        pattern appended `mtp_num_layers` times when the pattern has no `/`, else the ratios' allocation over
        `num_layers`; None for a GPT model."""
        main = self.hybrid_layer_pattern if self.hybrid_layer_pattern is not None else self.hybrid_override_pattern
        if main is None and (self.hybrid_attention_ratio > 0 or self.hybrid_mlp_ratio > 0):
            if num_layers is None:
                raise ConfigError("hybrid_attention_ratio / hybrid_mlp_ratio need num_layers")
            main = pattern_from_ratios(num_layers, self.hybrid_attention_ratio, self.hybrid_mlp_ratio)
        legacy = self.mtp_hybrid_override_pattern
        if legacy is not None and mtp_num_layers and (main is None or MTP_SEPARATOR not in main):
            main = (main or "") + MTP_SEPARATOR + MTP_SEPARATOR.join([legacy] * mtp_num_layers)
        return main

    @property
    def is_hybrid(self) -> bool:
        """Whether Megatron builds a HybridModel (a pattern, or the ratios, is given)."""
        return self.pattern(num_layers=1) is not None

    # -- shapes -------------------------------------------------------------------------------------------------
    def mamba(self, hidden: int) -> MambaShape:
        """The Mamba2 mixer's sizes for a model of `hidden` (MambaMixer's rules; ConfigError where it asserts)."""
        p = self.mamba_head_dim
        if self.mamba_num_heads is not None:
            heads = self.mamba_num_heads
            d_inner = heads * p
        else:
            d_inner = MAMBA_EXPAND * hidden
            if d_inner % p:
                raise ConfigError(f"d_inner must be evenly divisible by headdim (d_inner = {MAMBA_EXPAND}·hidden = "
                                  f"{d_inner}, mamba_head_dim {p})")
            heads = d_inner // p
        return MambaShape(hidden, d_inner, heads, p, self.mamba_state_dim, self.mamba_num_groups)

    def gdn(self, hidden: int) -> GDNShape:
        return GDNShape(hidden, self.linear_num_key_heads, self.linear_num_value_heads, self.linear_key_head_dim,
                        self.linear_value_head_dim, self.linear_conv_kernel_dim,
                        "gdn2" if self.experimental_attention_variant == "gdn2" else "gdn")

    def dsa(self, hidden: int, q_lora_rank: int | None, rope_dim: int) -> DSAShape:
        if None in (self.dsa_indexer_n_heads, self.dsa_indexer_head_dim, self.dsa_indexer_topk):
            raise ConfigError("DSA layers need dsa_indexer_n_heads, dsa_indexer_head_dim and dsa_indexer_topk "
                              "(Megatron's DSAIndexer sizes its projections from them)")
        assert self.dsa_indexer_n_heads is not None and self.dsa_indexer_head_dim is not None
        assert self.dsa_indexer_topk is not None
        return DSAShape(hidden, q_lora_rank or hidden, self.dsa_indexer_n_heads, self.dsa_indexer_head_dim,
                        self.dsa_indexer_topk, rope_dim, self.dsa_indexer_topk_freq,
                        self.dsa_indexer_skip_topk_offset, float(self.dsa_indexer_loss_coeff or 0.0),
                        self.dsa_indexer_use_sparse_loss, self.dsa_kernel_backend,
                        self.dsa_indexer_rotate_activation, self.dsa_indexer_scoring_relu,
                        self.dsa_indexer_k_norm_fp32)

    # -- Megatron's rules ---------------------------------------------------------------------------------------
    def validate(self, config) -> None:
        """ConfigError naming the first way Megatron would refuse these settings with `config` (a TrainingConfig:
        its num_layers, tp, cp, pp, vp, precision, layout and attention sections are read)."""
        c = config
        if self.hybrid_layer_pattern is not None and self.hybrid_override_pattern is not None:
            raise ConfigError("--hybrid-override-pattern and --hybrid-layer-pattern cannot both be specified. "
                              "--hybrid-override-pattern is deprecated; use --hybrid-layer-pattern instead.")
        if (self.hybrid_attention_ratio > 0 or self.hybrid_mlp_ratio > 0) and self.hybrid_layer_pattern is not None:
            raise ConfigError("hybrid_layer_pattern cannot be used together with hybrid_attention_ratio or "
                              "hybrid_mlp_ratio. These ratios have been deprecated; use hybrid_layer_pattern alone.")
        layout = c.layout
        mtp_layers = layout.mtp_num_layers if layout is not None else None
        pattern = self.pattern(c.num_layers, mtp_layers)
        variant = self.experimental_attention_variant
        if variant == "gdn" and self.linear_attention_freq is None:
            raise ConfigError("linear_attention_freq must be set for linear gdn.")
        if pattern is None:
            if variant in ("gdn", "gdn2") and self.linear_attention_freq is not None:
                linear_attention_pattern(self.linear_attention_freq, c.num_layers)
            kinds = set()
            if variant in ("gdn", "gdn2"):
                kinds.add(GDN)
            if variant == "dsa":
                kinds.add(DS_ATTENTION)
            self._validate_kinds(c, kinds)
            return
        parsed = parse(pattern)
        validate_pipeline(c, pattern)
        if parsed.mtp and c.position_embedding_type not in ("rope", "none"):
            raise ConfigError(f"Multi-Token Prediction (MTP) is not supported with {c.position_embedding_type} "
                              "position embedding type.The supported position embedding types are rope and none.")
        kinds = set(parsed.layers) | set(parsed.mtp or "")
        self._validate_kinds(c, kinds)
        if DS_ATTENTION in kinds and self.dsa_indexer_topk_freq > 1:
            validate_topk_sharing(c, pattern, self.dsa_indexer_topk_freq, self.dsa_indexer_skip_topk_offset)

    def check_derived(self, config) -> None:
        """ConfigError where `config` disagrees with what Megatron derives from the pattern (`pattern_derived`, which
        `TrainingConfig.from_mapping` applies): its layer count, its MTP depths, multi-latent attention for `D`/`+`."""
        c = config
        layout = c.layout
        mtp_layers = layout.mtp_num_layers if layout is not None else None
        pattern = self.pattern(c.num_layers, mtp_layers)
        if pattern is None:
            return
        parsed = parse(pattern)
        if len(parsed.layers) != c.num_layers:
            raise ConfigError(f"num_layers {c.num_layers} is not the {len(parsed.layers)} layers of the hybrid layer "
                              f"pattern {pattern!r} (Megatron takes the pattern's count)")
        if (mtp_layers or 0) != parsed.mtp_depths:
            raise ConfigError(f"mtp_num_layers {mtp_layers or 0} with the hybrid layer pattern {pattern!r}: a hybrid "
                              "model's MTP layers are its pattern's `/` depths (or --mtp-hybrid-override-pattern "
                              "repeated --mtp-num-layers times)")
        if (DS_ATTENTION in pattern or MLA in pattern) and not (c.attn is not None and c.attn.multi_latent_attention):
            raise ConfigError(f"the hybrid layer pattern {pattern!r} has `D`/`+` layers: they are multi-latent "
                              "attention, which needs multi_latent_attention and its sizes")

    def _validate_kinds(self, c, kinds: set[str]) -> None:
        tp, cp = c.tp, c.cp
        lowp = c.recipe.low_precision
        if MAMBA in kinds:
            m = self.mamba(c.hidden_size)
            if lowp and m.in_proj_dim % 16:
                raise ConfigError("For FP8, the innermost dimension of the Mamba layer input projection output tensor "
                                  f"must be a multiple of 16 (2·d_inner + 2·groups·state + heads = {m.in_proj_dim}).")
            m.check_split(tp, cp)
        if GDN in kinds:
            g = self.gdn(c.hidden_size)
            g.check_split(tp, cp)
            align = 32 if c.precision == "mxfp8" else 16
            if lowp and g.in_proj_dim % align:
                raise ConfigError("For FP8, the innermost dimension of the GDN layer input projection output tensor "
                                  f"must be a multiple of 16 ({g.in_proj_dim}, alignment {align}).")
        if DS_ATTENTION in kinds:
            if c.add_bias_linear:
                raise ConfigError("DSA uses AbsorbedMLASelfAttention, which requires add_bias_linear=False. Disable "
                                  "linear bias for DSA configs.")
            if self.dsa_indexer_topk_freq < 1:
                raise ConfigError(f"dsa_indexer_topk_freq must be positive, got {self.dsa_indexer_topk_freq}.")
            if self.dsa_indexer_skip_topk_offset < 0:
                raise ConfigError("dsa_indexer_skip_topk_offset must be non-negative, got "
                                  f"{self.dsa_indexer_skip_topk_offset}.")
            if c.apply_rope_fusion:
                raise ConfigError("RoPE fusion is not supported for DSAttention")
            a = c.attn
            self.dsa(c.hidden_size, a.q_lora_rank if a is not None else None,
                     a.qk_pos_emb_head_dim if a is not None else 64)

    def notes(self, config) -> list[str]:
        """Megatron's warnings for these settings (what it changes and says so): the deprecated spellings, a
        --num-layers the pattern overrides, an --mtp-num-layers the pattern's depths override."""
        out = []
        if self.hybrid_override_pattern is not None:
            out.append("--hybrid-override-pattern is deprecated. Use --hybrid-layer-pattern instead.")
        if self.hybrid_attention_ratio > 0 or self.hybrid_mlp_ratio > 0:
            out.append("hybrid_attention_ratio and hybrid_mlp_ratio have been deprecated. Use hybrid_layer_pattern "
                       "instead.")
        layout = config.layout
        mtp_layers = layout.mtp_num_layers if layout is not None else None
        pattern = self.pattern(config.num_layers, mtp_layers)
        if pattern is None:
            return out
        count = layer_count(pattern)
        stated = self.stated_num_layers if self.stated_num_layers is not None else config.num_layers
        if stated != count:
            out.append(f"--hybrid-layer-pattern is set; ignoring --num-layers ({stated}) and using the "
                       f"layer count derived from the pattern ({count}).")
        depths = parse(pattern).mtp_depths
        if depths and mtp_layers and mtp_layers != depths:
            out.append(f"--mtp-num-layers ({mtp_layers}) conflicts with MTP depth count ({depths}) in pattern "
                       f"'{pattern}'. Using the inferred value ({depths}).")
        return out

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in dataclasses.asdict(self).items() if k in FIELDS}
        if isinstance(data["linear_attention_freq"], tuple):
            data["linear_attention_freq"] = list(data["linear_attention_freq"])
        return data


FIELDS = tuple(f.name for f in dataclasses.fields(HybridSettings) if not f.metadata.get("derived"))
#: Megatron's switches that store False into a setting of another name (a command line's `--disable-x` arrives as
#: `disable_x: True`; a Megatron log's arguments block prints the destination, `use_mamba_mem_eff_path`).
NEGATED = {"disable_mamba_mem_eff_path": "use_mamba_mem_eff_path",
           "disable_dsa_indexer_rotate_activation": "dsa_indexer_rotate_activation",
           "disable_dsa_indexer_scoring_relu": "dsa_indexer_scoring_relu"}


def stated(settings: dict[str, Any]) -> bool:
    """Whether a configuration asks for a hybrid model or a linear/sparse attention variant (then the section
    exists): a pattern, the ratios, or `experimental_attention_variant`. The Mamba/GDN/DSA sizes alone change
    nothing in a GPT model."""
    keys = ("hybrid_layer_pattern", "hybrid_override_pattern", "experimental_attention_variant")
    return any(settings.get(k) not in (None, "", False) for k in keys) or \
        any(float(settings.get(k) or 0) > 0 for k in ("hybrid_attention_ratio", "hybrid_mlp_ratio"))


# -- what a pattern sets in the rest of the configuration -----------------------------------------------------------
def latent_attention(settings: dict[str, Any]) -> bool:
    """Whether the stated hybrid settings' patterns have `D` or `+` layers: multi-latent attention (Megatron turns it
    on for them), with the MLA sizes the configuration states."""
    keys = ("hybrid_layer_pattern", "hybrid_override_pattern", "mtp_hybrid_override_pattern")
    return any(symbol in str(settings.get(k) or "") for k in keys for symbol in (DS_ATTENTION, MLA))


def pattern_derived(settings: HybridSettings, num_layers: int, pp: int, mtp_num_layers: int | None
                    ) -> dict[str, Any]:
    """What Megatron derives from the layer pattern, for TrainingConfig: `num_layers` (the pattern's count),
    `vp` (its segments over pp), `mtp_num_layers` (its `/` depths, 0 without); {} for a GPT model (no pattern)."""
    pattern = settings.pattern(num_layers, mtp_num_layers)
    if pattern is None:
        return {}
    parsed = parse(pattern)
    if mtp_num_layers and not parsed.mtp_depths:
        raise ConfigError(f"mtp_num_layers {mtp_num_layers} with the hybrid layer pattern {pattern!r}: a hybrid "
                          "model's MTP layers are its pattern's `/` depths (or --mtp-hybrid-override-pattern "
                          "repeated --mtp-num-layers times)")
    return {"num_layers": len(parsed.layers), "vp": pattern_vp(pattern, pp), "mtp_num_layers": parsed.mtp_depths}


#: `--spec MODULE NAME` values whose layers tracekit prices: Megatron's hybrid stack (`hybrid_stack_spec`; the
#: `mamba` module and the `mamba_stack_spec` name re-export it), which a hybrid layer pattern builds anyway.
KNOWN_SPECS = frozenset((module, name) for module in ("megatron.core.models.hybrid.hybrid_layer_specs",
                                                       "megatron.core.models.mamba.mamba_layer_specs")
                        for name in ("hybrid_stack_spec", "mamba_stack_spec"))


def check_spec(spec: Any, settings: HybridSettings | None) -> None:
    """ConfigError unless `--spec` (its words; None: not given) names a layer spec tracekit prices, with the layer
    pattern that builds it: any other spec builds layers tracekit does not know (Gated Delta Product's, inference's,
    a user's module), which it refuses rather than price them as a transformer."""
    if spec in (None, "", [], ()):
        return
    words = tuple(str(w).strip("'\"") for w in (spec if isinstance(spec, (list, tuple)) else str(spec).split()))
    text = " ".join(words)
    if tuple(words) not in KNOWN_SPECS:
        known = "; ".join(sorted(" ".join(k) for k in KNOWN_SPECS))
        raise ConfigError(f"--spec {text}: tracekit prices the layers of Megatron's GPT layers and of its hybrid "
                          f"stack only (known specs: {known}); other specs are not modelled")
    if settings is None or settings.pattern(1) is None:
        raise ConfigError(f"--spec {text} builds Megatron's hybrid stack, which needs --hybrid-layer-pattern")


def apply_pattern(values: dict[str, Any]) -> None:
    """What a hybrid layer pattern sets, as Megatron derives it (tracekit.core.hybrid.pattern_derived): the layer
    count (the stated one kept for Megatron's warning), virtual pipeline stages from its `|` segments, MTP layers
    from its `/` depths."""
    hybrid, layout = values["hybrid"], values.get("layout")
    stated = int(float(values["num_layers"]))
    derived = pattern_derived(hybrid, stated, int(float(values.get("pipeline_model_parallel_size",
                                                                                    1) or 1)),
                                              layout.mtp_num_layers if layout is not None else None)
    if not derived:
        return
    values["num_layers"] = derived["num_layers"]
    values["hybrid"] = dataclasses.replace(hybrid, stated_num_layers=stated)
    if derived["vp"] > 1 and not values.get("virtual_pipeline_model_parallel_size"):
        values["virtual_pipeline_model_parallel_size"] = derived["vp"]
    if derived["mtp_num_layers"]:
        values["layout"] = dataclasses.replace(layout or LayoutSettings(), mtp_num_layers=derived["mtp_num_layers"])
