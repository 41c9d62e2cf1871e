"""Operator graph of one micro-batch's forward and backward on every pipeline stage, as Megatron builds a GPT.

Each distinct operator shape becomes one *spec* (a row of the estimation frame: hardware, primitive, pass, dtype,
variant, role and the shape features of `tracekit.core.samples.FEATURE_COLUMNS`); the graph refers to specs by
index, so an iteration's thousands of operator instances need only a few dozen estimates. Conventions follow the
seed paper's samples (corpus README): tensors are `[l, b, ...]`; `variant` is the seed paper's op name where one
applies; every `bwd` row carries its forward operator's features. The backward of an op is asked in one of two
forms, whichever the model set holds for the hardware and primitive (`ModelSet.role_primitives`, passed in as
`backward_roles`): the whole backward (one row, no role: the seed paper's form, the default), or for GEMMs
(gemm, bmm) in `backward_roles` its parts per role: `dgrad` and `wgrad` (one forward's FLOPs each) and, for a
linear with a bias (`add_bias_linear`; never the LM head), `bgrad` — together the same work as the whole row.

Per layer (forward): norm → [SP all-gather] → QKV GEMM (linear1) → RoPE → core attention (flash_atten, or
baddbmm + ScaledUpperTriangMaskedSoftmax + attention dropout + bmm) → out-proj GEMM (linear2) → all-reduce
(or reduce-scatter with SP) → bias-dropout-add (res_add) → norm → [SP all-gather] → FC1 (linear3) → GeLU/SwiGLU →
FC2 (linear4) → all-reduce/reduce-scatter → res_add. Backward mirrors it: an all-reduce on the column-parallel
inputs' gradients without SP; with SP, a re-gather of each column-parallel input for the weight gradient plus a
reduce-scatter of its input gradient, and an all-gather of each row-parallel output gradient. Recompute `full`
replays the layer's forward (with its collectives) before its backward; `selective` replays core attention.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from tracekit.core.config import TrainingConfig

from .placement import GroupPlacement, placements

#: Streams of an op: compute ops and the blocking collectives that sit between them.
COMPUTE, COMM = "compute", "comm"


@dataclass(slots=True)
class OpUse:
    """One operator in a segment: which spec estimates it, how often per micro-batch, and where it runs."""

    name: str  # Megatron module path, e.g. "self_attention.linear_qkv"
    spec: int  # index into Graph.specs
    count: int = 1  # instances per micro-batch (layers for per-layer ops)
    per_layer: bool = False  # part of the repeated transformer-layer block
    group: str | None = None  # tp | cp | dp | pp | embd for collectives
    flops: float = 0.0  # per instance (forward work for fwd rows, 2× forward for bwd rows)
    recompute: bool = False  # forward work replayed during backward

    @property
    def stream(self) -> str:
        return COMM if self.group else COMPUTE


#: An op's backward: one OpUse, or its parts per role (see the module docstring).
Backward = OpUse | tuple[OpUse, ...]


@dataclass
class Segment:
    """The ops one pipeline stage runs for one model chunk per micro-batch: forward and backward."""

    stage: int
    chunk: int
    layers: int
    first: bool  # holds the embedding (first chunk of stage 0)
    last: bool  # holds the LM head and loss (last chunk of the last stage)
    fwd: list[OpUse] = field(default_factory=list)
    bwd: list[OpUse] = field(default_factory=list)
    params: int = 0  # parameters held by this chunk on one GPU


@dataclass
class Graph:
    """Every stage's segments plus the per-iteration ops (P2P, gradient sync, optimizer) of one configuration."""

    config: TrainingConfig
    hardware: str
    gpus_per_node: int
    groups: dict[str, GroupPlacement]
    specs: list[dict]
    segments: list[Segment]  # ordered by (stage, chunk)
    p2p: int | None  # spec of one activation transfer between adjacent stages (None without PP)
    grad_sync: dict[int, list[OpUse]]  # per stage: DP gradient sync (and tied-embedding all-reduce)
    param_gather: dict[int, list[OpUse]]  # per stage: distributed optimizer's parameter all-gather
    optimizer: dict[int, OpUse]  # per stage: the optimizer step
    _index: dict[tuple, int] = field(default_factory=dict, repr=False)

    def segment(self, stage: int, chunk: int) -> Segment:
        return self.segments[stage * self.config.vp + chunk]


class _Builder:
    def __init__(self, config: TrainingConfig, hardware: str, gpus_per_node: int,
                 backward_roles: Collection[str] = ()) -> None:
        c = self.c = config
        self.hardware = hardware
        self.roles = frozenset(backward_roles) & {"gemm", "bmm"}
        self.gpn = gpus_per_node
        # fp8 (Transformer Engine): GEMMs in fp8, everything else in bf16
        self.dtype = "bf16" if c.precision == "fp8" else c.precision
        self.gemm_dtype = c.precision
        self.groups = placements(c.tp, c.cp, c.dp, c.pp, gpus_per_node)
        self.specs: list[dict] = []
        self.index: dict[tuple, int] = {}
        self.bucket_specs: dict[tuple, int | None] = {}
        t = c.tp
        self.t = t
        self.s = c.seq_length // c.cp  # local sequence per CP rank
        self.b = c.micro_batch_size
        self.h = c.hidden_size
        self.a = c.num_attention_heads
        self.g = c.num_query_groups
        self.d = c.head_dim
        self.f = c.ffn_hidden_size
        self.v = c.padded_vocab_size
        self.sp = c.sequence_parallel
        self.bytes = c.dtype_bytes
        self.tokens = self.s * self.b  # rows of the [l·b, ·] activations
        self.sp_tokens = self.tokens // t if self.sp else self.tokens

    # -- specs -----------------------------------------------------------------------------------------------
    def spec(self, primitive: str, pass_: str, variant: str, role: str | None = None, /, **features: float) -> int:
        key = (primitive, pass_, variant, role, *features.items())  # call sites pass features in a fixed order
        found = self.index.get(key)
        if found is not None:
            return found
        dtype = self.gemm_dtype if primitive == "gemm" else self.dtype
        row: dict[str, str | float | None] = {"hardware": self.hardware, "primitive": primitive, "pass": pass_,
                                              "dtype": dtype, "variant": variant, "role": role}
        for name, value in features.items():
            row[name] = float(value)
        self.specs.append(row)
        self.index[key] = len(self.specs) - 1
        return self.index[key]

    def compute(self, name: str, primitive: str, variant: str, flops: float = 0.0, per_layer: bool = True,
                bias: bool = False, **features: float) -> tuple[OpUse, Backward]:
        """A forward op and its backward (same features, pass bwd): whole, or its parts per role where the graph
        asks for `primitive` per role (see the module docstring)."""
        fwd = OpUse(name, self.spec(primitive, "fwd", variant, **features), per_layer=per_layer, flops=flops)
        if primitive not in self.roles:
            return fwd, OpUse(name, self.spec(primitive, "bwd", variant, **features), per_layer=per_layer,
                              flops=2 * flops)
        roles = ("dgrad", "wgrad", "bgrad") if bias else ("dgrad", "wgrad")
        return fwd, tuple(OpUse(name, self.spec(primitive, "bwd", variant, role, **features), per_layer=per_layer,
                                flops=0.0 if role == "bgrad" else flops) for role in roles)

    def collective(self, name: str, primitive: str, group: str, nbytes: float, per_layer: bool = True,
                   variant: str | None = None) -> OpUse | None:
        """A collective on one of the parallel groups; None when the group has one member."""
        place = self.groups[group]
        if place.size <= 1:
            return None
        variant = variant or {"all_reduce": "allreduce", "all_gather": "allgather",
                              "reduce_scatter": "reducescatter", "send_recv": "p2p"}[primitive]
        spec = self.spec(primitive, "comm", variant, bytes=nbytes, group_size=place.size,
                         ranks_per_node=place.ranks_per_node, nodes=place.nodes, numel=nbytes / self.bytes)
        return OpUse(name, spec, per_layer=per_layer, group=group)

    def bucket(self, name: str, primitive: str, nbytes: float) -> OpUse | None:
        """One DP gradient bucket's collective (`collective` on the dp group; a big model has thousands of buckets
        of a few sizes, so the spec of each size is looked up once)."""
        key = (primitive, nbytes)
        if key not in self.bucket_specs:
            op = self.collective(name, primitive, "dp", nbytes, False)
            self.bucket_specs[key] = None if op is None else op.spec
        spec = self.bucket_specs[key]
        return None if spec is None else OpUse(name, spec, group="dp")

    # -- building blocks ---------------------------------------------------------------------------------------
    def gemm(self, name: str, variant: str, m: int, n: int, k: int, per_layer: bool = True, bias: bool = True
             ) -> tuple[OpUse, Backward]:
        """A linear layer's GEMM (`bias`: it has one where the configuration adds biases)."""
        return self.compute(name, "gemm", variant, 2.0 * m * n * k, per_layer, bias and self.c.add_bias_linear,
                            m=m, n=n, k=k, batch=1)

    def norm(self, name: str, per_layer: bool = True) -> tuple[OpUse, Backward]:
        variant = "RMSlayernorm" if self.c.normalization == "RMSNorm" else "layernorm"
        rows = self.sp_tokens
        return self.compute(name, "norm", variant, 0.0, per_layer, rows=rows, width=self.h, numel=rows * self.h)

    def residual(self, name: str, per_layer: bool = True) -> tuple[OpUse, Backward]:
        rows = self.sp_tokens
        return self.compute(name, "elementwise", "res_add", 0.0, per_layer, rows=rows, width=self.h,
                            numel=rows * self.h)

    def layer(self) -> tuple[list[OpUse], list[OpUse], list[OpUse]]:
        """(forward ops, backward ops in execution order, ops replayed before backward) of one layer."""
        c, t, s, b, h, d = self.c, self.t, self.s, self.b, self.h, self.d
        a_t, g_t, f_t = self.a // t, self.g // t, self.f // t
        rows, act = self.tokens, self.bytes
        full_act = rows * h * act  # bytes of one [l, b, h] activation
        fwd: list[tuple[OpUse | None, Backward | None]] = []  # (fwd op, its backward)
        replay_attn: list[OpUse] = []

        def tp_in(name: str) -> None:
            """Column-parallel input: SP all-gather forward; backward = all-reduce (no SP) or RS + re-gather."""
            if self.sp:
                fwd.append((self.collective(f"{name}.all_gather", "all_gather", "tp", full_act / t), None))
                fwd.append((None, self.collective(f"{name}.grad_reduce_scatter", "reduce_scatter", "tp",
                                                  full_act / t)))
                fwd.append((None, self.collective(f"{name}.input_all_gather", "all_gather", "tp", full_act / t)))
            else:
                fwd.append((None, self.collective(f"{name}.grad_all_reduce", "all_reduce", "tp", full_act)))

        def tp_out(name: str) -> None:
            """Row-parallel output: all-reduce, or reduce-scatter with SP (backward: all-gather)."""
            if self.sp:
                fwd.append((self.collective(f"{name}.reduce_scatter", "reduce_scatter", "tp", full_act / t),
                            self.collective(f"{name}.grad_all_gather", "all_gather", "tp", full_act / t)))
            else:
                fwd.append((self.collective(f"{name}.all_reduce", "all_reduce", "tp", full_act), None))

        fwd.append(self.norm("input_layernorm"))
        tp_in("self_attention.linear_qkv")
        fwd.append(self.gemm("self_attention.linear_qkv", "linear1", rows, (a_t + 2 * g_t) * d, h))
        if c.position_embedding_type == "rope":
            fwd.append(self.compute("self_attention.rotary", "elementwise", "RoPE", 0.0, True,
                                    rows=rows * a_t, width=d, heads=a_t, head_dim=d, numel=rows * a_t * d))
        if c.cp > 1:  # ring attention: (cp−1) K/V block exchanges forward, twice that backward (dK/dV too)
            kv = 2 * rows * g_t * d * act
            for step in range(c.cp - 1):
                fwd.append((self.collective(f"self_attention.cp_kv.{step}", "send_recv", "cp", kv),
                            self.collective(f"self_attention.cp_dkv.{step}", "send_recv", "cp", 2 * kv)))
        attn_flops = 4.0 * b * a_t * s * (s * c.cp) * d
        if c.attention == "flash":
            core = self.compute("self_attention.core_attention", "attention", "flash_atten", attn_flops, True,
                                batch=b, heads=a_t, kv_heads=g_t, seq=s, seq_kv=s * c.cp, head_dim=d, causal=1)
            fwd.append(core)
            replay_attn.append(core[0])
        else:
            scores = self.compute("self_attention.core_attention.baddbmm", "bmm", "baddbmm", attn_flops / 2,
                                  True, batch=b * a_t, m=s, n=s * c.cp, k=d)
            softmax = self.compute("self_attention.core_attention.scale_mask_softmax", "softmax",
                                   "ScaledUpperTriangMaskedSoftmax", 0.0, True, batch=b, heads=a_t, seq=s,
                                   rows=b * a_t * s, width=s * c.cp, numel=b * a_t * s * s * c.cp, causal=1)
            context = self.compute("self_attention.core_attention.bmm", "bmm", "bmm", attn_flops / 2, True,
                                   batch=b * a_t, m=s, n=d, k=s * c.cp)
            block = [scores, softmax]
            if c.attention_dropout > 0:
                block.append(self.compute("self_attention.core_attention.dropout", "elementwise", "dropout",
                                          0.0, True, rows=b * a_t * s, width=s * c.cp,
                                          numel=b * a_t * s * s * c.cp))
            block.append(context)
            fwd.extend(block)
            replay_attn.extend(op[0] for op in block)
        fwd.append(self.gemm("self_attention.linear_proj", "linear2", rows, h, a_t * d))
        tp_out("self_attention.linear_proj")
        fwd.append(self.residual("self_attention.bias_dropout_add"))
        fwd.append(self.norm("pre_mlp_layernorm"))
        tp_in("mlp.linear_fc1")
        fc1_out = 2 * f_t if c.swiglu else f_t
        fwd.append(self.gemm("mlp.linear_fc1", "linear3", rows, fc1_out, h))
        act_variant = "swiglu" if c.swiglu else "gelu"
        fwd.append(self.compute("mlp.activation", "activation", act_variant, 0.0, True,
                                rows=rows, width=f_t, numel=rows * f_t))
        fwd.append(self.gemm("mlp.linear_fc2", "linear4", rows, h, f_t))
        tp_out("mlp.linear_fc2")
        fwd.append(self.residual("mlp.bias_dropout_add"))

        forward = [op for op, _ in fwd if op is not None]
        backward = [part for _, op in reversed(fwd) for part in _parts(op)]
        if c.recompute_granularity == "full":
            replay = [OpUse(o.name, o.spec, per_layer=True, group=o.group, flops=o.flops, recompute=True)
                      for o in forward]
        elif c.recompute_granularity == "selective":
            replay = [OpUse(o.name, o.spec, per_layer=True, flops=o.flops, recompute=True) for o in replay_attn]
        else:
            replay = []
        return forward, backward, replay

    def embedding(self) -> tuple[list[OpUse], list[OpUse]]:
        c, rows, h = self.c, self.tokens, self.h
        fwd_ops: list[OpUse] = []
        bwd_ops: list[OpUse] = []
        emb = self.compute("embedding.word_embeddings", "embedding", "embedding", 0.0, False,
                           rows=rows, width=h, params=self.v // self.t, numel=rows * h, tp=self.t)
        fwd_ops.append(emb[0])
        bwd_ops.extend(_parts(emb[1]))
        reduce = ("reduce_scatter", self.sp_tokens * h * self.bytes) if self.sp else \
            ("all_reduce", rows * h * self.bytes)
        op = self.collective(f"embedding.word_embeddings.{reduce[0]}", reduce[0], "tp", reduce[1], False)
        if op:
            fwd_ops.append(op)
        if c.position_embedding_type != "rope":
            pos = self.residual("embedding.position_embeddings", per_layer=False)
            fwd_ops.append(pos[0])
            bwd_ops[:0] = _parts(pos[1])
        return fwd_ops, bwd_ops

    def head(self) -> tuple[list[OpUse], list[OpUse]]:
        rows, h, v_t = self.tokens, self.h, self.v // self.t
        fwd: list[OpUse] = []
        bwd: list[OpUse] = []
        norm = self.norm("final_layernorm", per_layer=False)
        fwd.append(norm[0])
        full_act = rows * h * self.bytes
        if self.sp:  # SP needs tp > 1: the all-gather is there
            gather = self.collective("output_layer.all_gather", "all_gather", "tp", full_act / self.t, False)
            if gather:
                fwd.append(gather)
        lm = self.gemm("output_layer", "linear_final", rows, v_t, h, per_layer=False, bias=False)
        fwd.append(lm[0])
        ce = self.compute("loss.vocab_parallel_cross_entropy", "cross_entropy", "parallel_cross_entropy_128",
                          0.0, False, rows=rows, width=v_t, numel=rows * v_t, tp=self.t)
        fwd.append(ce[0])
        for what in ("max", "predicted", "sum_exp"):  # the three TP all-reduces of vocab-parallel CE (fp32)
            op = self.collective(f"loss.all_reduce_{what}", "all_reduce", "tp", rows * 4, False)
            if op:
                fwd.append(op)
        bwd.extend(_parts(ce[1]))
        bwd.extend(_parts(lm[1]))
        if self.sp:
            op = self.collective("output_layer.grad_reduce_scatter", "reduce_scatter", "tp", full_act / self.t,
                                 False)
        else:
            op = self.collective("output_layer.grad_all_reduce", "all_reduce", "tp", full_act, False)
        if op:
            bwd.append(op)
        bwd.extend(_parts(norm[1]))
        return fwd, bwd


def layer_params(c: TrainingConfig) -> int:
    """Parameters of one transformer layer on one TP rank."""
    t, h, d = c.tp, c.hidden_size, c.head_dim
    a_t, g_t, f_t = c.num_attention_heads // t, c.num_query_groups // t, c.ffn_hidden_size // t
    bias = c.add_bias_linear
    qkv = h * (a_t + 2 * g_t) * d + (a_t + 2 * g_t) * d * bias
    proj = a_t * d * h + h * bias
    fc1_out = 2 * f_t if c.swiglu else f_t
    mlp = h * fc1_out + fc1_out * bias + f_t * h + h * bias
    norms = 2 * h * (1 if c.normalization == "RMSNorm" else 2)
    return qkv + proj + mlp + norms


def chunk_params(c: TrainingConfig, stage: int, chunk: int) -> int:
    """Parameters one GPU holds for a model chunk: its layers, the embedding on the first chunk of the first stage,
    the final norm and (untied, or away from the embedding) the output layer on the last chunk of the last."""
    first, last = stage == 0 and chunk == 0, stage == c.pp - 1 and chunk == c.vp - 1
    vocab_rows = c.padded_vocab_size // c.tp * c.hidden_size
    embedding = vocab_rows + (c.seq_length * c.hidden_size if c.position_embedding_type != "rope" else 0)
    tied_here = first and not c.untie_embeddings_and_output_weights
    head = c.hidden_size * (1 if c.normalization == "RMSNorm" else 2) + (0 if tied_here else vocab_rows)
    return c.num_layers // (c.pp * c.vp) * layer_params(c) + (embedding if first else 0) + (head if last else 0)


def build_graph(config: TrainingConfig, hardware: str, gpus_per_node: int = 8,
                backward_roles: Collection[str] = ()) -> Graph:
    """The operator graph of `config` on `hardware` (validated first; raises ConfigError). `backward_roles`: the
    primitives (gemm, bmm) whose backward is asked per role rather than whole (module docstring)."""
    config.validate()
    bld = _Builder(config, hardware, gpus_per_node, backward_roles)
    c = config
    pp, vp = c.pp, c.vp
    per_chunk = c.num_layers // (pp * vp)
    layer_fwd, layer_bwd, replay = bld.layer()
    emb_fwd, emb_bwd = bld.embedding()
    head_fwd, head_bwd = bld.head()
    segments: list[Segment] = []
    layers_fwd, layers_bwd = _times(layer_fwd, per_chunk), _times(replay + layer_bwd, per_chunk)  # every chunk's
    for stage in range(pp):
        for chunk in range(vp):
            first = stage == 0 and chunk == 0
            last = stage == pp - 1 and chunk == vp - 1
            seg = Segment(stage, chunk, per_chunk, first, last)
            seg.fwd = (emb_fwd if first else []) + layers_fwd + (head_fwd if last else [])
            seg.bwd = (head_bwd if last else []) + layers_bwd + (emb_bwd if first else [])
            seg.params = chunk_params(c, stage, chunk)
            segments.append(seg)

    p2p_op = bld.collective("p2p.activation", "send_recv", "p2p", bld.sp_tokens * c.hidden_size * c.dtype_bytes,
                            False) if pp > 1 else None
    grad_sync: dict[int, list[OpUse]] = {}
    param_gather: dict[int, list[OpUse]] = {}
    optimizer: dict[int, OpUse] = {}
    grad_bytes = c.grad_bytes  # fp32 main grads with bf16 (Megatron's rule), or when the stack/config asks
    bucket = max(40_000_000, 1_000_000 * c.dp)  # Megatron's default DDP bucket size (elements)
    for stage in range(pp):
        params = sum(bld_seg.params for bld_seg in segments[stage * vp:(stage + 1) * vp])
        ops: list[OpUse] = []
        gathers: list[OpUse] = []
        n_buckets = max(1, -(-params // bucket))
        for i in range(n_buckets):
            numel = min(bucket, params - i * bucket) if n_buckets > 1 else params
            if c.use_distributed_optimizer:
                op = bld.bucket(f"ddp.bucket{i}.reduce_scatter", "reduce_scatter", numel * grad_bytes / c.dp)
                gather = bld.bucket(f"optimizer.bucket{i}.param_all_gather", "all_gather",
                                    numel * c.dtype_bytes / c.dp)
                if gather:
                    gathers.append(gather)
            else:
                op = bld.bucket(f"ddp.bucket{i}.all_reduce", "all_reduce", numel * grad_bytes)
            if op:
                ops.append(op)
        tied = pp > 1 and not c.untie_embeddings_and_output_weights and stage in (0, pp - 1)
        if tied:  # word-embedding gradient shared by the first and last stage
            spec = bld.spec("all_reduce", "comm", "allreduce", bytes=bld.v // bld.t * c.hidden_size * grad_bytes,
                            group_size=2, ranks_per_node=bld.groups["p2p"].ranks_per_node,
                            nodes=bld.groups["p2p"].nodes, numel=bld.v // bld.t * c.hidden_size)
            ops.append(OpUse("embedding.grad_all_reduce", spec, group="embd"))
        grad_sync[stage] = ops
        param_gather[stage] = gathers
        kind = "firstStage" if stage == 0 else "lastStage" if stage == pp - 1 else "middleStage"
        layers = per_chunk * vp
        shard = c.dp if c.use_distributed_optimizer else 1
        spec = bld.spec("optimizer", "optimizer", f"{kind}_optimizer", layers=layers, width=c.hidden_size,
                        tp=c.tp, params=-(-params // shard))
        optimizer[stage] = OpUse("optimizer.step", spec)
    return Graph(config, hardware, gpus_per_node, bld.groups, bld.specs, segments,
                 None if p2p_op is None else p2p_op.spec,
                 grad_sync, param_gather, optimizer, bld.index)


def _parts(op: Backward | None) -> tuple[OpUse, ...]:
    """The OpUses of one op's backward (none, the whole, or its parts per role)."""
    if op is None:
        return ()
    return op if isinstance(op, tuple) else (op,)


def _times(ops: list[OpUse], layers: int) -> list[OpUse]:
    """Per-layer ops with their count set to the chunk's layer count."""
    return [OpUse(o.name, o.spec, layers, True, o.group, o.flops, o.recompute) for o in ops]
