"""A hybrid model's FLOPs as Megatron counts them (`num_floating_point_operations` in the snapshot's
`megatron/training/training.py`, its `hybrid_flops`): what Megatron logs as TFLOP/s and what Megatron-Bridge's
published "Model TFLOP/s/GPU" of its hybrid rows are (Nemotron 3 Nano's published TFLOP/s over its tokens/s give this
count per token to 0.1%). It is an accounting, not the kernels' work (`predictor.layers.ssm.mamba.flops_per_token`
counts those):

- a Mamba layer takes d_in = 2·hidden whatever `--mamba-num-heads` makes d_inner, heads = d_in / head_dim unless
  given: 2·h·(2·d_in + 2·G·N + heads) + 7·d_in·N + 2·d_in·h per token;
- an attention layer (`*`): 4·h·p·(h + h·g/n) per token plus 2·s·h·p (scores, causal, per token of a full
  sequence), p = kv_channels·heads / h, g the query groups with --group-query-attention (else the heads);
- an MLP layer: 4·(ffn/h)·h² (×3/2 with SwiGLU); an MoE layer: 4·h·ffn_e·topk (×3/2 with SwiGLU; a latent MoE's experts
  at the latent width plus 4·h·latent) plus the shared experts 4·h·shared (×3/2);
- a GDN layer: 2·(h·in_proj + K·(2·qk + v) + 4·Hv·dv² + h·v);
- `D` and `+` layers count nothing (Megatron's hybrid count leaves them out), nor do norms, the convolution of Mamba;
- the logits 2·h·vocab per token, once more per MTP depth; the MTP depths' own layers are counted with the main ones.
Forward × 3 for the iteration.
"""
from __future__ import annotations

from tracekit.core.hybrid_pattern import ATTENTION, GDN, MAMBA, MLP, MOE, layer_counts

from .ssm.gated_delta_net import megatron_flops_per_token as gdn_flops
from .ssm.mamba import megatron_flops_per_token as mamba_flops


def attention_flops(hidden: int, seq: int, heads: int, groups: int | None, kv_channels: int | None) -> float:
    """Megatron's `attn_layer_flops` per token (groups None: no --group-query-attention)."""
    p = kv_channels * heads / hidden if kv_channels else 1.0
    g = groups if groups else heads
    return 4.0 * hidden * p * (hidden + hidden * g / heads) + 2.0 * seq * hidden * p


def mlp_flops(hidden: int, ffn: int, swiglu: bool) -> float:
    return 4.0 * (ffn / hidden) * (1.5 if swiglu else 1.0) * hidden ** 2


def moe_flops(hidden: int, ffn: int, shared: int, topk: int, latent: int | None, swiglu: bool) -> float:
    scale = 1.5 if swiglu else 1.0
    if latent is None:
        routed = 4.0 * hidden * ffn * topk * scale
    else:
        routed = 4.0 * latent * ffn * topk * scale + 4.0 * hidden * latent
    return routed + 4.0 * hidden * shared * scale


def hybrid_flops_per_token(pattern: str, *, hidden: int, seq: int, vocab: int, heads: int,
                           query_groups: int | None = None, kv_channels: int | None = None, ffn: int = 0,
                           swiglu: bool = False, moe_ffn: int = 0, moe_shared: int = 0, moe_topk: int = 1,
                           moe_latent: int | None = None, mamba_state: int = 128, mamba_head_dim: int = 64,
                           mamba_groups: int = 8, mamba_heads: int | None = None, gdn=None,
                           mtp_num_layers: int = 0) -> float:
    """Megatron's FLOPs per token of one training iteration (forward × 3) of a hybrid model (module docstring);
    `gdn`: a `tracekit.core.hybrid_shapes.GDNShape` when the pattern has `G` layers; `vocab` the padded vocabulary."""
    counts = layer_counts(pattern)
    fwd = (counts[ATTENTION] * attention_flops(hidden, seq, heads, query_groups, kv_channels)
           + counts[MLP] * mlp_flops(hidden, ffn, swiglu)
           + counts[MAMBA] * mamba_flops(hidden, mamba_state, mamba_head_dim, mamba_groups, mamba_heads)
           + counts[MOE] * moe_flops(hidden, moe_ffn, moe_shared, moe_topk, moe_latent, swiglu)
           + 2.0 * hidden * vocab * (1 + mtp_num_layers))
    if counts[GDN]:
        if gdn is None:
            raise ValueError("the pattern has G layers: pass their GDNShape")
        fwd += counts[GDN] * gdn_flops(gdn)
    return 3.0 * fwd
