"""The ends of the model as Megatron builds them: the vocab-parallel embedding (and learned positions), the final norm,
output layer and vocab-parallel cross-entropy (three TP all-reduces of fp32 partials; the loss function's checks of the
loss on the host, `tracekit.core.runtime.result_checks`), and the multi-token-prediction
layers (DeepSeek-V3's MTP: the next token's embedding and the hidden state, both normalised, concatenated and projected
[2h → h], one decoder layer, the final norm, the shared output layer and its cross-entropy). The output layer stays in
the training dtype under a low-precision recipe (it is not a Transformer Engine linear)."""
from __future__ import annotations

from dataclasses import replace

from predictor.ir.ops import OpBuilder, OpUse, parts
from predictor.layers.embedding.cross_entropy import variant as ce_variant
from predictor.layers.norm_rope import norm
from tracekit.core.runtime import result_checks


def embedding(b: OpBuilder) -> tuple[list[OpUse], list[OpUse]]:
    c, rows, h = b.c, b.tokens, b.h
    fwd_ops: list[OpUse] = []
    bwd_ops: list[OpUse] = []
    emb = b.compute("embedding.word_embeddings", "embedding", "embedding", 0.0, False,
                    rows=rows, width=h, params=b.v // b.t, numel=rows * h, tp=b.t)
    fwd_ops.append(emb[0])
    bwd_ops.extend(parts(emb[1]))
    reduce = ("reduce_scatter", b.sp_tokens * h * b.bytes) if b.sp else ("all_reduce", rows * h * b.bytes)
    op = b.collective(f"embedding.word_embeddings.{reduce[0]}", reduce[0], "tp", reduce[1], False)
    if op:
        fwd_ops.append(op)
    if c.learned_positions:
        pos = b.residual("embedding.position_embeddings", per_layer=False)
        fwd_ops.append(pos[0])
        bwd_ops[:0] = parts(pos[1])
    return fwd_ops, bwd_ops


def head(b: OpBuilder, prefix: str = "") -> tuple[list[OpUse], list[OpUse]]:
    """Final norm, output layer and cross-entropy (`prefix` names an MTP layer's copy)."""
    rows, h, v_t = b.tokens, b.h, b.v // b.t
    fwd: list[OpUse] = []
    bwd: list[OpUse] = []
    final_norm = norm(b, f"{prefix}final_layernorm", per_layer=False)
    fwd.append(final_norm[0])
    full_act = rows * h * b.bytes
    if b.sp:  # SP needs tp > 1: the all-gather is there
        gather = b.collective(f"{prefix}output_layer.all_gather", "all_gather", "tp", full_act / b.t, False)
        if gather:
            fwd.append(gather)
    lm = b.gemm(f"{prefix}output_layer", "linear_final", rows, v_t, h, per_layer=False, bias=False, dtype=b.dtype)
    fwd.append(lm[0])
    ce = b.compute(f"{prefix}loss.vocab_parallel_cross_entropy", "cross_entropy", ce_variant(b.c.extra),
                   0.0, False, rows=rows, width=v_t, numel=rows * v_t, tp=b.t)
    if not prefix:  # the loss function's NaN/Inf checks read the micro-batch's loss on the host (runtime)
        ce[0].syncs = result_checks(b.c).loss_syncs
    fwd.append(ce[0])
    for what in ("max", "predicted", "sum_exp"):  # the three TP all-reduces of vocab-parallel CE (fp32)
        op = b.collective(f"{prefix}loss.all_reduce_{what}", "all_reduce", "tp", rows * 4, False)
        if op:
            fwd.append(op)
    bwd.extend(parts(ce[1]))
    bwd.extend(parts(lm[1]))
    if b.sp:
        op = b.collective(f"{prefix}output_layer.grad_reduce_scatter", "reduce_scatter", "tp", full_act / b.t, False)
    else:
        op = b.collective(f"{prefix}output_layer.grad_all_reduce", "all_reduce", "tp", full_act, False)
    if op:
        bwd.append(op)
    bwd.extend(parts(final_norm[1]))
    return fwd, bwd


def mtp_ends(b: OpBuilder, index: int) -> tuple[list[OpUse], list[OpUse], list[OpUse], list[OpUse]]:
    """(ops before the MTP layer's decoder layer, after it) forward, and their backward (before, after in backward
    order) of MTP layer `index`: the embedding of the shifted tokens, the two norms, the [2h → h] projection (column
    parallel over TP, gathered with SP); then the final norm, output layer and cross-entropy."""
    prefix = f"mtp.layers.{index}."
    rows, h = b.tokens, b.h
    emb_fwd, emb_bwd = embedding(b)
    emb_fwd = [replace(o, name=prefix + o.name, per_layer=False) for o in emb_fwd]
    emb_bwd = [replace(o, name=prefix + o.name, per_layer=False) for o in emb_bwd]
    pre_fwd, pre_bwd = list(emb_fwd), list[OpUse]()
    for name in ("enorm", "hnorm"):
        fwd, bwd = norm(b, prefix + name, per_layer=False)
        pre_fwd.append(fwd)
        pre_bwd.extend(parts(bwd))
    proj = b.gemm(prefix + "eh_proj", "eh_proj", rows, h // b.t, 2 * h, per_layer=False, bias=False)
    pre_fwd.append(proj[0])
    pre_bwd = list(parts(proj[1])) + pre_bwd + emb_bwd
    post_fwd, post_bwd = head(b, prefix)
    return pre_fwd, post_fwd, pre_bwd, post_bwd
