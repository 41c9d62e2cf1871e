"""The Gated DeltaNet layer (`G`, and a GPT model's linear-attention layers) as Megatron-core runs it in training
(`megatron/core/ssm/gated_delta_net/`: `_GDNBase`, `GatedDeltaNet`, `GatedDeltaNet2`), as pure functions of its sizes
(`tracekit.core.hybrid_shapes.GDNShape`) and the parallel split.

Design note
-----------
One layer: the input norm fused into the in-projection (LayerNormColumnParallelLinear; SP: all-gather) →
in-projection [tokens, hidden] × [hidden, in_proj/tp] giving q, k, v, the output gate z and β, α (GDN2: f, b, w) →
with CP one all-to-all of the whole projection from sequence to head shards → FLA's causal depthwise convolution with
SiLU over q, k, v (no bias) → L2 norm of q and k, q and k repeated from the key heads to the value heads, the gates
g = −exp(A_log)·softplus(α + dt_bias) and β = sigmoid(β) (one fused pass) → FLA's chunked gated delta rule
(`scan_work.gdn_work`, chunk 64; its backward recomputes its intermediates: the whole forward counted again, an
upper bound) → the
output norm (RMSNorm over each value head) times silu(z), then with CP the all-to-all back (module `gdn_norm_out`:
selective recompute of `gdn_norm_out` replays them) → out-projection (all-reduce, or SP reduce-scatter) → residual add.
Heads split over TP, and again over CP (key and value heads divisible by tp·cp).

Saved per token (bytes, whole layer; `q` a GEMM input's bytes over bf16's): the norm's and the in-projection's
inputs (2h each, replicated unless SP), then split over TP: the projection (its q, k, v slice the convolution keeps
holds the whole buffer: 2·in_proj), the convolution's output (2·conv_dim, the L2 norm's input), q and k after the
repeat (2·2·Hv·dk), g in fp32 and β (6·Hv), the rule's output (2·v_dim, the norm's input) and the norm's rstd
(4·Hv), the out-projection's input (2·q·v_dim).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from predictor.ir.ops import OpBuilder, OpUse, Pair
from predictor.layers.block import Matrix, Saved, Saving, Tensors, norm_params
from predictor.layers.norm_rope import norm
from tracekit.core.config import TrainingConfig
from tracekit.core.hybrid_shapes import GDNShape

from .scan_work import CONV, GDN_RULE, conv_work, gdn_work

MODULE = "attention"  # a TransformerLayer's self_attention: Megatron's selective modules name its parts so


@dataclass(frozen=True)
class GDNLocal:
    key_heads: int  # per TP rank
    value_heads: int
    qk_dim: int
    v_dim: int
    in_proj: int
    conv_dim: int


def local(shape: GDNShape, tp: int, cp: int = 1) -> GDNLocal:
    """Per-TP-rank sizes; ConfigError with Megatron's reason where it refuses the split."""
    shape.check_split(tp, cp)
    return GDNLocal(shape.key_heads // tp, shape.value_heads // tp, shape.qk_dim // tp, shape.v_dim // tp,
                    shape.in_proj_dim // tp, shape.conv_dim // tp)


def param_tensors(shape: GDNShape, tp: int = 1, normalization: str = "RMSNorm") -> list[tuple[str, tuple[int, ...]]]:
    """The parameter tensors of one GDN layer on one TP rank, as `_GDNBase` builds them (conv without bias)."""
    g = local(shape, tp)
    h = shape.hidden
    gate_dims = (g.value_heads, g.value_heads) if shape.variant == "gdn" else (g.qk_dim, g.key_heads)
    tensors: list[tuple[str, tuple[int, ...]]] = [("self_attention.in_proj.layer_norm_weight", (h,))]
    if normalization != "RMSNorm":
        tensors.append(("self_attention.in_proj.layer_norm_bias", (h,)))
    tensors += [("self_attention.in_proj.weight", (g.in_proj, h)),
                ("self_attention.conv1d.weight", (g.conv_dim, 1, shape.conv_kernel)),
                ("self_attention.dt_bias", (gate_dims[0],)),
                ("self_attention.A_log", (gate_dims[1],)),
                ("self_attention.out_norm.weight", (shape.value_dim,))]
    if normalization != "RMSNorm":
        tensors.append(("self_attention.out_norm.bias", (shape.value_dim,)))
    tensors.append(("self_attention.out_proj.weight", (h, g.v_dim)))
    return tensors


def params(shape: GDNShape, tp: int = 1, normalization: str = "RMSNorm") -> int:
    return sum(math.prod(dims) for _, dims in param_tensors(shape, tp, normalization))


def flops_per_token(shape: GDNShape, seq: int) -> float:
    """Forward FLOPs per token of one GDN layer (all TP ranks), as the kernels run it."""
    h = shape.hidden
    rule, _ = gdn_work(1, seq, shape.value_heads, shape.key_dim, shape.value_dim, shape.chunk)
    conv, _ = conv_work(1, shape.conv_dim, shape.conv_kernel)
    return 2.0 * h * shape.in_proj_dim + conv + rule / seq + 2.0 * shape.v_dim * h


def megatron_flops_per_token(shape: GDNShape) -> float:
    """Forward FLOPs per token as Megatron's `gdn_layer_flops` counts them (the state terms only: 4 products of
    dv² per value head, no chunk terms)."""
    h = shape.hidden
    return 2.0 * (h * shape.in_proj_dim + shape.conv_kernel * shape.conv_dim
                  + shape.value_heads * shape.value_dim ** 2 * 4 + h * shape.v_dim)


def activation_bytes(shape: GDNShape, lowp_bytes: float = 1.0, hidden_dropout: bool = False) -> tuple[float, float]:
    """(replicated, split) bytes per token one GDN layer keeps (module docstring), as `mamba.activation_bytes`."""
    h = shape.hidden
    replicated = 2.0 * h + 2.0 * h * lowp_bytes + (1.0 * h if hidden_dropout else 0.0)
    hv = shape.value_heads
    split = (2.0 * shape.in_proj_dim + 2.0 * shape.conv_dim + 4.0 * hv * shape.key_dim + 6.0 * hv
             + 2.0 * shape.v_dim + 4.0 * hv + 2.0 * shape.v_dim * lowp_bytes)
    return replicated, split


def state_bytes(shape: GDNShape, tp: int, cp: int, batch: int, seq: int) -> dict[str, float]:
    """Chunk states of the rule on one rank (fp32, per chunk and value head dk × dv) and inference's per-sequence
    states (Megatron's `mamba_state_shapes_per_request`: conv [conv_dim/tp, K], rule [Hv/tp, dk, dv])."""
    g = local(shape, tp, cp)
    n_chunks = batch * -(-seq // shape.chunk)
    return {"chunk_states": float(n_chunks * (g.value_heads // cp) * shape.key_dim * shape.value_dim * 4),
            "conv_state_per_sequence": float(g.conv_dim * shape.conv_kernel * 2),
            "ssm_state_per_sequence": float(g.value_heads * shape.key_dim * shape.value_dim * 2)}


def ops(b: OpBuilder, shape: GDNShape, lowp: bool) -> list[Pair]:
    """The GDN layer's operators on one rank as `Pair`s (module docstring)."""
    c = b.c
    cp = c.cp
    g = local(shape, b.t, cp)
    rows = b.tokens
    pairs: list[Pair] = []
    fwd, bwd = norm(b, "self_attention.in_proj.layer_norm")
    pairs.append((fwd, bwd, MODULE))
    pairs.extend(b.tp_in("self_attention.in_proj", MODULE))
    pairs.extend(b.linear("self_attention.in_proj", "gdn_in_proj", rows, g.in_proj, b.h, MODULE, lowp, bias=False))
    if cp > 1:
        nbytes = rows * g.in_proj * b.bytes
        pairs.append((b.collective("self_attention.cp.in", "all_to_all", "cp", nbytes),
                      b.collective("self_attention.cp.in.grad", "all_to_all", "cp", nbytes), MODULE))
    seq, mb = b.s * cp, b.b
    tokens = seq * mb  # the rule runs over the whole sequence of this rank's heads
    channels = g.conv_dim // cp
    pairs.append((*b.compute("self_attention.conv1d", CONV, CONV, conv_work(tokens, channels, shape.conv_kernel)[0],
                             True, batch=mb, seq=seq, rows=tokens, width=channels, k=shape.conv_kernel,
                             numel=tokens * channels), MODULE))
    hv, hk = g.value_heads // cp, g.key_heads // cp
    qk = tokens * 2 * hk * shape.key_dim
    pairs.append((*b.elementwise("self_attention.l2norm", "l2norm", qk, shape.key_dim), MODULE))
    if hv > hk:  # q and k repeated to the value heads (a copy)
        pairs.append((*b.elementwise("self_attention.repeat_qk", "repeat_interleave", tokens * 2 * hv * shape.key_dim,
                                     shape.key_dim), MODULE))
    pairs.append((*b.elementwise("self_attention.gates", "gdn_gates", tokens * hv * 2, hv), MODULE))
    flops = gdn_work(mb, seq, hv, shape.key_dim, shape.value_dim, shape.chunk)[0]
    rule = b.compute("self_attention.gated_delta_rule", GDN_RULE, shape.variant, flops, True, batch=mb, seq=seq,
                     heads=hv, kv_heads=hk, head_dim=shape.value_dim, width=shape.key_dim, seq_kv=shape.chunk,
                     numel=tokens * hv * shape.value_dim)
    pairs.append((*rule, MODULE))
    pairs.append((None, OpUse("self_attention.gated_delta_rule.recompute", rule[0].spec, per_layer=True, flops=flops,
                              recompute=True, launch=False), MODULE))
    fwd, bwd = norm(b, "self_attention.out_norm", rows=tokens * hv, width=shape.value_dim)
    pairs.append((fwd, bwd, "gdn_norm_out"))
    pairs.append((*b.elementwise("self_attention.out_gate", "gate_silu_mul", tokens * hv * shape.value_dim,
                                 shape.value_dim), "gdn_norm_out"))
    if cp > 1:
        nbytes = rows * g.v_dim * b.bytes
        pairs.append((b.collective("self_attention.cp.out", "all_to_all", "cp", nbytes),
                      b.collective("self_attention.cp.out.grad", "all_to_all", "cp", nbytes), "gdn_norm_out"))
    pairs.extend(b.linear("self_attention.out_proj", "gdn_out_proj", rows, b.h, g.v_dim, MODULE, lowp, bias=False))
    pairs.extend(b.tp_out("self_attention.out_proj", MODULE))
    fwd, bwd = b.residual("self_attention.bias_dropout_add")
    pairs.append((fwd, bwd, MODULE))
    return pairs


# -- the `G` layer as a block (predictor.layers.block.Block) --------------------------------------------------------
def shape_of(c: TrainingConfig) -> GDNShape:
    assert c.hybrid is not None, "a Gated DeltaNet layer of a configuration without hybrid settings"
    return c.hybrid.gdn(c.hidden_size)


#: Parameters of one layer that are neither a linear layer's weight nor a norm's: the convolution's weight, dt_bias
#: and A_log (`param_tensors`' names).
NON_MATRIX = ("self_attention.conv1d.weight", "self_attention.dt_bias", "self_attention.A_log")


class GatedDeltaNet:
    """A Gated DeltaNet layer (`G`, or a GPT layer's linear attention): the fused input norm and in-projection, the
    convolution, the chunked gated delta rule, the output norm and gate, the out-projection (module docstring)."""

    name = "gdn"

    def ops(self, b: OpBuilder, window: int | None, lowp: bool) -> list[Pair]:
        return ops(b, shape_of(b.c), lowp)

    def params(self, c: TrainingConfig) -> tuple[int, int]:
        return params(shape_of(c), c.tp, c.normalization), 0

    def flops_per_token(self, c: TrainingConfig, layer: int, causal: bool) -> float:
        return flops_per_token(shape_of(c), c.seq_length)

    def saved(self, c: TrainingConfig, saving: Saving) -> Saved:
        """`activation_bytes`; selective recompute of `gdn_norm_out` (Megatron's CheckpointWithoutOutput) frees the
        output norm and gate's output, the out-projection's input, and replays them in the backward."""
        shape = shape_of(c)
        replicated, split = activation_bytes(shape, saving.q, c.hidden_dropout > 0)
        if "gdn_norm_out" in saving.modules:
            split -= 2.0 * shape.v_dim * saving.q
        return Saved(replicated, split)

    def matrices(self, c: TrainingConfig, split_qkv: bool) -> tuple[list[Matrix], list[Matrix]]:
        shape = shape_of(c)
        return [(shape.in_proj_dim, c.hidden_size), (c.hidden_size, shape.v_dim)], []

    def tensors(self, c: TrainingConfig) -> Tensors:
        """The two projections (no bias), the input norm and the output norm, and `NON_MATRIX`."""
        return Tensors(linears=2, biased=0, norms=2, other=len(NON_MATRIX))

    def offload_tensors(self, c: TrainingConfig) -> dict[str, list[float]]:
        return {}  # GatedDeltaNet opens no offload group (the layer's input norm is fused into its in-projection)


def norm_parameters(c: TrainingConfig) -> int:
    """The norms' parameters of one `G` layer on one TP rank: the input norm and the per-head output norm."""
    return norm_params(c, c.hidden_size) + norm_params(c, shape_of(c).value_dim)


GDN = GatedDeltaNet()
