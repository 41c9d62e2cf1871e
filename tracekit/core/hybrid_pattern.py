"""The layer pattern of a Megatron-core hybrid model as Megatron reads it (the vendored snapshot's
`megatron/core/models/hybrid/hybrid_layer_allocation.py`), with the rules and the error messages Megatron applies to
it; the settings that go with it are `tracekit.core.hybrid`'s.

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
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .moe import layer_freq
from .uneven_stages import uneven_stage_counts

MAMBA, GDN, ATTENTION, DS_ATTENTION, MLA, MLP, MOE = "M", "G", "*", "D", "+", "-", "E"
PIPE, MTP_SEPARATOR = "|", "/"
#: Layer symbols in the order Megatron sorts them (by their attribute names: ATTENTION, DS_ATTENTION, GDN, MAMBA,
#: MLA, MLP, MOE), each with the layer kind tracekit calls it.
KINDS = {ATTENTION: "attention", DS_ATTENTION: "dsa", GDN: "gdn", MAMBA: "mamba", MLA: "mla", MLP: "mlp", MOE: "moe"}
SYMBOLS = tuple(KINDS)


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
            counts, middle, middle_stages = uneven_stage_counts(n, pp, first, last)
            if middle < 0:
                raise ConfigError(f"first/last pipeline stage layers ({first}, {last}) exceed the pattern's {n} "
                                  "layers")
            if middle_stages > 0 and middle % middle_stages:
                raise ConfigError(f"Middle layers ({middle}) must be evenly divisible by middle pipeline stages "
                                  f"({middle_stages}).")
            if sum(counts) != n:
                raise ConfigError(f"first/last pipeline stage layers ({first}, {last}) leave {middle} "
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


def pipe_split(pattern: str, stages: int, weights: list[float], tail: float = 0.0, topk_freq: int = 1,
               skip_topk_offset: int = 0) -> str:
    """`pattern` with its main layers placed on `stages` pipeline segments by `|` (pipes it had are replaced;
    its MTP part kept): contiguous, none empty, the heaviest segment as light as it can be, the last one also
    carrying `tail` (the output layer, loss and MTP layers); `weights` one per main layer. A segment never starts
    on a DSA layer that reuses an earlier layer's top-k (every `topk_freq`-th from `skip_topk_offset` on: Megatron
    refuses that split). ConfigError when no split
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
    if DS_ATTENTION in layers and topk_freq > 1:
        for i, symbol in enumerate(layers):
            starts_ok[i] = not (symbol == DS_ATTENTION and dsa_reuses_topk(
                i + 1, skip_topk_offset, topk_freq))
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


def validate_pipeline(c, pattern: str) -> None:
    """ConfigError naming the first of Megatron's pipeline arguments that a pattern rules out (`c`: a
    TrainingConfig)."""
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


def validate_topk_sharing(c, pattern: str, freq: int, offset: int) -> None:
    """Megatron's `_validate_dsa_index_share_pipeline_split`: a layer reusing top-k indices needs its source
    layer earlier on the same stage (layer numbers count every layer of the pattern, from 1)."""
    parsed = parse(pattern)
    layout = c.layout
    stages = stage_layers(pattern, c.pp, layout.decoder_first_pipeline_num_layers if layout else None,
                          layout.decoder_last_pipeline_num_layers if layout else None)
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
