"""Which shapes to time: the operators of a few GPT layer configurations spread over the range users ask about,
not a dense grid (the seed paper's approach). Each configuration point gives the layer's operators with the same
features the predictor's operator graph asks for, so samples and predictions line up.

Points are visited in a fixed shuffled order so that a time budget that runs out still leaves a spread of sizes.
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field, replace

from tracekit.core.samples import DTENSOR_SUFFIX, FSDP2_UNIT, FSDP_COPIES, FSDP_COPY_IN, FUSED_SUFFIX

#: Primitives `tracekit sample` can time.
COMPUTE = ("gemm", "bmm", "attention", "softmax", "norm", "elementwise", "activation", "embedding", "cross_entropy",
           "optimizer", "framework")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
#: The recurrent mixers' kernels (SSD steps, causal convolution, delta rule), timed by tracekit.sampling.ssm
SSM = ("ssd_chunk_cumsum", "ssd_chunk_state", "ssd_state_passing", "ssd_bmm_chunk", "ssd_chunk_scan", "causal_conv1d",
       "gdn_chunk_rule")
SUPPORTED = COMPUTE + SSM + COLLECTIVES
COLLECTIVE_VARIANTS = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
                       "send_recv": "p2p"}


@dataclass(frozen=True)
class Point:
    """One GPT layer configuration on one tensor-parallel rank."""

    hidden: int
    heads: int
    seq: int
    micro_batch: int
    tp: int
    vocab: int

    @property
    def rows(self) -> int:
        return self.seq * self.micro_batch

    @property
    def ffn(self) -> int:
        return 4 * self.hidden


@dataclass(frozen=True)
class Case:
    """One operator shape to time: primitive, variant (source label) and the sample features. `passes` overrides
    features per pass (a gated activation's rows are sized per pass as the predictor sizes them:
    tracekit.sampling.model_cases); `dtype` overrides the run's dtype (an fp8 GEMM); `recipe` (in `extra`) names
    the timing recipe of a case of tracekit.sampling.recipes (cases without one are compute.time_case's)."""

    primitive: str
    variant: str
    features: tuple[tuple[str, float], ...]
    extra: tuple[tuple[str, object], ...] = field(default=())
    passes: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = field(default=())
    dtype: str | None = None

    def feature(self, name: str) -> float:
        return dict(self.features)[name]

    def get(self, name: str, default: object = None):
        return dict(self.extra).get(name, default)

    def features_for(self, pass_: str) -> dict[str, float]:
        """The features stored with this case's row of `pass_`."""
        return {**dict(self.features), **dict(dict(self.passes).get(pass_, ()))}

    @property
    def kind(self) -> tuple[str, str, str]:
        """(primitive, variant family, dtype override): what the budget plan covers once before any second shape
        (tracekit.sampling.plan); an optimizer's stages and layer counts are one family per implementation."""
        return self.primitive, family(self.variant), self.dtype or ""


def family(variant: str) -> str:
    """A variant without the pipeline stage an optimizer step is of (`firstStage_optimizer_fused` → `optimizer_fused`):
    the stages are sizes of one step."""
    for stage in ("firstStage_", "middleStage_", "lastStage_"):
        if variant.startswith(stage):
            return variant[len(stage):]
    return variant


GRIDS = {  # hidden, seq, micro-batch, tp, vocab
    "cpu": ((64, 128, 256, 512), (32, 64, 128), (1, 2, 4), (1, 2), (1024, 8192)),
    "cuda": ((1024, 2048, 4096, 8192), (1024, 2048, 4096), (1, 2, 4), (1, 2, 4, 8), (50304,)),
}
HEAD_DIM = {"cpu": 16, "cuda": 128}
#: The framework overhead is sampled at small layers (hidden × rows up to this), where it is largest against the
#: operators' own time and so measured most precisely; it does not grow with the shape.
FRAMEWORK_MAX_ELEMENTS = 128 * 128
#: The compute operators of one transformer layer pass as the predictor counts them (the framework overhead is per
#: operator): four GEMMs, attention, activation, two norms, two residual/dropout elementwise ops.
LAYER_OPERATORS = {"linear1": 1, "linear2": 1, "linear3": 1, "linear4": 1, "flash_atten": 1, "gelu": 1,
                   "layernorm": 2, "res_add": 2}
#: FSDP2's copies (tracekit.core.samples.FSDP_COPIES) are timed on the parameters of one GPT layer (a unit) of
#: these hidden sizes over two shard ranks: ~12·h² elements, 32 sizes each (a model group of its own needs 30), evenly
#: spread on a log scale from 16 to 1024 on a CPU, from 256 to 8192 on a GPU.
FSDP_COPY_HIDDEN = {"cpu": [round(16 * 2 ** (i * 6 / 31)) for i in range(32)],
                    "cuda": [round(256 * 2 ** (i * 5 / 31)) for i in range(32)]}
FSDP_COPY_RANKS = 2
#: The DTensor (FSDP2) optimizer step is timed on a rank's shards over this many ranks: its `params` are the rank's
#: elements, over as many tensors as the whole stage (on a CPU the step pays per tensor as much as per element).
OPTIMIZER_SHARDS = 2
#: First stages of more layers (a job without pipelining is one stage: a CPU step's per-tensor cost grows with its
#: layers, not only with its elements) are timed too at hidden sizes up to this, where each step takes milliseconds.
DEEP_STAGE_LAYERS, DEEP_STAGE_MAX_HIDDEN = (2, 4), 128
MESSAGE_BYTES = {"cpu": [2 ** e for e in range(10, 25)], "cuda": [2 ** e for e in range(16, 31)]}


def points(device: str, seed: int = 0) -> list[Point]:
    hidden, seq, micro, tp, vocab = GRIDS[device]
    grid = [Point(h, max(1, h // HEAD_DIM[device]), s, b, t, v)
            for h, s, b, t, v in itertools.product(hidden, seq, micro, tp, vocab) if (h // HEAD_DIM[device]) % t == 0]
    random.Random(seed).shuffle(grid)
    return grid


def _case(primitive: str, variant: str, extra: dict | None = None, **features: float) -> Case:
    return Case(primitive, variant, tuple(sorted((k, float(v)) for k, v in features.items())),
                tuple(sorted((extra or {}).items())))


def compute_cases(point: Point, primitives: set[str]) -> list[Case]:
    """The compute operators of one layer (plus embedding, head and optimizer) at `point`."""
    p, t = point, point.tp
    rows, h, f_t, heads_t, d = p.rows, p.hidden, p.ffn // t, p.heads // t, p.hidden // p.heads
    v_t = p.vocab // t
    cases = []
    if "gemm" in primitives:
        for variant, n, k in (("linear1", 3 * h // t, h), ("linear2", h, h // t), ("linear3", f_t, h),
                              ("linear4", h, f_t), ("linear_final", v_t, h)):
            cases.append(_case("gemm", variant, m=rows, n=n, k=k, batch=1))
    if "attention" in primitives:
        cases.append(_case("attention", "flash_atten", batch=p.micro_batch, heads=heads_t, kv_heads=heads_t,
                           seq=p.seq, seq_kv=p.seq, head_dim=d, causal=1))
    if "norm" in primitives:
        cases.append(_case("norm", "layernorm", rows=rows, width=h, numel=rows * h))
    if "elementwise" in primitives:
        cases.append(_case("elementwise", "res_add", rows=rows, width=h, numel=rows * h))
    if "activation" in primitives:
        cases.append(_case("activation", "gelu", rows=rows, width=f_t, numel=rows * f_t))
    if "embedding" in primitives:
        cases.append(_case("embedding", "embedding", rows=rows, width=h, params=v_t, numel=rows * h, tp=t))
    if "cross_entropy" in primitives:
        cases.append(_case("cross_entropy", "parallel_cross_entropy_128", rows=rows, width=v_t, numel=rows * v_t,
                           tp=t))
    if "optimizer" in primitives:
        layer = sum(math.prod(shape) for shape in layer_shapes(h, t))
        stages = [("firstStage", 1), ("middleStage", 2), ("lastStage", 1)]
        if h <= DEEP_STAGE_MAX_HIDDEN:
            stages += [("firstStage", layers) for layers in DEEP_STAGE_LAYERS]
        for kind, layers in stages:
            params = layers * layer + (v_t * h + p.seq * h if kind == "firstStage" else 0) + \
                (2 * h if kind == "lastStage" else 0)
            cases.append(_case("optimizer", f"{kind}_optimizer", layers=layers, width=h, tp=t, params=params))
            cases.append(_case("optimizer", f"{kind}_optimizer{FUSED_SUFFIX}", {"recipe": "adamw_fused"},
                               layers=layers, width=h, tp=t, params=params))
            local = sum(math.prod(s) for s in shard_shapes(stage_shapes(layers, h, t, params), OPTIMIZER_SHARDS))
            cases.append(_case("optimizer", f"{kind}_optimizer{DTENSOR_SUFFIX}", {"stage_params": params},
                               layers=layers, width=h, tp=t, params=local))
    if "framework" in primitives and t == 1 and rows * h <= FRAMEWORK_MAX_ELEMENTS:
        for variant in ("reference_layer", FSDP2_UNIT):
            cases.append(_case("framework", variant, rows=rows, width=h, numel=rows * h,
                               extra={"point": replace(point, vocab=0)}))  # a layer has no vocabulary
    return cases


def fsdp_copy_cases(device: str) -> list[Case]:
    """FSDP2's three copies of one unit, a GPT layer of each of FSDP_COPY_HIDDEN's sizes; `numel` is the elements
    each copies (the shard in, the gathered parameters out, the gradients in)."""
    cases = []
    for h in FSDP_COPY_HIDDEN[device]:
        params = sum(math.prod(shape) for shape in layer_shapes(h))
        shard = sum(math.prod(shape) for shape in shard_shapes(layer_shapes(h), FSDP_COPY_RANKS))
        for variant in FSDP_COPIES:
            numel = shard if variant == FSDP_COPY_IN else params
            cases.append(_case("elementwise", variant, rows=numel, width=1, numel=numel, extra={"hidden": h}))
    return cases


def layer_shapes(h: int, tp: int = 1) -> list[tuple[int, ...]]:
    """The parameter tensors of one GPT layer of hidden size `h` on one of `tp` tensor-parallel ranks: QKV,
    projection and two MLP linears (weights and biases), two layer norms (weights and biases)."""
    t = max(1, tp)
    ffn = 4 * h // t
    return [(3 * h // t, h), (3 * h // t,), (h, h // t), (h,), (ffn, h), (ffn,), (h, ffn), (h,), (h,), (h,), (h,),
            (h,)]


def stage_shapes(layers: int, h: int, tp: int, params: int) -> list[tuple[int, ...]]:
    """The parameter tensors of one pipeline stage as a Megatron GPT stage holds them on one tensor-parallel rank:
    `layers` layers (`layer_shapes`); the rest of `params` (the first stage's embeddings, the last stage's final
    norm) as one more matrix `h` wide."""
    shapes = layer_shapes(h, tp) * layers
    rest = params - sum(math.prod(shape) for shape in shapes)
    if rest >= h:
        shapes.append((rest // h, h))
    return shapes


def shard_shapes(shapes: list[tuple[int, ...]], ranks: int) -> list[tuple[int, ...]]:
    """Rank 0's shard of each tensor split along its first dimension over `ranks` (FSDP2's `Shard(0)`: the larger
    part of an uneven split)."""
    return [(-(-shape[0] // ranks), *shape[1:]) for shape in shapes]


def layer_cases(point: Point) -> list[tuple[Case, int]]:
    """The operator cases of one layer at `point`, each with how many times a layer pass runs it."""
    layer = set(LAYER_OPERATORS)
    return [(case, LAYER_OPERATORS[case.variant]) for case in compute_cases(point, set(COMPUTE) - {"framework"})
            if case.variant in layer]


def collective_cases(device: str, primitives: set[str], ranks: int) -> list[Case]:
    """Message sizes (bytes per rank) for each collective over `ranks` local processes, spread-first order."""
    sizes = MESSAGE_BYTES[device]
    order = sizes[::2] + sizes[1::2]
    cases = []
    for size in order:
        for primitive in COLLECTIVES:
            if primitive in primitives:
                cases.append(_case(primitive, COLLECTIVE_VARIANTS[primitive], bytes=size, group_size=ranks,
                                   ranks_per_node=ranks, nodes=1))
    return cases
