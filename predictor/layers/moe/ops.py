"""The MoE half of a decoder layer as Megatron-core runs it (`megatron/core/transformer/moe/`), as a list of `Pair`s
(predictor.ir.ops). Settings and their rules: tracekit.core.moe.

Per micro-batch on one GPU, with T local tokens (the sequence shard of this TP/CP rank), k = top-k, E experts, EP
ranks holding E / EP local experts each split over ETP ranks, and the busiest rank's load factor λ
(`MoESettings.load_factor`):

    pre-MLP norm → router GEMM [T, h] × [h, E] (in moe_router_dtype; never in the fp8 recipe) → scores, top-k and
    the auxiliary loss (elementwise over T · E) → permute (T · k token copies, by expert) → dispatch → ETP all-gather
    → the local experts, each FC1 [λ · T · k · ETP / local, h] × [h, f/ETP (×2 with SwiGLU)], activation, FC2 back to
    h: one grouped GEMM of `local` equal groups (a `gemm` row with `batch` = local experts: each group's efficiency,
    the waves of all of them) with `moe_grouped_gemm` (not in the local implementation: its SequentialMLP), else one
    GEMM per local expert → ETP reduce-scatter → combine
    → unpermute and the weighted sum → shared experts (an MLP of their own width, split over TP) → bias-dropout-add.

Dispatch and combine, by dispatcher: `alltoall` sends each token copy to its expert's rank (an all-to-all of T · k ·
h elements over the EP group, λ-weighted for the busiest rank); `allgather` gathers every token of the TP·EP group
(an all-gather of T · h) and reduce-scatters the outputs; the flex dispatcher's fused kernels (`deepep`,
`hybridep`) send a token once per destination rank inside a node, once per destination node across nodes
(predictor.layers.moe.dispatch counts the copies). Backward runs the same exchanges in reverse order, the experts' GEMMs
twice (dgrad and wgrad).

Latent MoE (`moe_latent_size`): the [T, h] × [h, latent] projection before the permute and [T, latent] × [latent, h]
after the unpermute (replicated over TP); the permute, dispatch, experts and combine work at the latent width.

The router's and the dispatcher's other calls (loss bookkeeping, Sinkhorn, metadata, the probabilities' exchanges)
and the synchronisations they make are predictor.layers.moe.host_calls'.
"""
from __future__ import annotations

from predictor.ir.ops import OpBuilder, Pair
from predictor.layers.local_kernels import mlp_activation
from predictor.layers.mlp.bias_dropout_add import bias_add
from predictor.layers.mlp.ops import dense_mlp
from predictor.layers.moe.dispatch import dispatch_tokens
from predictor.layers.moe.grouped_mlp import fc2_bias, glu_clamp
from predictor.layers.moe.host_calls import dispatch_calls, router_calls, shared_add
from predictor.layers.moe.host_syncs import mark_first_forward, token_count_syncs
from predictor.layers.norm_rope import norm
from tracekit.core.layer_impl import kernels


def moe_block(b: OpBuilder, lowp: bool) -> list[Pair]:
    """The MoE half of an MoE layer (module docstring)."""
    c, h = b.c, b.h
    moe = c.moe
    assert moe is not None
    tokens: float = b.sp_tokens  # local tokens: the sequence shard of this rank (MoE with TP needs SP)
    k, experts, ep, etp = moe.moe_router_topk, moe.num_experts, moe.ep, moe.etp(c.tp)
    local = moe.local_experts
    load = moe.load_factor()
    f = moe.ffn(c.ffn_hidden_size)
    d = moe.expert_width(h)  # the width tokens travel and the experts compute at (the latent size, else hidden)
    act = b.bytes
    pairs: list[Pair] = []
    fwd, bwd = norm(b, "pre_mlp_layernorm")
    pairs.append((fwd, bwd, "layernorm"))
    router_dtype = "fp32" if str(moe.moe_router_dtype or "").lower() in ("fp32", "float32") else None
    fwd, bwd = b.gemm("mlp.router", "router", tokens, experts, h, bias=False, dtype=router_dtype or b.dtype)
    pairs.append((fwd, bwd, "moe"))
    fwd, bwd = b.elementwise("mlp.router.topk", "router_topk", tokens * experts, experts)
    pairs.append((fwd, bwd, "moe"))
    pairs.extend(router_calls(b))  # the router's own calls around them (predictor.layers.moe.host_calls)
    before, after, permute_syncs = dispatch_calls(b)  # the dispatcher's metadata and probabilities
    copies = tokens * k  # token copies this rank routes
    if moe.moe_latent_size:
        pairs.extend(b.linear("mlp.fc1_latent_proj", "latent_proj", tokens, d, h, "moe", lowp))
    fwd, bwd = b.elementwise("mlp.token_dispatcher.permute", "moe_permute", copies * d, d)
    fwd.syncs += permute_syncs
    pairs.append((fwd, bwd, "moe"))
    dispatcher = moe.dispatcher
    received = copies * load * etp  # token copies the busiest rank's experts compute
    dispatch: list[Pair] = []
    combine: list[Pair] = []
    if dispatcher == "allgather":
        shard = tokens * d * act
        dispatch.append((b.collective("mlp.token_dispatcher.all_gather", "all_gather", "tpep", shard),
                         b.collective("mlp.token_dispatcher.all_gather.grad", "reduce_scatter", "tpep", shard), "moe"))
        combine.append((b.collective("mlp.token_dispatcher.reduce_scatter", "reduce_scatter", "tpep", shard),
                        b.collective("mlp.token_dispatcher.reduce_scatter.grad", "all_gather", "tpep", shard), "moe"))
    else:
        place = b.groups["ep"]
        sent = dispatch_tokens(dispatcher, tokens, experts, ep, k, place.nodes, place.ranks_per_node)
        nbytes = sent * load * d * act
        variant = "alltoall" if dispatcher == "alltoall" else dispatcher
        for name, where in (("dispatch", dispatch), ("combine", combine)):
            where.append((b.collective(f"mlp.token_dispatcher.{name}", "all_to_all", "ep", nbytes, variant=variant),
                          b.collective(f"mlp.token_dispatcher.{name}.grad", "all_to_all", "ep", nbytes,
                                       variant=variant), "moe"))
        if etp > 1:
            shard = copies * load * d * act
            dispatch.append((b.collective("mlp.token_dispatcher.etp_all_gather", "all_gather", "etp", shard),
                             b.collective("mlp.token_dispatcher.etp_all_gather.grad", "reduce_scatter", "etp", shard),
                             "moe"))
            combine.insert(0, (b.collective("mlp.token_dispatcher.etp_reduce_scatter", "reduce_scatter", "etp",
                                            shard),
                               b.collective("mlp.token_dispatcher.etp_reduce_scatter.grad", "all_gather", "etp",
                                            shard), "moe"))
    pairs.extend(dispatch)
    pairs.extend(before)
    f_e = f // etp
    fc1_out = 2 * f_e if c.swiglu else f_e
    # the local experts' GEMMs: one grouped GEMM of `local` equal groups (moe_grouped_gemm), else one GEMM each
    per_expert = received / local
    grouped = moe.moe_grouped_gemm and not kernels(c).local  # the local spec's experts are a SequentialMLP
    runs = [("", local)] if grouped else [(f".{e}", 1) for e in range(local)]
    for suffix, batch in runs:
        variant = "grouped" if batch > 1 else "expert"
        fc1 = b.linear(f"mlp.experts.linear_fc1{suffix}", f"{variant}_fc1", per_expert, fc1_out, d, "moe", lowp,
                       batch=batch)
        if not suffix or suffix == ".0":  # the token counts reach the host before the first expert's GEMM
            mark_first_forward(fc1, token_count_syncs(moe))
        pairs.extend(fc1)
        clamp = glu_clamp(b, per_expert * batch, fc1_out)
        # the quick-GELU GLU's torch.tensor(linear_offset) (predictor.layers.moe.host_syncs)
        mark_first_forward(clamp, 1)
        pairs.extend(clamp)
        pairs.extend(mlp_activation(b, f"mlp.experts.activation{suffix}", per_expert * batch, f_e, "moe_act"))
        pairs.extend(b.linear(f"mlp.experts.linear_fc2{suffix}", f"{variant}_fc2", per_expert, d, f_e, "moe", lowp,
                              batch=batch))
    if grouped:  # TEGroupedMLP (predictor.layers.moe.grouped_mlp)
        pairs.extend(fc2_bias(b, received, d))
    pairs.extend(after)
    pairs.extend(combine)
    fwd, bwd = b.elementwise("mlp.token_dispatcher.unpermute", "moe_unpermute", copies * d, d)
    pairs.append((fwd, bwd, "moe"))
    if moe.moe_latent_size:
        pairs.extend(b.linear("mlp.fc2_latent_proj", "latent_proj", tokens, h, d, "moe", lowp))
    shared = moe.moe_shared_expert_intermediate_size
    if shared:
        pairs.extend(dense_mlp(b, shared, lowp, prefix="mlp.shared_experts", module="shared_experts"))
        pairs.extend(shared_add(b))
    pairs.extend(bias_add(b, "mlp", "moe", bias=False))  # unfused bias-dropout-add: its dropout, no bias
    fwd, bwd = b.residual("mlp.bias_dropout_add")
    pairs.append((fwd, bwd, "moe"))
    return pairs

