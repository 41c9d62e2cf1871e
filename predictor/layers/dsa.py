"""The DeepSeek sparse attention layer (`D`) as Megatron-core builds it in a hybrid stack (`dsa_layer` of
`hybrid_stack_spec`: a TransformerLayer with `AbsorbedMLASelfAttention` whose core attention is `DSAttention` with a
`DSAIndexer`; `megatron/core/transformer/experimental_attention_variant/`), as pure functions of the MLA settings
(`tracekit.core.attention.AttentionSettings`), the indexer's (`tracekit.core.hybrid_shapes.DSAShape`) and the split.

Design note
-----------
Absorbed MLA: the input norm (a module of its own) → the query down-projection (h → q_lora, replicated over TP), its
norm and up-projection (→ heads × (qk + rope), split over TP) → the key/value down-projection (h → kv_lora + rope,
replicated) and its norm; the key's up-projection is absorbed into the query (a batched product per head [tokens,
qk] × [qk, kv_lora]) and attention runs in the latent space, every head against one shared latent key of kv_lora +
rope dims whose first kv_lora dims are the value (MQA) → the value's up-projection after attention (per head
[tokens, kv_lora] × [kv_lora, v]) → output projection (all-reduce, or SP reduce-scatter) → residual add.

The indexer, on inputs detached from the model (no gradient reaches the model through it), duplicated on every TP
rank over the whole (SP-gathered) sequence: q = wq_b(q_lora-rank query) as index heads × index head dim, k = wk(x)
(one head), LayerNorm of k, RoPE on the first rope dims of both, a Hadamard rotation of both, weights =
weights_proj(x) per index head; scores = Σ_heads weight · relu(q·kᵀ) over every earlier key (`dsa_index_scores`),
then the top-k keys per query (`dsa_topk`). With `dsa_indexer_topk_freq` > 1, a layer reuses an earlier layer's
top-k and has no indexer (Megatron's rule over the pattern's layer numbers: `tracekit.core.hybrid.dsa_reuses_topk`).
Only with `dsa_indexer_loss_coeff` > 0 does the indexer run a backward: its KL loss against the main attention's
distribution computes the dense scores of every head (fp32 [heads, s, s] per sequence), their softmax, an
all-reduce of the [s, s] fp32 target over TP, and backpropagates into the index scores and projections.

Sparse attention by kernel backend: `tilelang` / `cudnn` run a fused kernel over each query's top-k keys
(`sparse_attention`, attention work at seq_kv = top-k); `none` (Megatron's default) runs PyTorch: the dense fp32
scores of every head against every key, an index mask of −inf with the top-k scattered in, a masked softmax, and the
product with the latent value — quadratic in the sequence, whatever top-k is. The indexer itself is quadratic too
(its scores cover every key): DSA lowers the attention's cost, not the indexer's. CP: keys and the indexer's k are
all-gathered over CP (`cp_comm_type` all-gather only).

Parameters: MLA's (q_down, q norm, q_up, kv_down, kv norm, kv_up — kept whole and used through the absorption —,
output projection, input norm) plus the indexer's, replicated over TP: wq_b [q_lora → heads_i · d_i], wk [h → d_i],
k_norm (LayerNorm weight and bias, d_i), weights_proj [h → heads_i].
"""
from __future__ import annotations

import numpy as np

from predictor.ir.ops import OpBuilder, OpUse, Pair
from predictor.layers.attention.block import ATTENTION
from predictor.layers.block import Matrix, Saved, Saving, Tensors
from predictor.layers.norm_rope import norm
from tracekit.core.attention import AttentionSettings
from tracekit.core.config import TrainingConfig
from tracekit.core.hybrid_pattern import dsa_reuses_topk
from tracekit.core.hybrid_shapes import DSAShape

from . import mla

FP32 = 4.0
PRIMITIVES = ("dsa_index_scores", "dsa_topk", "sparse_attention")
MODULE = "attention"


def computes_topk(shape: DSAShape, layer_number: int) -> bool:
    """Whether the layer (1-based number in the whole pattern) runs its own indexer."""
    return shape.topk_freq <= 1 or not dsa_reuses_topk(layer_number, shape.skip_topk_offset, shape.topk_freq)


def mean_keys(seq: float, topk: float) -> float:
    """Keys a query attends to on average under the causal mask with at most `topk` each: mean over i of
    min(i + 1, topk)."""
    k = min(topk, seq)
    return (k * (k + 1) / 2.0 + (seq - k) * k) / seq


# -- work of the new kernels (numbers or numpy arrays) --------------------------------------------------------------
def index_scores_work(batch, seq, keys, heads, head_dim, fused, esize=2.0, passes=3.0):
    """(FLOPs, bytes) of the indexer's scores: q·kᵀ per index head, then `passes` element-wise steps on each product
    (ReLU, the weight, the sum over heads: 3; 2 without the ReLU). `fused` (tilelang/cudnn): causal tiles only,
    scores written once in fp32; else PyTorch's fp32 einsum, which materializes [s, heads, keys] in fp32 and passes
    over it for each step (written once, read and written per step but the sum's)."""
    causal = np.where(fused, 0.5, 1.0)
    products = batch * seq * keys * heads
    flops = 2.0 * products * head_dim * causal + passes * products * causal
    io = batch * (seq * heads * head_dim + keys * head_dim) * esize + batch * seq * heads * esize
    scores = batch * seq * keys * FP32
    moved = io + scores + np.where(fused, 0.0, products * FP32 * (2.0 * passes - 1.0))
    if np.ndim(flops) == 0:
        return float(flops), float(moved)
    return flops, moved


def topk_work(rows, width, k):
    """(FLOPs, bytes) of a top-k over `rows` rows of `width` fp32 scores."""
    log_k = np.log2(np.maximum(k, 2.0))
    return rows * width * log_k, rows * width * FP32 + rows * k * 8.0


def sparse_attention_work(batch, seq, keys, heads, qk_dim, v_dim, esize=2.0):
    """(FLOPs, bytes) of a fused sparse attention: each query against its `keys` selected latent keys (shared by the
    heads), scores and the weighted values."""
    flops = 2.0 * batch * seq * keys * heads * (qk_dim + v_dim)
    moved = batch * seq * (heads * (qk_dim + v_dim) + keys * qk_dim) * esize + batch * seq * keys * 8.0
    return flops, moved


# -- parameters -----------------------------------------------------------------------------------------------------
def indexer_param_tensors(shape: DSAShape) -> list[tuple[str, tuple[int, ...]]]:
    """The indexer's parameters (the same on every TP rank)."""
    prefix = "self_attention.core_attention.indexer"
    return [(f"{prefix}.linear_wq_b.weight", (shape.heads * shape.head_dim, shape.q_lora_rank)),
            (f"{prefix}.linear_wk.weight", (shape.head_dim, shape.hidden)),
            (f"{prefix}.k_norm.weight", (shape.head_dim,)),
            (f"{prefix}.k_norm.bias", (shape.head_dim,)),
            (f"{prefix}.linear_weights_proj.weight", (shape.heads, shape.hidden))]


def params(a: AttentionSettings, shape: DSAShape, heads: int, tp: int, layer_number: int,
           normalization: str = "RMSNorm", indexer: bool | None = None) -> int:
    """One DSA layer's parameters on one TP rank (no indexer on a layer that reuses top-k; `indexer` True/False
    says which instead of the layer's number)."""
    total = mla.params(a, shape.hidden, heads, tp, normalization)
    if computes_topk(shape, layer_number) if indexer is None else indexer:
        for _, dims in indexer_param_tensors(shape):
            size = 1
            for d in dims:
                size *= d
            total += size
    return total


# -- FLOPs ----------------------------------------------------------------------------------------------------------
def flops_per_token(a: AttentionSettings, shape: DSAShape, heads: int, seq: int, layer_number: int = 1,
                    indexer: bool | None = None) -> float:
    """Forward FLOPs per token of one DSA layer (all TP ranks; the indexer once, though each TP rank runs it), as
    the kernels of its backend run it (`indexer`: as `params`)."""
    h, n = shape.hidden, heads
    q = (h * a.q_lora_rank + a.q_lora_rank * n * a.q_head_dim) if a.q_lora_rank else h * n * a.q_head_dim
    kv_down = h * (a.kv_lora_rank + a.qk_pos_emb_head_dim)
    absorb = n * a.qk_head_dim * a.kv_lora_rank + n * a.kv_lora_rank * a.v_head_dim
    latent_qk = a.kv_lora_rank + a.qk_pos_emb_head_dim
    fused = shape.kernel_backend != "none"
    keys = mean_keys(seq, shape.topk) if fused else seq
    core = sparse_attention_work(1, 1, keys, n, latent_qk, a.kv_lora_rank)[0]
    total = 2.0 * (q + kv_down + absorb + n * a.v_head_dim * h) + core
    if computes_topk(shape, layer_number) if indexer is None else indexer:
        total += 2.0 * (shape.q_lora_rank * shape.heads * shape.head_dim + h * shape.head_dim + h * shape.heads)
        total += index_scores_work(1, 1, seq, shape.heads, shape.head_dim, fused, passes=_passes(shape))[0]
        if shape.loss_coeff > 0:
            total += 2.0 * n * seq * latent_qk  # the loss's dense scores
    return total


# -- operators ------------------------------------------------------------------------------------------------------
def ops(b: OpBuilder, a: AttentionSettings, shape: DSAShape, layer_number: int, lowp: bool,
        indexer: bool | None = None) -> list[Pair]:
    """The DSA layer's operators on one rank as `Pair`s (module docstring; `indexer`: as `params`)."""
    c = b.c
    t, h, rows, cp = b.t, b.h, b.tokens, c.cp
    n = c.num_attention_heads // t
    s, mb = b.s, b.b
    latent_qk = a.kv_lora_rank + a.qk_pos_emb_head_dim
    pairs: list[Pair] = []
    fwd, bwd = norm(b, "input_layernorm")
    pairs.append((fwd, bwd, "layernorm"))
    pairs.extend(b.tp_in("self_attention.linear_q_down_proj", MODULE))
    q_in = a.q_lora_rank or h
    if a.q_lora_rank:
        pairs.extend(b.linear("self_attention.linear_q_down_proj", "linear_q_down", rows, a.q_lora_rank, h, MODULE,
                              lowp, bias=False))
        fwd, bwd = norm(b, "self_attention.q_layernorm", rows=rows, width=a.q_lora_rank)
        pairs.append((fwd, bwd, MODULE))
    pairs.extend(b.linear("self_attention.linear_q_up_proj", "linear_q_up", rows, n * a.q_head_dim, q_in,
                          "mla_up_proj", lowp, bias=False))
    pairs.extend(b.linear("self_attention.linear_kv_down_proj", "linear_kv_down", rows, latent_qk, h, MODULE, lowp,
                          bias=False))
    fwd, bwd = norm(b, "self_attention.kv_layernorm", rows=rows, width=a.kv_lora_rank)
    pairs.append((fwd, bwd, MODULE))
    pairs.append((*b.compute("self_attention.q_absorb", "bmm", "bmm", 2.0 * rows * n * a.qk_head_dim * a.kv_lora_rank,
                             True, batch=n, m=rows, n=a.kv_lora_rank, k=a.qk_head_dim), "mla_up_proj"))
    fwd, bwd = b.compute("self_attention.rotary", "elementwise", "RoPE", 0.0, True, rows=rows * (n + 1) / 2.0,
                         width=a.qk_pos_emb_head_dim, heads=(n + 1) / 2.0, head_dim=a.qk_pos_emb_head_dim,
                         numel=rows * (n + 1) / 2.0 * a.qk_pos_emb_head_dim)
    pairs.append((fwd, bwd, "mla_up_proj"))
    keys = s * cp
    if cp > 1:  # the latent keys gathered over CP (DSAttention's all-gather exchange)
        kv = rows * latent_qk * b.bytes
        pairs.append((b.collective("self_attention.cp_key_all_gather", "all_gather", "cp", kv),
                      b.collective("self_attention.cp_key_grad_reduce_scatter", "reduce_scatter", "cp", kv),
                      MODULE))
    if computes_topk(shape, layer_number) if indexer is None else indexer:
        pairs.extend(_indexer(b, a, shape, keys))
    fused = shape.kernel_backend != "none"
    if fused:
        k_sel = mean_keys(keys, shape.topk)
        flops = sparse_attention_work(mb, s, k_sel, n, latent_qk, a.kv_lora_rank)[0]
        fwd, bwd = b.compute("self_attention.core_attention", "sparse_attention", shape.kernel_backend, flops, True,
                             batch=mb, heads=n, kv_heads=1, seq=s, seq_kv=k_sel,
                             head_dim=(latent_qk + a.kv_lora_rank) / 2.0, causal=0)
        pairs.append((fwd, bwd, "core_attn"))
    else:  # PyTorch: dense fp32 scores of every key, the index mask, a masked softmax, the latent values
        scores = b.compute("self_attention.core_attention.scores", "bmm", "bmm", 2.0 * mb * n * s * keys * latent_qk,
                           True, dtype="fp32", batch=mb * n, m=s, n=keys, k=latent_qk)
        pairs.append((*scores, "core_attn"))
        pairs.append((*b.elementwise("self_attention.core_attention.index_mask", "index_mask", mb * s * keys * 2,
                                     keys), "core_attn"))
        softmax = b.compute("self_attention.core_attention.softmax", "softmax", "masked_softmax", 0.0, True,
                            dtype="fp32", batch=mb, heads=n, seq=s, rows=mb * n * s, width=keys,
                            numel=mb * n * s * keys)
        pairs.append((*softmax, "core_attn"))
        context = b.compute("self_attention.core_attention.context", "bmm", "bmm",
                            2.0 * mb * n * s * keys * a.kv_lora_rank, True, batch=mb * n, m=s, n=a.kv_lora_rank,
                            k=keys)
        pairs.append((*context, "core_attn"))
    pairs.append((*b.compute("self_attention.v_up", "bmm", "bmm", 2.0 * rows * n * a.kv_lora_rank * a.v_head_dim,
                             True, batch=n, m=rows, n=a.v_head_dim, k=a.kv_lora_rank), MODULE))
    pairs.extend(b.linear("self_attention.linear_proj", "linear2", rows, h, n * a.v_head_dim, MODULE, lowp,
                          bias=False))
    pairs.extend(b.tp_out("self_attention.linear_proj", MODULE))
    fwd, bwd = b.residual("self_attention.bias_dropout_add")
    pairs.append((fwd, bwd, MODULE))
    return pairs


def _indexer(b: OpBuilder, a: AttentionSettings, shape: DSAShape, keys: int) -> list[Pair]:
    """The indexer on one rank: replicated over TP on the whole sequence (SP gathers its inputs), forward only
    unless its loss is on (module docstring)."""
    c = b.c
    rows, s, mb, hi, di = b.tokens, b.s, b.b, shape.heads, shape.head_dim
    grad = shape.loss_coeff > 0
    pairs: list[Pair] = []
    if b.sp:
        for name, width in (("x", shape.hidden), ("qr", shape.q_lora_rank)):
            nbytes = rows * width * b.bytes / b.t
            pairs.append((b.collective(f"self_attention.indexer.gather_{name}", "all_gather", "tp", nbytes),
                          b.collective(f"self_attention.indexer.gather_{name}.grad", "reduce_scatter", "tp", nbytes)
                          if grad else None, MODULE))

    def add(name: str, primitive: str, variant: str, flops: float = 0.0, dtype: str | None = None,
            **features: float) -> None:
        """One of the indexer's ops: with its backward only when the loss trains it (no spec of an unused one)."""
        if grad:
            fwd, bwd = b.compute(name, primitive, variant, flops, True, False, dtype, **features)
            pairs.append((fwd, bwd, MODULE))
        else:
            pairs.append((_forward(b, name, primitive, variant, flops, dtype, **features), None, MODULE))

    for name, n_out, k_in in (("linear_wq_b", hi * di, shape.q_lora_rank), ("linear_wk", di, shape.hidden),
                              ("linear_weights_proj", hi, shape.hidden)):
        add(f"self_attention.indexer.{name}", "gemm", f"dsa_{name}", 2.0 * rows * n_out * k_in, b.gemm_dtype,
            m=rows, n=n_out, k=k_in, batch=1)
    add("self_attention.indexer.k_norm", "norm", "layernorm", dtype="fp32" if shape.k_norm_fp32 else None,
        rows=rows, width=di, numel=rows * di)
    numel = rows * (hi + 1) * shape.rope_dim
    add("self_attention.indexer.rotary", "elementwise", "RoPE", rows=numel / shape.rope_dim, width=shape.rope_dim,
        numel=numel)
    numel = rows * (hi + 1) * di
    if shape.rotate:
        add("self_attention.indexer.hadamard", "elementwise", "hadamard_rotate", rows=numel / di, width=di,
            numel=numel)
    if c.cp > 1:
        nbytes = rows * di * b.bytes
        pairs.append((b.collective("self_attention.indexer.cp_k_all_gather", "all_gather", "cp", nbytes), None,
                      MODULE))
    fused = shape.kernel_backend != "none"
    flops = index_scores_work(mb, s, keys, hi, di, fused, passes=_passes(shape))[0]
    add("self_attention.indexer.scores", "dsa_index_scores", shape.kernel_backend, flops, batch=mb, seq=s,
        seq_kv=keys, heads=hi, head_dim=di, causal=1 if fused else 0, width=_passes(shape))
    pairs.append((_forward(b, "self_attention.indexer.topk", "dsa_topk", shape.kernel_backend, 0.0, None,
                           rows=mb * s, width=keys, k=shape.topk, numel=mb * s * keys), None, MODULE))
    if grad:  # the KL loss: the main attention's dense fp32 scores per head, their softmax, the target over TP
        n = c.num_attention_heads // b.t
        latent_qk = a.kv_lora_rank + a.qk_pos_emb_head_dim
        scores = _forward(b, "self_attention.indexer_loss.scores", "bmm", "bmm", 2.0 * mb * n * s * keys * latent_qk,
                          "fp32", batch=mb * n, m=s, n=keys, k=latent_qk)
        softmax = _forward(b, "self_attention.indexer_loss.softmax", "softmax", "masked_softmax", 0.0, "fp32",
                           batch=mb, heads=n, seq=s, rows=mb * n * s, width=keys, numel=mb * n * s * keys)
        pairs.append((scores, None, MODULE))
        pairs.append((softmax, None, MODULE))
        pairs.append((b.collective("self_attention.indexer_loss.target_all_reduce", "all_reduce", "tp",
                                   mb * s * keys * FP32), None, MODULE))
    return pairs


def _passes(shape: DSAShape) -> float:
    """Element-wise steps on each index score after the product (`index_scores_work`)."""
    return 3.0 if shape.relu else 2.0


def _forward(b: OpBuilder, name: str, primitive: str, variant: str, flops: float, dtype: str | None,
             **features: float) -> OpUse:
    """A forward-only op (no backward spec made)."""
    return OpUse(name, b.spec(primitive, "fwd", variant, None, dtype, **features), per_layer=True, flops=flops)


# -- the `D` layer as a block (predictor.layers.block.Block) --------------------------------------------------------
def settings_of(c: TrainingConfig) -> tuple[AttentionSettings, DSAShape]:
    """The MLA settings and the indexer's sizes of a configuration with DSA layers."""
    a, hybrid = c.attn, c.hybrid
    assert a is not None and a.multi_latent_attention and hybrid is not None, "a DSA layer without MLA settings"
    return a, hybrid.dsa(c.hidden_size, a.q_lora_rank, a.qk_pos_emb_head_dim)


class DeepSeekSparseAttention:
    """A DSA layer (`D`): absorbed MLA whose core attention reads each query's top-k keys, with its indexer
    (`indexer` True) or reusing an earlier layer's top-k (False: Megatron's `dsa_indexer_topk_freq`)."""

    def __init__(self, indexer: bool):
        self.indexer = indexer
        self.name = "dsa" if indexer else "dsa_shared_topk"

    def ops(self, b: OpBuilder, window: int | None, lowp: bool) -> list[Pair]:
        a, shape = settings_of(b.c)
        return ops(b, a, shape, 1, lowp, indexer=self.indexer)

    def params(self, c: TrainingConfig) -> tuple[int, int]:
        a, shape = settings_of(c)
        return params(a, shape, c.num_attention_heads, c.tp, 1, c.normalization, indexer=self.indexer), 0

    def flops_per_token(self, c: TrainingConfig, layer: int, causal: bool) -> float:
        """As the kernels run it (`flops_per_token`): the fused backends' causal top-k, PyTorch's dense scores."""
        a, shape = settings_of(c)
        return flops_per_token(a, shape, c.num_attention_heads, c.seq_length, indexer=self.indexer)

    def saved(self, c: TrainingConfig, saving: Saving) -> Saved:
        """MLA's (`mla.activation_bytes`), and on PyTorch's path (backend `none`) the fp32 masked softmax's output
        over every key, unless selective recompute replays core attention. The indexer keeps nothing without its
        loss (its inputs are detached); with it, its own inputs are not counted."""
        a, shape = settings_of(c)
        replicated, split = mla.activation_bytes(a, c.hidden_size, c.num_attention_heads, saving.q,
                                                 c.hidden_dropout > 0)
        if shape.kernel_backend == "none" and "core_attn" not in saving.modules:
            split += FP32 * c.num_attention_heads * c.seq_length
        return Saved(replicated, split)

    def matrices(self, c: TrainingConfig, split_qkv: bool) -> tuple[list[Matrix], list[Matrix]]:
        a, shape = settings_of(c)
        dense, _ = ATTENTION.matrices(c, split_qkv)  # MLA's projections (the key's up-projection kept whole)
        if self.indexer:
            dense = dense + [(shape.heads * shape.head_dim, shape.q_lora_rank), (shape.head_dim, shape.hidden),
                             (shape.heads, shape.hidden)]
        return dense, []

    def tensors(self, c: TrainingConfig) -> Tensors:
        """MLA's projections and norms (no biases: DSA refuses them); the indexer's three projections and its
        LayerNorm's weight and bias (a LayerNorm whatever `normalization` says)."""
        a, _ = settings_of(c)
        linears = (2 if a.q_lora_rank else 1) + 3
        norms = 2 + (1 if a.q_lora_rank else 0)
        return Tensors(linears=linears + (3 if self.indexer else 0), biased=0, norms=norms,
                       other=2 if self.indexer else 0)

    def offload_tensors(self, c: TrainingConfig) -> dict[str, list[float]]:
        return ATTENTION.offload_tensors(c)  # the MLA attention's groups, its core attention's as flash's


DSA = DeepSeekSparseAttention(indexer=True)
DSA_SHARED_TOPK = DeepSeekSparseAttention(indexer=False)
