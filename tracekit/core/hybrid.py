"""Hybrid models of Megatron-core (the vendored snapshot's `megatron/core/models/hybrid/`, `megatron/core/ssm/`,
`megatron/core/transformer/experimental_attention_variant/`), by Megatron's argument names, with the rules and the
error messages Megatron applies to them. `predictor.layers` prices the layers.

Design note
-----------
- **Layer pattern** (`--hybrid-layer-pattern`; `--hybrid-override-pattern` is its deprecated spelling, both at once
  refused): one symbol per layer — `M` Mamba2, `G` Gated DeltaNet, `*` attention, `D` DeepSeek sparse attention (MLA
  with an indexer), `+` MLA, `-` MLP, `E` MoE — and `|` between pipeline segments, `/` before each MTP depth's
  pattern (`M*M*/MM/MM`: two depths of `MM`; every depth must be identical). A hybrid "layer" is one symbol: a GPT
  layer is two (`*-`), so `--num-layers` is the pattern's length (Megatron overrides a different value, with a
  warning). `*` beside `D` or `+` in one pattern is refused; `D` or `+` turns multi-latent attention on, `D` selects
  the `dsa` attention variant.
- **Pipeline segments**: with pipes, segment i is pipeline rank i mod pp, model chunk i // pp (vp = segments / pp,
  segments must divide by pp); without pipes and pp > 1 (deprecated) the layers split evenly over the ranks, or by
  `decoder_first/last_pipeline_num_layers`, never interleaved. MTP layers sit on the last stage. Megatron refuses
  `--num-layers-per-virtual-pipeline-stage`, `--num-virtual-stages-per-pipeline-rank`,
  `--pipeline-model-parallel-layout` and the embedding/loss accounting with a pattern, first/last stage layers with
  pipes.
- **Ratio allocation** (`pattern_from_ratios`, Megatron's `hybrid_attention_ratio` / `hybrid_mlp_ratio` of
  `HybridModelConfig`, deprecated, not flags of this snapshot's parser): attention layers evenly spaced among Mamba
  layers, then MLP layers evenly spaced over the remaining Mamba layers (an error-diffusion walk, reproduced below).
- **GPT models with a linear-attention variant** (`--experimental-attention-variant gdn|gdn2|dsa`): per layer,
  `--linear-attention-freq` N makes layer i (0-based) linear attention unless (i + 1) % N == 0, a 0/1 list names
  them (1: linear); `dsa` makes every layer DSA. `gpt_pattern` writes such a model as the equivalent hybrid pattern.
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
from .moe import layer_freq

MAMBA, GDN, ATTENTION, DS_ATTENTION, MLA, MLP, MOE = "M", "G", "*", "D", "+", "-", "E"
PIPE, MTP_SEPARATOR = "|", "/"
#: Layer symbols in the order Megatron sorts them (by their attribute names: ATTENTION, DS_ATTENTION, GDN, MAMBA,
#: MLA, MLP, MOE), each with the layer kind tracekit calls it.
KINDS = {ATTENTION: "attention", DS_ATTENTION: "dsa", GDN: "gdn", MAMBA: "mamba", MLA: "mla", MLP: "mlp", MOE: "moe"}
SYMBOLS = tuple(KINDS)
#: MambaMixer's arguments as `hybrid_stack_spec` leaves them (no flag sets them in this snapshot).
MAMBA_D_CONV, MAMBA_EXPAND, MAMBA_CHUNK_SIZE = 4, 2, 128
#: The chunk of FLA's chunked gated delta rule (GatedDeltaNet.chunk_size).
GDN_CHUNK_SIZE = 64
VARIANTS = ("gdn", "gdn2", "dsa")
DSA_BACKENDS = ("none", "tilelang", "cudnn")
SSM_STATE_DTYPES = ("fp32", "bf16")


# -- the pattern as Megatron parses it ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParsedPattern:
    """Megatron's `ParsedHybridPattern`: the main pattern (with its pipes), the MTP pattern and its depth count."""

    main: str | None
    mtp: str | None
    mtp_depths: int

    @property
    def layers(self) -> str:
        """The main decoder layers, pipes removed."""
        return (self.main or "").replace(PIPE, "")

    @property
    def segments(self) -> tuple[str, ...]:
        """The pipe-separated segments of the main pattern (one empty segment for an empty pattern)."""
        return tuple((self.main or "").split(PIPE))


def _symbols_text(allow_pipe: bool) -> str:
    """Megatron prints the valid symbols as a Python set (in hash order); here in its sorted order."""
    return "{" + ", ".join(repr(s) for s in SYMBOLS + ((PIPE,) if allow_pipe else ())) + "}"


def _validate(pattern: str, name: str, allow_pipe: bool) -> None:
    """Megatron's `_validate_pattern`: valid symbols only, no `*` beside `D` or `+`."""
    valid = set(SYMBOLS) | ({PIPE} if allow_pipe else set())
    for char in pattern:
        if char not in valid:
            raise ConfigError(f"hybrid_layer_pattern: In {name} pattern, {char!r} is not a valid layer symbol. "
                              f"Valid symbols are: {_symbols_text(allow_pipe)}")
    if ATTENTION in pattern and (DS_ATTENTION in pattern or MLA in pattern):
        raise ConfigError("hybrid_layer_pattern: Not supported to have both Attention and MLA/DSA in one model")


def parse(pattern: str | None) -> ParsedPattern:
    """A unified pattern `<main>/<mtp>/<mtp>...` as Megatron's `parse_hybrid_pattern` reads it (ConfigError with
    Megatron's reason where it refuses it)."""
    if pattern is None:
        return ParsedPattern(None, None, 0)
    parts = str(pattern).split(MTP_SEPARATOR)
    main = parts[0]
    if len(parts) == 1:
        _validate(main, "main", True)
        return ParsedPattern(main, None, 0)
    if main:
        _validate(main, "main", True)
    depths = parts[1:]
    if all(p == "" for p in depths):
        return ParsedPattern(main or None, None, 0)
    mtp = depths[0]
    for i, part in enumerate(depths[1:], start=2):
        if part != mtp:
            raise ConfigError(f"hybrid_layer_pattern: All MTP patterns must be identical. Pattern 1 is '{mtp}', but "
                              f"pattern {i} is '{part}'. Full pattern: '{pattern}'")
    _validate(mtp, "MTP", False)
    return ParsedPattern(main or None, mtp, len(depths))


def layer_count(pattern: str) -> int:
    """Main decoder layers (Megatron's `get_hybrid_total_layer_count`): what `--num-layers` becomes."""
    return len(parse(pattern).layers)


def segment_count(pattern: str) -> int:
    """Pipeline segments of the main pattern (pipes + 1)."""
    return str(pattern).split(MTP_SEPARATOR)[0].count(PIPE) + 1


def layer_counts(pattern: str) -> dict[str, int]:
    """Layers per symbol, main and MTP (each MTP layer once per depth), as `get_hybrid_layer_counts`."""
    parsed = parse(pattern)
    counts = {s: parsed.layers.count(s) for s in SYMBOLS}
    if parsed.mtp:
        for s in SYMBOLS:
            counts[s] += parsed.mtp.count(s) * parsed.mtp_depths
    return counts


def pattern_from_ratios(num_layers: int, attention_ratio: float = 0.0, mlp_ratio: float = 0.0) -> str:
    """Megatron's deprecated ratio allocation: round(L·attention_ratio) attention layers spread evenly between Mamba
    layers (the pattern starts and ends with Mamba where it can), then round(L·mlp_ratio) MLP layers spread over the
    Mamba layers left. Each spread walks the layers with a running remainder `x` (starting at one section's length),
    placing a layer where x < 0.5 and otherwise spending one on x."""
    if num_layers <= 0:
        raise ConfigError(f"hybrid layer ratios need num_layers > 0, got {num_layers}")
    for name, ratio in (("hybrid_attention_ratio", attention_ratio), ("hybrid_mlp_ratio", mlp_ratio)):
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"{name} must be between 0 and 1, got {ratio}")
    if attention_ratio + mlp_ratio > 1.0:
        raise ConfigError(f"hybrid_attention_ratio + hybrid_mlp_ratio must be ≤ 1, got {attention_ratio + mlp_ratio}")
    attention = round(num_layers * attention_ratio)
    mamba = num_layers - attention
    section = mamba / (attention + 1)
    kinds = [MAMBA] * num_layers
    x = section
    for i in range(num_layers):
        if x < 0.5:
            kinds[i] = ATTENTION
            x += section
        else:
            x -= 1
    mlp = round(num_layers * mlp_ratio)
    if mlp > 0:
        ratio = (mamba - mlp) / mlp
        x = ratio
        for i in range(num_layers):
            if kinds[i] == MAMBA:
                if x < 0.5:
                    kinds[i] = MLP
                    x += ratio
                else:
                    x -= 1
    return "".join(kinds)


def linear_attention_pattern(freq: Any, num_layers: int) -> tuple[int, ...]:
    """Per GPT layer, 1 for linear attention and 0 for softmax attention (`--linear-attention-freq`: an integer N,
    layer i linear unless (i + 1) % N == 0; or a 0/1 list, e.g. `([1]*3+[0])*12`, as long as the model)."""
    try:
        value = layer_freq(freq)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("moe_layer_freq", "linear_attention_freq")
                          .replace("(dense) and 1 (MoE)", "(softmax attention) and 1 (linear attention)")) from exc
    if isinstance(value, int):
        return tuple(0 if (i + 1) % value == 0 else 1 for i in range(num_layers))
    if len(value) != num_layers:
        raise ConfigError(f"Invalid length of linear_attention_pattern: {len(value)}, expected {num_layers}, "
                          f"current linear attention pattern: {list(value)}")
    return value


def gpt_pattern(num_layers: int, moe_layers: tuple[int, ...] | None = None, linear: tuple[int, ...] | None = None,
                variant: str | None = None, mla: bool = False) -> str:
    """A GPT model as the equivalent hybrid pattern: each decoder layer its attention symbol (`G` where `linear`
    marks it, every layer `D` under the `dsa` variant, `+` with MLA, else `*`) then `E` (MoE, per `moe_layers`) or
    `-`. The two are built of the same modules: a GPT layer's fused input norm and attention is a hybrid attention
    layer, its fused pre-MLP norm and MLP an MLP layer."""
    out = []
    for i in range(num_layers):
        if linear is not None and linear[i]:
            out.append(GDN)
        elif variant == "dsa":
            out.append(DS_ATTENTION)
        else:
            out.append(MLA if mla else ATTENTION)
        out.append(MOE if moe_layers is not None and moe_layers[i] else MLP)
    return "".join(out)


def stage_layers(pattern: str, pp: int, first: int | None = None, last: int | None = None
                 ) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """[pipeline rank][model chunk] → the global indices of its main layers, as Megatron's
    `select_pipeline_segment` gives them (module docstring); ConfigError with Megatron's reason where it refuses."""
    parsed = parse(pattern)
    segments = parsed.segments
    n = len(parsed.layers)
    if len(segments) > 1 and (first is not None or last is not None):
        raise ConfigError("Cannot specify num_layers_in_first_pipeline_stage or num_layers_in_last_pipeline_stage "
                          "when hybrid_layer_pattern contains pipe ('|') separators. The pipeline layout is already "
                          "explicitly defined by the pipe separators.")
    if len(segments) == 1:
        if pp == 1:
            return ((tuple(range(n)),),)
        if first is not None or last is not None:
            lead, tail = first or 0, last or 0
            middle_stages = pp - sum(1 for v in (first, last) if v is not None)
            middle = n - lead - tail
            if middle < 0:
                raise ConfigError(f"first/last pipeline stage layers ({first}, {last}) exceed the pattern's {n} "
                                  "layers")
            if middle_stages > 0 and middle % middle_stages:
                raise ConfigError(f"Middle layers ({middle}) must be evenly divisible by middle pipeline stages "
                                  f"({middle_stages}).")
            per = middle // middle_stages if middle_stages > 0 else 0
            counts = [per] * pp
            if first is not None:
                counts[0] = lead
            if last is not None:
                counts[-1] = tail
            if sum(counts) != n:
                raise ConfigError(f"first/last pipeline stage layers ({first}, {last}) leave {n - lead - tail} "
                                  f"layers for {middle_stages} middle stages of a {n}-layer pattern")
        else:
            if n % pp:
                raise ConfigError(f"Number of layers ({n}) must be evenly divisible by pipeline-model-parallel-size "
                                  f"({pp}) when no pipe separators are specified in the pattern.")
            counts = [n // pp] * pp
        starts = [sum(counts[:r]) for r in range(pp)]
        return tuple((tuple(range(starts[r], starts[r] + counts[r])),) for r in range(pp))
    if len(segments) % pp:
        raise ConfigError("The number of hybrid pipeline segments described by --hybrid-layer-pattern must be evenly "
                          f"divisible by --pipeline-model-parallel-size. Got {len(segments)} segments and {pp} "
                          "pipeline parallel size.")
    vp = len(segments) // pp
    out: list[list[tuple[int, ...]]] = [[() for _ in range(vp)] for _ in range(pp)]
    start = 0
    for i, segment in enumerate(segments):
        out[i % pp][i // pp] = tuple(range(start, start + len(segment)))
        start += len(segment)
    return tuple(tuple(row) for row in out)


def pattern_vp(pattern: str, pp: int) -> int:
    """Virtual pipeline stages Megatron derives from the pattern: segments / pp (1 without pipes)."""
    segments = segment_count(pattern)
    return 1 if segments == 1 else segments // pp


# -- DSA top-k sharing (megatron/core/transformer/experimental_attention_variant/dsa.py) --------------------------
def dsa_reuses_topk(layer_number: int, skip_topk_offset: int, topk_freq: int) -> bool:
    """Whether 1-based layer `layer_number` reuses an earlier layer's top-k (Megatron's `is_dsa_skip_topk_layer`)."""
    offset = max(skip_topk_offset, 1)
    return (max(layer_number - offset, 0) % topk_freq) != 0


def dsa_source_layer(layer_number: int, skip_topk_offset: int, topk_freq: int) -> int:
    """The computing layer whose top-k a reusing layer takes (`source_dsa_compute_layer`)."""
    offset = max(skip_topk_offset, 1)
    if layer_number <= offset:
        return layer_number
    return layer_number - ((layer_number - offset) % topk_freq)


# -- the settings ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MambaShape:
    """A Mamba2 mixer's sizes as `MambaMixer.__init__` derives them (whole layer, before tensor parallelism)."""

    hidden: int
    d_inner: int
    heads: int
    head_dim: int
    state: int
    groups: int
    d_conv: int = MAMBA_D_CONV
    chunk: int = MAMBA_CHUNK_SIZE

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise convolution: x, B and C."""
        return self.d_inner + 2 * self.groups * self.state

    @property
    def in_proj_dim(self) -> int:
        """The in-projection's output: z, x, B, C and dt."""
        return 2 * self.d_inner + 2 * self.groups * self.state + self.heads


@dataclass(frozen=True)
class GDNShape:
    """A Gated DeltaNet layer's sizes (`_GDNBase.__init__`), whole layer."""

    hidden: int
    key_heads: int
    value_heads: int
    key_dim: int  # per head
    value_dim: int  # per head
    conv_kernel: int
    variant: str = "gdn"  # gdn | gdn2
    chunk: int = GDN_CHUNK_SIZE

    @property
    def qk_dim(self) -> int:
        return self.key_heads * self.key_dim

    @property
    def v_dim(self) -> int:
        return self.value_heads * self.value_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.qk_dim + self.v_dim

    @property
    def in_proj_dim(self) -> int:
        """q, k, v, the output gate z, then GDN's β and α per value head, or GDN2's f, b (key width) and w."""
        extra = 2 * self.value_heads if self.variant == "gdn" else 2 * self.qk_dim + self.v_dim
        return 2 * self.qk_dim + 2 * self.v_dim + extra


@dataclass(frozen=True)
class DSAShape:
    """The DSA indexer's sizes (`DSAIndexer.__init__`)."""

    hidden: int
    q_lora_rank: int  # the indexer's query input: MLA's q_lora_rank, or hidden without a query LoRA
    heads: int
    head_dim: int
    topk: int
    rope_dim: int
    topk_freq: int = 1
    skip_topk_offset: int = 0
    loss_coeff: float = 0.0
    sparse_loss: bool = False
    kernel_backend: str = "none"
    rotate: bool = True  # the Hadamard rotation of q and k (--disable-dsa-indexer-rotate-activation: off)
    relu: bool = True  # ReLU on the scores before the heads' weighted sum (--disable-dsa-indexer-scoring-relu: off)
    k_norm_fp32: bool = False  # k's LayerNorm in fp32 (--dsa-indexer-k-norm-fp32)


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
        self._validate_pipeline(c, pattern)
        if parsed.mtp and c.position_embedding_type not in ("rope", "none"):
            raise ConfigError(f"Multi-Token Prediction (MTP) is not supported with {c.position_embedding_type} "
                              "position embedding type.The supported position embedding types are rope and none.")
        kinds = set(parsed.layers) | set(parsed.mtp or "")
        self._validate_kinds(c, kinds)
        if DS_ATTENTION in kinds and self.dsa_indexer_topk_freq > 1:
            self._validate_topk_sharing(c, pattern)

    def pipe_split(self, pattern: str, stages: int, weights: list[float], tail: float = 0.0) -> str:
        """`pattern` with its main layers placed on `stages` pipeline segments by `|` (pipes it had are replaced;
        its MTP part kept): contiguous, none empty, the heaviest segment as light as it can be, the last one also
        carrying `tail` (the output layer, loss and MTP layers); `weights` one per main layer. A segment never starts
        on a DSA layer that reuses an earlier layer's top-k (Megatron refuses that split). ConfigError when no split
        exists (fewer layers than stages)."""
        parsed = parse(pattern)
        layers = parsed.layers
        n = len(layers)
        suffix = "".join(MTP_SEPARATOR + (parsed.mtp or "") for _ in range(parsed.mtp_depths))
        if stages <= 1:
            return layers + suffix
        if n < stages:
            raise ConfigError(f"the pattern's {n} layers cannot fill {stages} pipeline segments")
        if len(weights) != n:
            raise ValueError(f"{len(weights)} weights for {n} layers")
        starts_ok = [True] * n
        if DS_ATTENTION in layers and self.dsa_indexer_topk_freq > 1:
            for i, symbol in enumerate(layers):
                starts_ok[i] = not (symbol == DS_ATTENTION and dsa_reuses_topk(
                    i + 1, self.dsa_indexer_skip_topk_offset, self.dsa_indexer_topk_freq))
        prefix = [0.0]
        for w in weights:
            prefix.append(prefix[-1] + w)
        inf = float("inf")
        # best[k][j]: the least heaviest-segment weight of layers[:j] in k segments; cut[k][j]: where the last starts
        best = [[inf] * (n + 1) for _ in range(stages + 1)]
        cut = [[0] * (n + 1) for _ in range(stages + 1)]
        best[0][0] = 0.0
        for k in range(1, stages + 1):
            for j in range(k, n - (stages - k) + 1):
                extra = tail if k == stages else 0.0
                for i in range(k - 1, j):
                    if best[k - 1][i] == inf or (i > 0 and not starts_ok[i]):
                        continue
                    value = max(best[k - 1][i], prefix[j] - prefix[i] + extra)
                    if value < best[k][j] - 1e-9 * max(1.0, value):
                        best[k][j], cut[k][j] = value, i
        if best[stages][n] == inf:
            raise ConfigError(f"no split of {pattern!r} into {stages} pipeline segments starts every segment on a "
                              "layer that computes its own top-k")
        bounds, j = [], n
        for k in range(stages, 0, -1):
            i = cut[k][j]
            bounds.append((i, j))
            j = i
        return PIPE.join(layers[i:j] for i, j in reversed(bounds)) + suffix

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

    def _validate_pipeline(self, c, pattern: str) -> None:
        layout = c.layout
        pipes = PIPE in pattern.split(MTP_SEPARATOR)[0]
        first = layout.decoder_first_pipeline_num_layers if layout else None
        last = layout.decoder_last_pipeline_num_layers if layout else None
        if pipes and first is not None:
            raise ConfigError("If --hybrid-layer-pattern contains pipe separators, --decoder-first-pipeline-num-layers "
                              "should not be specified as the pipeline layout is explicitly defined.")
        if pipes and last is not None:
            raise ConfigError("If --hybrid-layer-pattern contains pipe separators, --decoder-last-pipeline-num-layers "
                              "should not be specified as the pipeline layout is explicitly defined.")
        if layout is not None and layout.pipeline_model_parallel_layout:
            raise ConfigError("--pipeline-model-parallel-layout should not be used with --hybrid-layer-pattern. "
                              "Pipeline stage layout is defined by | separators in the pattern.")
        for name in ("embedding", "loss"):
            if layout is not None and getattr(layout, f"account_for_{name}_in_pipeline_split"):
                raise ConfigError(f"--account-for-{name}-in-pipeline-split should not be used with "
                                  "--hybrid-layer-pattern. Pipeline stage layout is defined by | separators in the "
                                  "pattern.")
        segments = segment_count(pattern)
        if segments > 1 and segments % c.pp:
            raise ConfigError("The number of hybrid pipeline segments described by --hybrid-layer-pattern must be "
                              f"evenly divisible by --pipeline-model-parallel-size. Got {segments} segments and "
                              f"{c.pp} pipeline parallel size.")
        vp = pattern_vp(pattern, c.pp)
        if c.vp != vp:
            raise ConfigError("--num-virtual-stages-per-pipeline-rank should not be used with --hybrid-layer-pattern. "
                              "Virtual pipeline stages are derived from the number of | segments in the pattern "
                              f"({segments} segments over pp {c.pp}: {vp}, not {c.vp}).")
        stage_layers(pattern, c.pp, first, last)

    def _validate_kinds(self, c, kinds: set[str]) -> None:
        tp, cp = c.tp, c.cp
        lowp = c.recipe.low_precision
        if MAMBA in kinds:
            m = self.mamba(c.hidden_size)
            if lowp and m.in_proj_dim % 16:
                raise ConfigError("For FP8, the innermost dimension of the Mamba layer input projection output tensor "
                                  f"must be a multiple of 16 (2·d_inner + 2·groups·state + heads = {m.in_proj_dim}).")
            if m.heads % tp:
                raise ConfigError(f"nheads must be evenly divisble by tp_size (mamba heads {m.heads}, tp {tp})")
            if m.groups % tp:
                raise ConfigError(f"ngroups must be evenly divisible by tp_size (mamba groups {m.groups}, tp {tp})")
            if m.heads % m.groups:
                raise ConfigError(f"nheads must be evenly divisible by ngroups (mamba heads {m.heads}, groups "
                                  f"{m.groups})")
            if cp > 1:
                heads_t, groups_t = m.heads // tp, m.groups // tp
                if heads_t % cp:
                    raise ConfigError(f"nheads must be evenly divisible by tp_size * cp_size (mamba heads {m.heads}, "
                                      f"tp {tp}, cp {cp})")
                if groups_t < cp and cp % groups_t:
                    raise ConfigError(f"cp_size must be evenly divisible by ngroups/tp_size (cp {cp}, groups/tp "
                                      f"{groups_t})")
                if groups_t >= cp and groups_t % cp:
                    raise ConfigError(f"ngroups must be evenly divisible by tp_size * cp_size (mamba groups "
                                      f"{m.groups}, tp {tp}, cp {cp})")
        if GDN in kinds:
            g = self.gdn(c.hidden_size)
            if g.value_heads % g.key_heads:
                raise ConfigError(f"linear_num_value_heads ({g.value_heads}) must be a multiple of "
                                  f"linear_num_key_heads ({g.key_heads}).")
            for name, heads in (("linear_num_key_heads", g.key_heads), ("linear_num_value_heads", g.value_heads)):
                if heads % (tp * cp):
                    raise ConfigError(f"self.{name}={heads} must be a multiple of "
                                      f"(self.tensor_model_parallel_size={tp} * self.context_parallel_size={cp}).")
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

    def _validate_topk_sharing(self, c, pattern: str) -> None:
        """Megatron's `_validate_dsa_index_share_pipeline_split`: a layer reusing top-k indices needs its source
        layer earlier on the same stage (layer numbers count every layer of the pattern, from 1)."""
        parsed = parse(pattern)
        layout = c.layout
        stages = stage_layers(pattern, c.pp, layout.decoder_first_pipeline_num_layers if layout else None,
                              layout.decoder_last_pipeline_num_layers if layout else None)
        freq, offset = self.dsa_indexer_topk_freq, self.dsa_indexer_skip_topk_offset
        for row in stages:
            for layers in row:
                for position, layer in enumerate(layers):
                    number = layer + 1
                    if parsed.layers[layer] != DS_ATTENTION or not dsa_reuses_topk(number, offset, freq):
                        continue
                    source = dsa_source_layer(number, offset, freq)
                    if source - 1 not in layers[:position]:
                        raise ConfigError(
                            "DSA index-share pipeline split is invalid: local layer "
                            f"{number} reuses top-k indices from computing layer {source}, but that source layer is "
                            "not earlier in this pipeline stage. Cross-layer top-k sharing does not cross PP "
                            "boundaries. Choose a pipeline layout where each stage starts on a computing layer "
                            f"(dsa_indexer_topk_freq={freq}, dsa_indexer_skip_topk_offset={offset}).")

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
