"""The mixture of experts as a layer kind (`predictor.layers.block.Block`): its pre-MLP norm, the router, the local
experts (num_experts / EP of them, each an MLP of the experts' width split over expert TP; a latent MoE's at the
latent width, with its two latent projections replicated over TP) and the shared experts (an MLP split over TP) — its
ops (`predictor.layers.moe.ops`), parameters, FLOPs, saved activations, matrices, parameter tensors and offloadable
groups.

FLOPs count the router, the top-k experts each token visits, the shared experts and a latent MoE's two projections
(the parameters a token touches). Saved activations: the norm's and the router's inputs replicated over TP without
SP; the routed copies (k per token, λ-weighted for the busiest rank, on the experts' ETP ranks) keep FC1's input (at
a latent MoE's latent width), the activation's input and FC2's input each; the shared experts keep what an MLP of
their width does.
"""
from __future__ import annotations

from predictor.ir.ops import OpBuilder, Pair
from predictor.layers.block import Matrix, Saved, Saving, Tensors, local_tokens, norm_params
from predictor.layers.mlp.block import (
    mlp_matrices,
    mlp_params,
    mlp_saved_bytes,
    pre_mlp_norm_saved,
    pre_mlp_norm_tensors,
)
from predictor.layers.moe.ops import moe_block
from tracekit.core.config import TrainingConfig
from tracekit.core.moe import MoESettings


def _moe(c: TrainingConfig) -> MoESettings:
    assert c.moe is not None, "an MoE block of a configuration without experts"
    return c.moe


class MoE:
    name = "moe"

    def ops(self, b: OpBuilder, window: int | None, lowp: bool) -> list[Pair]:
        return moe_block(b, lowp)

    def params(self, c: TrainingConfig) -> tuple[int, int]:
        moe, h = _moe(c), c.hidden_size
        dense = norm_params(c, h) + h * moe.num_experts  # the pre-MLP norm, the router
        if moe.moe_shared_expert_intermediate_size:
            dense += mlp_params(c, moe.moe_shared_expert_intermediate_size, c.tp)
        latent = moe.moe_latent_size
        if latent:  # fc1_latent_proj [h → latent] and fc2_latent_proj [latent → h], replicated over TP
            dense += 2 * h * latent + (latent + h) * c.add_bias_linear
        return dense, moe.local_experts * mlp_params(c, moe.ffn(c.ffn_hidden_size), moe.etp(c.tp), latent)

    def flops_per_token(self, c: TrainingConfig, layer: int, causal: bool) -> float:
        moe, h = _moe(c), c.hidden_size
        width = 3 if c.swiglu else 2
        routed = moe.moe_router_topk * 2.0 * moe.expert_width(h) * moe.ffn(c.ffn_hidden_size) * width
        shared = 2.0 * h * (moe.moe_shared_expert_intermediate_size or 0) * width
        latent = 2.0 * 2 * h * moe.moe_latent_size if moe.moe_latent_size else 0.0  # the two latent projections
        return 2.0 * h * moe.num_experts + routed + shared + latent

    def saved(self, c: TrainingConfig, saving: Saving) -> Saved:
        moe, h, t, q, modules, host = _moe(c), c.hidden_size, c.tp, saving.q, saving.modules, saving.host
        replicated = pre_mlp_norm_saved(c, saving) + 2.0 * h * saving.normed  # the router's input
        f, etp = moe.ffn(c.ffn_hidden_size), moe.etp(t)
        act = 0.0 if "moe" in modules or host & {"moe_act", "fused_group_mlp"} else \
            2.0 * (2 * f if c.swiglu else f) / etp
        fc1_in = 0.0 if host & {"expert_fc1", "fused_group_mlp"} else 2.0 * moe.expert_width(h) * q
        # `moe_act` replays the activation from its input (kept) and frees its output, FC2's input (saved in bf16
        # under fp8: set_save_original_input)
        fc2_in = 0.0 if "fused_group_mlp" in host or "moe_act" in modules else 2.0 * f * q / etp
        per_copy = fc1_in + act + fc2_in
        extra = 0.0
        if "moe" not in modules:
            routed_tokens = saving.tokens / t if c.sequence_parallel else saving.tokens
            extra = moe.moe_router_topk * moe.load_factor() * etp * per_copy * routed_tokens
        split = 0.0
        shared = moe.moe_shared_expert_intermediate_size
        if shared and "shared_experts" not in modules:
            split = mlp_saved_bytes(c, shared, q)
        return Saved(replicated, split, extra)

    def matrices(self, c: TrainingConfig, split_qkv: bool) -> tuple[list[Matrix], list[Matrix]]:
        moe = _moe(c)
        dense = [(moe.num_experts, c.hidden_size)]  # the router
        if moe.moe_shared_expert_intermediate_size:
            dense += mlp_matrices(c, moe.moe_shared_expert_intermediate_size)
        latent = moe.moe_latent_size
        if latent:  # the two latent projections
            dense += [(latent, c.hidden_size), (c.hidden_size, latent)]
        local = max(1, moe.num_experts // moe.ep)
        return dense, mlp_matrices(c, moe.ffn(c.ffn_hidden_size), latent) * local

    def tensors(self, c: TrainingConfig) -> Tensors:
        moe = _moe(c)
        experts = 2 * moe.local_experts
        shared = 2 if moe.moe_shared_expert_intermediate_size else 0
        latent = 2 if moe.moe_latent_size else 0
        # the router, the local experts' fc1/fc2, the shared experts, the latent projections; the pre-MLP norm
        return Tensors(linears=1 + experts + shared + latent, biased=experts + shared + latent, norms=1)

    def offload_tensors(self, c: TrainingConfig) -> dict[str, list[float]]:
        moe = _moe(c)
        tokens = local_tokens(c)
        t, h = c.tp, c.hidden_size
        local = tokens // t if c.sequence_parallel else tokens
        out = pre_mlp_norm_tensors(c)
        f, etp = moe.ffn(c.ffn_hidden_size), moe.etp(t)
        routed = moe.moe_router_topk * moe.load_factor() * etp * local  # token copies reaching this GPU's experts
        fc1_in, act_in = routed * moe.expert_width(h), routed * (2 * f if c.swiglu else f) / etp
        out["expert_fc1"], out["moe_act"] = [fc1_in], [act_in]
        out["fused_group_mlp"] = [fc1_in, act_in, routed * f / etp]
        return out


MOE_BLOCK = MoE()
