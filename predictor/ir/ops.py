"""The operator rows of a graph and the helpers that make them: one `spec` per distinct operator shape (a row of the
estimation frame: hardware, primitive, pass, dtype, variant, role and the shape features of
`tracekit.core.samples.FEATURE_COLUMNS`), and `OpUse`s that refer to specs by index.

An op is built with its backward: `compute` returns (forward OpUse, backward) where the backward is one OpUse (the
whole backward, the seed paper's form) or, for GEMMs whose backward the models hold per role (`backward_roles`), its
parts `dgrad`, `wgrad` and `bgrad` (with a bias). A block of a layer is a list of `Pair`s: (forward op or None, its
backward or None, the module it belongs to — what selective recompute names: `core_attn`, `layernorm`, `mlp`,
`moe_act`, `mla_up_proj`, `moe`, `shared_experts`).

`linear` adds what a precision recipe costs around a GEMM (`tracekit.core.precision`): the cast of its input in
forward and of its output gradient in backward (memory-bound, elementwise `quantize` rows whose `numel` is scaled so
that the bytes they move are the recipe's), and records the cast of its weight, once per iteration, in
`weight_casts`.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from predictor.ir.placement import GroupPlacement, order_of, placements
from tracekit.core.config import TrainingConfig

#: Streams of an op: compute ops and the blocking collectives that sit between them.
COMPUTE, COMM = "compute", "comm"


@dataclass(slots=True)
class OpUse:
    """One operator in a segment: which spec estimates it, how often per micro-batch, and where it runs."""

    name: str  # Megatron module path, e.g. "self_attention.linear_qkv"
    spec: int  # index into Graph.specs
    count: int = 1  # instances per micro-batch (layers of its block for per-layer ops)
    per_layer: bool = False  # part of a repeated transformer-layer block
    group: str | None = None  # tp | cp | dp | dpcp | pp | embd | ep | etp | tpep | edp for collectives
    flops: float = 0.0  # per instance (forward work for fwd rows, 2× forward for bwd rows)
    recompute: bool = False  # forward work replayed during backward
    block: str = ""  # the layer block (kind of layer) a per-layer op belongs to
    launch: bool = True  # launched by a call of its own (a recipe's casts run inside their linear's call: False)
    # device synchronisations its call makes on the host before issuing it (predictor.layers.moe.host_syncs)
    syncs: int = 0
    chunk: int = 0  # the model chunk a gradient bucket's collective reduces (predictor.parallel.grad_buckets)

    @property
    def stream(self) -> str:
        return COMM if self.group else COMPUTE

    def placed(self, count: int, recompute: bool, block: str) -> OpUse:
        """This op as a per-layer op of `block`, `count` layers of it (a replay in the backward with `recompute`),
        every other field kept: the one copy that names them all (cheaper than `dataclasses.replace` on the graph
        builder's path)."""
        return OpUse(self.name, self.spec, count, True, self.group, self.flops, recompute, block, self.launch,
                     self.syncs, self.chunk)


#: An op's backward: one OpUse, or its parts per role (see the module docstring).
Backward = OpUse | tuple[OpUse, ...]
#: (forward op, its backward, module) of one op in a layer's block.
Pair = tuple[OpUse | None, Backward | None, str]


def part_share(role: str | None, part: str) -> float:
    """The share of a GEMM's backward row that is its `part` (`dgrad` or `wgrad`): all of a row of that role, half of
    a whole backward (no role: its dgrad and wgrad are one forward's FLOPs each), none of another role's row."""
    return 1.0 if role == part else 0.5 if role is None else 0.0


def parts(op: Backward | None) -> tuple[OpUse, ...]:
    """The OpUses of one op's backward (none, the whole, or its parts per role)."""
    if op is None:
        return ()
    return op if isinstance(op, tuple) else (op,)


class OpBuilder:
    """Specs and ops of one configuration on one hardware (de-duplicated: equal rows share one spec)."""

    def __init__(self, config: TrainingConfig, hardware: str, gpus_per_node: int,
                 backward_roles: Collection[str] = ()) -> None:
        c = self.c = config
        self.hardware = hardware
        self.roles = frozenset(backward_roles) & {"gemm", "bmm"}
        self.gpn = gpus_per_node
        self.recipe = c.recipe
        # everything that is not a recipe's GEMM runs in the training dtype (bf16 under the low-precision recipes)
        self.dtype = c.precision if c.precision in ("fp32", "fp16", "bf16") else "bf16"
        self.gemm_dtype = c.gemm_dtype
        moe = c.moe
        self.groups: dict[str, GroupPlacement] = placements(
            c.tp, c.cp, c.dp, c.pp, gpus_per_node, moe.ep if moe else 1, moe.etp(c.tp) if moe else None,
            order_of(c))
        self.specs: list[dict] = []
        self.index: dict[tuple, int] = {}
        self.bucket_specs: dict[tuple, int | None] = {}
        self.weight_casts: list[float] = []  # elements of the weights cast per layer block (reset per block)
        t = self.t = c.tp
        self.s = c.seq_length // c.cp  # local sequence per CP rank
        self.b = c.micro_batch_size
        self.h = c.hidden_size
        self.v = c.padded_vocab_size
        self.sp = c.sequence_parallel
        self.bytes = c.dtype_bytes
        self.tokens = self.s * self.b  # rows of the [l·b, ·] activations
        self.sp_tokens = self.tokens // t if self.sp else self.tokens

    # -- specs -----------------------------------------------------------------------------------------------
    def spec(self, primitive: str, pass_: str, variant: str, role: str | None = None, dtype: str | None = None,
             /, **features: float) -> int:
        dtype = dtype or self.dtype
        key = (primitive, pass_, variant, role, dtype, *features.items())  # call sites pass features in a fixed order
        found = self.index.get(key)
        if found is not None:
            return found
        row: dict[str, str | float | None] = {"hardware": self.hardware, "primitive": primitive, "pass": pass_,
                                              "dtype": dtype, "variant": variant, "role": role}
        for name, value in features.items():
            row[name] = float(value)
        self.specs.append(row)
        self.index[key] = len(self.specs) - 1
        return self.index[key]

    def compute(self, name: str, primitive: str, variant: str, flops: float = 0.0, per_layer: bool = True,
                bias: bool = False, dtype: str | None = None, **features: float) -> tuple[OpUse, Backward]:
        """A forward op and its backward (same features, pass bwd): whole, or its parts per role where the graph
        asks for `primitive` per role (see the module docstring)."""
        fwd = OpUse(name, self.spec(primitive, "fwd", variant, None, dtype, **features), per_layer=per_layer,
                    flops=flops)
        if primitive not in self.roles:
            return fwd, OpUse(name, self.spec(primitive, "bwd", variant, None, dtype, **features),
                              per_layer=per_layer, flops=2 * flops)
        roles = ("dgrad", "wgrad", "bgrad") if bias else ("dgrad", "wgrad")
        return fwd, tuple(OpUse(name, self.spec(primitive, "bwd", variant, role, dtype, **features),
                                per_layer=per_layer, flops=0.0 if role == "bgrad" else flops) for role in roles)

    def collective(self, name: str, primitive: str, group: str, nbytes: float, per_layer: bool = True,
                   variant: str | None = None) -> OpUse | None:
        """A collective on one of the parallel groups; None when the group has one member."""
        place = self.groups[group]
        if place.size <= 1:
            return None
        variant = variant or {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
                              "send_recv": "p2p", "all_to_all": "alltoall"}[primitive]
        spec = self.spec(primitive, "comm", variant, None, None, bytes=nbytes, group_size=place.size,
                         ranks_per_node=place.ranks_per_node, nodes=place.nodes, numel=nbytes / self.bytes)
        return OpUse(name, spec, per_layer=per_layer, group=group)

    def bucket(self, name: str, primitive: str, nbytes: float, group: str = "dpcp", chunk: int = 0) -> OpUse | None:
        """One gradient bucket's collective on a data-parallel group for model chunk `chunk` (a big model has
        thousands of buckets of a few sizes, so the spec of each size is looked up once)."""
        key = (primitive, nbytes, group)
        if key not in self.bucket_specs:
            op = self.collective(name, primitive, group, nbytes, False)
            self.bucket_specs[key] = None if op is None else op.spec
        spec = self.bucket_specs[key]
        return None if spec is None else OpUse(name, spec, group=group, chunk=chunk)

    # -- building blocks ---------------------------------------------------------------------------------------
    def gemm(self, name: str, variant: str, m: float, n: float, k: float, per_layer: bool = True,
             bias: bool | None = None, dtype: str | None = None, batch: int = 1) -> tuple[OpUse, Backward]:
        """A GEMM, or `batch` of one shape (a grouped GEMM of equal groups); `bias`: whether it has one (None: where
        the configuration adds biases, `add_bias_linear`)."""
        return self.compute(name, "gemm", variant, 2.0 * m * n * k * batch, per_layer,
                            self.c.add_bias_linear if bias is None else bias, dtype or self.gemm_dtype,
                            m=m, n=n, k=k, batch=batch)

    def linear(self, name: str, variant: str, m: float, n: float, k: float, module: str, lowp: bool = True,
               bias: bool | None = None, per_layer: bool = True, batch: int = 1) -> list[Pair]:
        """A linear layer's GEMM in the recipe's dtype (`lowp`: the recipe applies to it; bf16 layers and modules
        the recipe keeps in bf16 pass False), with the recipe's input and output-gradient casts around it; `batch`
        GEMMs of one shape for a grouped GEMM (the local experts, each with its own [k, n] weight)."""
        low = lowp and self.recipe.low_precision
        fwd, bwd = self.gemm(name, variant, m, n, k, per_layer, bias, None if low else self.dtype, batch)
        if not low:
            return [(fwd, bwd, module)]
        self.weight_casts.append(k * n * batch)
        return [(self.quantize(f"{name}.quantize_input", m * k * batch, per_layer)[0], None, module),
                (fwd, bwd, module),
                (None, self.quantize(f"{name}.quantize_grad", m * n * batch, per_layer)[0], module)]

    def quantize(self, name: str, numel: float, per_layer: bool = True) -> tuple[OpUse, Backward]:
        """One cast kernel of the recipe over `numel` elements (module docstring)."""
        r = self.recipe
        moved = numel * (2.0 + r.copies * r.out_bytes + (2.0 if r.amax_pass else 0.0))
        scaled = moved / (2.0 * self.bytes)  # the elementwise rows move 2 · dtype bytes per element
        fwd, bwd = self.compute(name, "elementwise", "quantize", 0.0, per_layer, rows=scaled, width=1, numel=scaled)
        for op in (fwd, *parts(bwd)):
            op.launch = False  # Transformer Engine casts inside the linear's own call
        return fwd, bwd

    def residual(self, name: str, per_layer: bool = True) -> tuple[OpUse, Backward]:
        rows = self.sp_tokens
        return self.compute(name, "elementwise", "res_add", 0.0, per_layer, rows=rows, width=self.h,
                            numel=rows * self.h)

    def elementwise(self, name: str, variant: str, numel: float, width: float = 1.0, per_layer: bool = True
                    ) -> tuple[OpUse, Backward]:
        return self.compute(name, "elementwise", variant, 0.0, per_layer, rows=numel / width, width=width,
                            numel=numel)

    # -- tensor-parallel input and output of a column/row-parallel pair ----------------------------------------
    def tp_in(self, name: str, module: str) -> list[Pair]:
        """Column-parallel input: SP all-gather forward; backward = all-reduce (no SP) or RS + re-gather."""
        full_act = self.tokens * self.h * self.bytes
        t = self.t
        if self.sp:
            return [(self.collective(f"{name}.all_gather", "all_gather", "tp", full_act / t), None, module),
                    (None, self.collective(f"{name}.grad_reduce_scatter", "reduce_scatter", "tp", full_act / t),
                     module),
                    (None, self.collective(f"{name}.input_all_gather", "all_gather", "tp", full_act / t), module)]
        return [(None, self.collective(f"{name}.grad_all_reduce", "all_reduce", "tp", full_act), module)]

    def tp_out(self, name: str, module: str) -> list[Pair]:
        """Row-parallel output: all-reduce, or reduce-scatter with SP (backward: all-gather)."""
        full_act = self.tokens * self.h * self.bytes
        if self.sp:
            return [(self.collective(f"{name}.reduce_scatter", "reduce_scatter", "tp", full_act / self.t),
                     self.collective(f"{name}.grad_all_gather", "all_gather", "tp", full_act / self.t), module)]
        return [(self.collective(f"{name}.all_reduce", "all_reduce", "tp", full_act), None, module)]
