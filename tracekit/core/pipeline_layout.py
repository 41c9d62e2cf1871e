"""Which layers each pipeline stage holds, as Megatron-core places them (`get_num_layers_to_build`,
`PipelineParallelLayerLayout` in the vendored snapshot), by Megatron's argument names.

Rules, in Megatron's order of precedence:
- `pipeline_model_parallel_layout` (`Et|(tt|)*6mL`): one `|`-separated group per virtual stage, listed virtual stage
  by virtual stage (the i-th group is pipeline rank i mod pp, model chunk i // pp); `E` embedding, `t` a decoder
  layer, `m` a multi-token-prediction layer, `L` the loss (and LM head); `(…)*n` and `x*n` repeat; commas are
  cosmetic. It sets vp = groups / pp. Exactly one E (first) and one L (last); decoder layers = num_layers; MTP
  layers = mtp_num_layers, after every decoder layer.
- `decoder_first_pipeline_num_layers` / `decoder_last_pipeline_num_layers`: the first / last rank hold that many
  layers; the others share the rest evenly (it must divide); each rank's layers split evenly over its chunks.
- otherwise num_layers (+1 with `account_for_embedding_in_pipeline_split`, +1 with
  `account_for_loss_in_pipeline_split`) must divide by pp, and each rank's share by vp; the embedding (loss) then
  takes a layer's place in the first (last) virtual stage.
Without a layout, the embedding is on the first chunk of rank 0, the LM head and loss on the last chunk of the last
rank, and MTP layers (`mtp_num_layers`) beside the loss.

The interleaved schedule (Megatron-core) runs micro-batches in groups of `microbatch_group_size_per_vp_stage`
(default pp) per model chunk: pp ≤ group ≤ micro-batches, and the last group holds 0 or ≥ pp micro-batches.

`torch_pipeline_schedule` (tracekit's setting; None: Megatron's 1F1B / interleaved order) names one of PyTorch's
`torch.distributed.pipelining` schedules that torchtitan runs and Megatron does not (predictor.schedule.zero_bubble):
LoopedBFS, InterleavedZeroBubble (loop placement: virtual stage i on rank i mod pp), ZBVZeroBubble and DualPipeV
(V placement, exactly two stages per rank: rank r holds stages r and 2·pp−1−r), with PyTorch's own limits on the
micro-batch count instead of Megatron's groups.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tracekit.core import hybrid_pattern
from tracekit.core.errors import ConfigError, did_you_mean
from tracekit.core.uneven_stages import uneven_stage_counts

#: PyTorch's pipeline schedules tracekit simulates beside Megatron's (predictor.schedule.zero_bubble).
ZERO_BUBBLE = ("LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
#: Those that place two stages per rank in a V (rank r: stages r and 2·pp−1−r).
V_SHAPED = ("ZBVZeroBubble", "DualPipeV")
#: Those that split the backward into an input part and a weight part (the others' backward is whole).
SPLIT_BACKWARD = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")


@dataclass(frozen=True)
class Chunk:
    """One model chunk (virtual stage) of one pipeline rank."""

    layers: tuple[int, ...]  # global decoder-layer indices, in order
    embedding: bool = False
    loss: bool = False  # LM head and cross-entropy
    mtp: int = 0  # multi-token-prediction layers

    @property
    def num_layers(self) -> int:
        return len(self.layers)


@dataclass(frozen=True)
class LayoutSettings:
    pipeline_model_parallel_layout: str | None = None
    decoder_first_pipeline_num_layers: int | None = None
    decoder_last_pipeline_num_layers: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    mtp_num_layers: int | None = None
    microbatch_group_size_per_vp_stage: int | None = None
    torch_pipeline_schedule: str | None = None  # one of ZERO_BUBBLE; None: Megatron's order

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIELDS = tuple(f.name for f in dataclasses.fields(LayoutSettings))


def parse_layout(text: str) -> list[str]:
    """A layout string → its virtual stages, each a string of E/t/m/L (Megatron's unrolling rules)."""
    flat = str(text).strip().strip("'\"").replace(",", "").replace("\\", "")  # shell escapes of | ( ) are cosmetic
    previous = None
    while previous != flat:  # innermost parentheses first, then single characters
        previous = flat
        flat = re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), flat)
    flat = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), flat)
    stages = flat.split("|")
    bad = sorted({ch for ch in flat if ch not in "EtmL|"})
    if bad:
        raise ConfigError(f"pipeline_model_parallel_layout {text!r}: unknown layer character(s) {bad} "
                          "(E embedding, t decoder layer, m MTP layer, L loss)")
    return stages


def layout_vp(text: str, pp: int) -> int:
    stages = parse_layout(text)
    if len(stages) % pp:
        raise ConfigError(f"pipeline_model_parallel_layout has {len(stages)} stages, not divisible by pp {pp}")
    return len(stages) // pp


def chunks(config) -> tuple[tuple[Chunk, ...], ...]:
    """[pipeline rank][model chunk] → Chunk, for a TrainingConfig; ConfigError where Megatron refuses the split.
    Cached per (pp, vp, layers, layout settings): a search asks for the same few splits again and again. A hybrid
    model's layers are placed by its pattern (`_hybrid_chunks`)."""
    layout = config.layout or LayoutSettings()
    settings = getattr(config, "hybrid", None)
    pattern = settings.pattern(config.num_layers, layout.mtp_num_layers) if settings is not None else None
    if pattern is not None:
        return _hybrid_chunks(pattern, config.pp, layout.decoder_first_pipeline_num_layers,
                              layout.decoder_last_pipeline_num_layers)
    return _chunks(config.pp, config.vp, config.num_layers, layout)


@lru_cache(maxsize=1024)
def _hybrid_chunks(pattern: str, pp: int, first: int | None, last: int | None) -> tuple[tuple[Chunk, ...], ...]:
    """A hybrid pattern's chunks as Megatron places them (tracekit.core.hybrid.stage_layers: `|` segment i on rank
    i mod pp, chunk i // pp; without pipes an even split, or the stated first/last stage layers): the embedding on
    the first chunk of rank 0, the loss and the pattern's MTP depths on the last chunk of the last rank."""
    stages = hybrid_pattern.stage_layers(pattern, pp, first, last)
    depths = hybrid_pattern.parse(pattern).mtp_depths
    vp = len(stages[0])
    return tuple(tuple(Chunk(layers, embedding=(r == 0 and k == 0), loss=(r == pp - 1 and k == vp - 1),
                             mtp=depths if (r == pp - 1 and k == vp - 1) else 0)
                       for k, layers in enumerate(row)) for r, row in enumerate(stages))


@lru_cache(maxsize=4096)
def _chunks(pp: int, vp: int, n: int, s: LayoutSettings) -> tuple[tuple[Chunk, ...], ...]:
    return tuple(tuple(row) for row in _split(pp, vp, n, s))


def _split(pp: int, vp: int, n: int, s: LayoutSettings) -> list[list[Chunk]]:
    mtp = s.mtp_num_layers or 0
    if s.pipeline_model_parallel_layout:
        return _from_layout(s.pipeline_model_parallel_layout, pp, n, mtp)
    first, last = s.decoder_first_pipeline_num_layers, s.decoder_last_pipeline_num_layers
    if first is not None or last is not None:
        if s.account_for_embedding_in_pipeline_split or s.account_for_loss_in_pipeline_split:
            raise ConfigError("uneven first/last pipeline stages cannot be combined with "
                              "account_for_embedding/loss_in_pipeline_split (Megatron refuses it)")
        for value in (first, last):
            if value is not None and value < 0:
                raise ConfigError(f"uneven pipeline stage layer counts must be ≥ 0, got {value}")
        per_rank, rest, stages_left = uneven_stage_counts(n, pp, first, last)
        if stages_left < 0 or rest < 0:
            raise ConfigError(f"decoder first/last pipeline layers ({first}, {last}) exceed num_layers {n} "
                              f"over pp {pp}")
        if stages_left > 0 and rest % stages_left:
            raise ConfigError(f"with uneven pipeline stages the {rest} remaining layers must divide by the "
                              f"{stages_left} middle stages")
        if sum(per_rank) != n:
            raise ConfigError(f"uneven pipeline stages hold {sum(per_rank)} layers, the model has {n}")
        for rank, count in enumerate(per_rank):
            if count % vp:
                raise ConfigError(f"pipeline rank {rank} holds {count} layers, not divisible by vp {vp}")
        return _assign([[count // vp] * vp for count in per_rank], pp, vp, mtp)
    total = n + s.account_for_embedding_in_pipeline_split + s.account_for_loss_in_pipeline_split
    hint = ("; Megatron needs a layout for it: pipeline_model_parallel_layout (e.g. 'Et*4|...|tmL') or "
            "decoder_first/last_pipeline_num_layers")
    if total % pp:
        raise ConfigError(f"num_layers {n}{' (+1 embedding)' if s.account_for_embedding_in_pipeline_split else ''}"
                          f"{' (+1 loss)' if s.account_for_loss_in_pipeline_split else ''} is not divisible by pp "
                          f"{pp}{hint}")
    rank_layers = total // pp
    if rank_layers % vp:
        raise ConfigError((f"num_layers {n} is not divisible by pp·vp = {pp}·{vp}" if total == n else
                           f"{rank_layers} layers per pipeline rank are not divisible by vp {vp}") + hint)
    counts = [[rank_layers // vp] * vp for _ in range(pp)]
    if s.account_for_embedding_in_pipeline_split:
        counts[0][0] -= 1
    if s.account_for_loss_in_pipeline_split:
        counts[-1][-1] -= 1
    if min(min(row) for row in counts) < 0:
        raise ConfigError("not enough layers in the first/last virtual stage for the embedding/loss")
    return _assign(counts, pp, vp, mtp)


def _assign(counts: list[list[int]], pp: int, vp: int, mtp: int) -> list[list[Chunk]]:
    """Layer indices in Megatron's order (virtual stage by virtual stage, rank by rank)."""
    out = [[Chunk(())] * vp for _ in range(pp)]
    start = 0
    for k in range(vp):
        for r in range(pp):
            count = counts[r][k]
            out[r][k] = Chunk(tuple(range(start, start + count)), embedding=(r == 0 and k == 0),
                              loss=(r == pp - 1 and k == vp - 1), mtp=mtp if (r == pp - 1 and k == vp - 1) else 0)
            start += count
    return out


def _from_layout(text: str, pp: int, num_layers: int, mtp_layers: int) -> list[list[Chunk]]:
    stages = parse_layout(text)
    if len(stages) % pp:
        raise ConfigError(f"pipeline_model_parallel_layout has {len(stages)} stages, not divisible by pp {pp}")
    flat = "".join(stages)
    if not flat.startswith("E") or not flat.endswith("L") or flat.count("E") != 1 or flat.count("L") != 1:
        raise ConfigError(f"pipeline_model_parallel_layout {text!r} must start with one E and end with one L")
    if flat.count("t") != num_layers:
        raise ConfigError(f"pipeline_model_parallel_layout {text!r} has {flat.count('t')} decoder layers, the model "
                          f"has {num_layers}")
    if flat.count("m") != mtp_layers:
        raise ConfigError(f"pipeline_model_parallel_layout {text!r} has {flat.count('m')} MTP layers, "
                          f"mtp_num_layers is {mtp_layers}")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        raise ConfigError("pipeline_model_parallel_layout: decoder layers must come before MTP layers")
    vp = len(stages) // pp
    out = [[Chunk(())] * vp for _ in range(pp)]
    start = 0
    for i, stage in enumerate(stages):
        rank, chunk = i % pp, i // pp
        count = stage.count("t")
        out[rank][chunk] = Chunk(tuple(range(start, start + count)), "E" in stage, "L" in stage, stage.count("m"))
        start += count
    return out


def check_microbatch_groups(config) -> None:
    """ConfigError unless the interleaved schedule accepts the micro-batch count (module docstring)."""
    c = config
    schedule = torch_schedule(c)
    if schedule is not None:
        check_schedule(schedule, c.pp, c.vp, c.num_microbatches)
        return
    if c.vp <= 1:
        return
    m = c.num_microbatches
    group = c.microbatch_group
    if not c.pp <= group <= m:
        raise ConfigError(f"the interleaved schedule runs micro-batches in groups of {group} per model chunk, "
                          f"which must lie between pp {c.pp} and the {m} micro-batches")
    rest = m % group
    if 0 < rest < c.pp:
        raise ConfigError(f"the interleaved schedule's last group of micro-batches holds {rest} (of {m} in groups "
                          f"of {group}): Megatron needs 0 or at least pp {c.pp}")


def torch_schedule(config) -> str | None:
    """The PyTorch schedule a configuration runs (`torch_pipeline_schedule`), None for Megatron's orders and without
    a pipeline (torchtitan reads the schedule only when it pipelines: pp > 1)."""
    schedule = config.layout.torch_pipeline_schedule if config.layout else None
    return schedule if config.pp > 1 else None


def check_schedule(schedule: str, pp: int, vp: int, m: int) -> None:
    """ConfigError unless PyTorch runs `schedule` with pp ranks, vp stages per rank and m micro-batches (its own
    checks: two stages per rank in a V; DualPipeV at least as many micro-batches as stages; the interleaved zero-bubble
    schedule's micro-batches a multiple of its rounds, max(1, m // pp))."""
    if schedule not in ZERO_BUBBLE:
        raise ConfigError(f"torch_pipeline_schedule {schedule!r}{did_you_mean(schedule, ZERO_BUBBLE)}: tracekit "
                          f"simulates {', '.join(ZERO_BUBBLE)} (or Megatron's 1F1B / interleaved order without it)")
    if pp < 2:
        raise ConfigError(f"pipeline schedule {schedule} needs pp ≥ 2")
    if schedule in V_SHAPED and vp != 2:
        raise ConfigError(f"pipeline schedule {schedule} places exactly two stages per rank (a V), not {vp}")
    if schedule == "DualPipeV" and m < 2 * pp:
        raise ConfigError(f"pipeline schedule DualPipeV needs at least as many micro-batches as stages ({2 * pp}), "
                          f"not {m}")
    rounds = max(1, m // pp)
    if schedule == "InterleavedZeroBubble" and m % rounds:
        raise ConfigError(f"pipeline schedule InterleavedZeroBubble needs the {m} micro-batches to be a multiple of "
                          f"its rounds ({rounds} = max(1, micro-batches // pp))")


def filled_layout(num_layers: int, stages: int, mtp: int = 0) -> str:
    """A layout for a layer count the virtual stages do not divide: ⌈layers / stages⌉ decoder layers on every stage
    but the last, which takes the rest with the MTP layers and the loss (Megatron-Bridge's DeepSeek-V3 layouts follow
    this rule: 61 layers over 16 stages are 4 × 15 + 1, over 8 stages 8 × 7 + 5). When that leaves the last stage
    nothing, the first stage (with the embedding) takes one layer fewer and the last what remains (none: only the MTP
    layers and the loss), as Bridge's DeepSeek-V3 performance scripts lay 61 layers over 8 × 4 stages (`Et|(tt|)*30mL`,
    `scripts/performance/configs/deepseek/`: every H100 configuration read); when even that does not fit, the layers
    are spread as evenly as they go, the first and last stages (embedding, loss) taking the lighter share."""
    if num_layers < stages - 1:
        raise ConfigError(f"{num_layers} layers cannot fill {stages} pipeline stages")
    per = -(-num_layers // stages)
    rest = num_layers - per * (stages - 1)
    if rest >= 1:
        counts = [per] * (stages - 1) + [rest]
    elif stages > 2 and per > 1 and num_layers - (per - 1) - per * (stages - 2) >= 0:
        counts = [per - 1] + [per] * (stages - 2) + [num_layers - (per - 1) - per * (stages - 2)]
    else:
        low, extra = divmod(num_layers, stages)
        heavy = set(range(1, 1 + min(extra, stages - 2))) | set(range(stages - 1, stages - 1 - max(0, extra - (
            stages - 2)), -1))
        counts = [low + (i in heavy) for i in range(stages)]
    parts = ["t" * n for n in counts[:-1]] + ["t" * counts[-1] + "m" * mtp + "L"]
    parts[0] = "E" + parts[0]
    return "|".join(parts)
