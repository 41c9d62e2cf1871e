"""The Mamba2 layer (`M`) as Megatron-core runs it in training (`megatron/core/ssm/mamba_layer.py`,
`mamba_mixer.py`, `mamba_context_parallel.py`, built by `hybrid_stack_spec`), as pure functions of its sizes
(`tracekit.core.hybrid_shapes.MambaShape`) and the parallel split: its operators, parameters, FLOPs, saved activations
and states.

Design note
-----------
One layer: the input norm fused into the in-projection (Transformer Engine's LayerNormColumnParallelLinear; SP:
all-gather of the input) → in-projection [tokens, hidden] × [hidden, (2·d_inner + 2·G·N + H)/tp] giving z, x, B, C,
dt → with CP, five all-to-alls (z, x, B, C, dt) from sequence shards to head shards (B and C repeated where a rank
holds part of a group) → `mamba_split_conv1d_scan_combined`: one autograd call that runs the depthwise causal
convolution with SiLU over x, B, C, then the SSD kernels (`scan_work`), the gate silu(z) inside the chunk scan → with
CP, one all-to-all back → the grouped RMSNorm over d_inner/tp (mamba_ssm's Triton kernel; no gate: Megatron gates in
the scan) → out-projection [tokens, d_inner/tp] × [d_inner/tp, hidden] (all-reduce, or SP reduce-scatter) → residual
add. No linear biases (MambaMixer asserts none).

Tensor parallelism splits heads and groups (every rank at least one of each); context parallelism splits the heads
of each rank again over the CP ranks for the convolution and scan (the sequence whole), which is why a Mamba layer's
CP costs six all-to-alls forward (and six backward) instead of ring exchanges, and no sequence balancing beyond
undoing attention's. The scan's work is linear in the sequence, attention's quadratic (`scan_work`).

Backward: each op's gradients; the combined call's backward first recomputes the convolution, the cumulative sums,
the chunk states and C·Bᵀ (forward rows in the backward), since its forward saved only its input (z, x, B, C, dt)
and the ungated scan output. Saved per token (bytes, 2-byte activations; `q` for a GEMM input kept in a low-precision
recipe's format): the norm's input and the in-projection's input (2h each, replicated over TP unless SP), the hidden
dropout mask (h, with dropout), then split over TP: z, x, B, C, dt (2·in_proj/tp), the ungated scan output
(2·d_inner/tp), the norm's input and its per-group rstd (2·d_inner/tp + 4·G/tp), the out-projection's input
(2·q·d_inner/tp). Full recompute keeps the layer input only (Megatron's HybridStack checkpoints whole layers); no
selective recompute module names a Mamba part. The chunk states (fp32, (T/Q)·H·P·N per rank) live only inside the
call; the recurrent conv and SSM states are inference's, per sequence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from predictor.ir.ops import OpBuilder, OpUse, Pair
from predictor.layers.block import Matrix, Saved, Saving, Tensors, norm_params
from predictor.layers.norm_rope import FUSED_RMSNORM, norm
from tracekit.core.config import TrainingConfig
from tracekit.core.hybrid import HybridSettings
from tracekit.core.hybrid_shapes import MambaShape

from .scan_work import CONV, RECOMPUTED, SSD_KERNELS, chunks, conv_work, ssd_backward_work, ssd_work

MODULE = "mamba"


@dataclass(frozen=True)
class MambaLocal:
    """One rank's share of a Mamba2 mixer (MambaMixer / MambaContextParallel's rules)."""

    heads: int  # per TP rank
    groups: int
    d_inner: int
    in_proj: int  # the in-projection's output per TP rank
    conv_dim: int
    scan_heads: int  # per TP·CP rank: what the convolution and scan run over
    scan_groups: int
    scan_d_inner: int
    group_repeat: int  # how many CP ranks share one group's B and C


def local(shape: MambaShape, tp: int, cp: int = 1) -> MambaLocal:
    """The per-rank sizes; ConfigError with Megatron's reason where it refuses the split."""
    shape.check_split(tp, cp)
    heads, groups = shape.heads // tp, shape.groups // tp
    d_inner = shape.d_inner // tp
    repeat, scan_groups = (cp // groups, 1) if groups < cp else (1, groups // cp)
    return MambaLocal(heads, groups, d_inner, 2 * d_inner + 2 * groups * shape.state + heads,
                      d_inner + 2 * groups * shape.state, heads // cp, scan_groups, d_inner // cp, repeat)


# -- parameters -----------------------------------------------------------------------------------------------------
def param_tensors(shape: MambaShape, tp: int = 1, normalization: str = "RMSNorm") -> list[tuple[str, tuple[int, ...]]]:
    """The parameter tensors of one Mamba layer on one TP rank, as MambaLayer / MambaMixer build them."""
    m = local(shape, tp)
    h = shape.hidden
    tensors: list[tuple[str, tuple[int, ...]]] = [("mixer.in_proj.layer_norm_weight", (h,))]
    if normalization != "RMSNorm":
        tensors.append(("mixer.in_proj.layer_norm_bias", (h,)))
    tensors += [("mixer.in_proj.weight", (m.in_proj, h)),
                ("mixer.conv1d_weight", (m.conv_dim, 1, shape.d_conv)),
                ("mixer.conv1d_bias", (m.conv_dim,)),
                ("mixer.dt_bias", (m.heads,)),
                ("mixer.A_log", (m.heads,)),
                ("mixer.D", (m.heads,)),
                ("mixer.norm.weight", (m.d_inner,)),
                ("mixer.out_proj.weight", (h, m.d_inner))]
    return tensors


def params(shape: MambaShape, tp: int = 1, normalization: str = "RMSNorm") -> int:
    """Parameters of one Mamba layer on one TP rank."""
    return sum(math.prod(dims) for _, dims in param_tensors(shape, tp, normalization))


# -- FLOPs ----------------------------------------------------------------------------------------------------------
def scan_flops(shape: MambaShape, batch: int, seq: int) -> float:
    """Forward FLOPs of the SSD kernels over `batch` sequences of `seq` tokens (whole layer)."""
    return float(sum(ssd_work(k, batch, seq, shape.heads, shape.head_dim, shape.groups, shape.state, shape.chunk)[0]
                     for k in SSD_KERNELS))


def flops_per_token(shape: MambaShape, seq: int) -> float:
    """Forward FLOPs per token of one Mamba layer (all TP ranks): the projections, the convolution and the scan as
    the kernels run them."""
    h = shape.hidden
    conv, _ = conv_work(1, shape.conv_dim, shape.d_conv)
    return 2.0 * h * shape.in_proj_dim + conv + scan_flops(shape, 1, seq) / seq + 2.0 * shape.d_inner * h


def megatron_flops_per_token(hidden: int, state: int, head_dim: int, groups: int, heads: int | None) -> float:
    """Forward FLOPs per token of a Mamba layer as Megatron's `num_floating_point_operations` counts it (its
    `mamba_layer_flops`: what its logged TFLOP/s and Megatron-Bridge's published model TFLOP/s use): d_in = 2·hidden
    whatever --mamba-num-heads says, heads = d_in / head_dim unless given, the scan 7·d_in·N."""
    d_in = 2 * hidden
    nheads = heads if heads else d_in // head_dim
    return 2.0 * hidden * (2 * d_in + 2 * groups * state + nheads) + 7.0 * d_in * state + 2.0 * d_in * hidden


# -- memory ---------------------------------------------------------------------------------------------------------
def activation_bytes(shape: MambaShape, lowp_bytes: float = 1.0, hidden_dropout: bool = False
                     ) -> tuple[float, float]:
    """(replicated, split) bytes one Mamba layer keeps per token for its backward (module docstring): the first
    part on every TP rank (split over TP too with SP), the second summed over the TP ranks (each holds 1/tp).
    `lowp_bytes`: a GEMM input's bytes over bf16's (a low-precision recipe's saved copy)."""
    h, d = shape.hidden, shape.d_inner
    replicated = 2.0 * h + 2.0 * h * lowp_bytes + (1.0 * h if hidden_dropout else 0.0)
    split = 2.0 * shape.in_proj_dim + 2.0 * d + 2.0 * d + 4.0 * shape.groups + 2.0 * d * lowp_bytes
    return replicated, split


def state_bytes(shape: MambaShape, tp: int, cp: int, batch: int, seq: int, state_bytes: float = 4.0
                ) -> dict[str, float]:
    """Bytes of the states on one rank: the chunk states the scan holds during its forward and backward (fp32,
    (T/Q)·H·P·N of this rank's heads), and per sequence the recurrent states inference keeps (Megatron's
    `mamba_state_shapes_per_request`: conv [conv_dim/tp, d_conv], SSM [H/tp, P, N])."""
    m = local(shape, tp, cp)
    n_chunks = batch * chunks(seq, shape.chunk)
    return {"chunk_states": float(n_chunks * m.scan_heads * shape.head_dim * shape.state * state_bytes),
            "conv_state_per_sequence": float(m.conv_dim * shape.d_conv * 2),
            "ssm_state_per_sequence": float(m.heads * shape.head_dim * shape.state * 2)}


def cp_all_to_all_bytes(shape: MambaShape, tp: int, cp: int, tokens: int, esize: int = 2) -> tuple[list[float], float]:
    """Per-rank buffers of the CP all-to-alls over `tokens` local tokens: the five before the scan (z, x, B, C, dt;
    B and C as repeated for ranks sharing a group) and the one after it (y)."""
    m = local(shape, tp, cp)
    bc = tokens * m.groups * m.group_repeat * shape.state * esize
    pre = [tokens * m.d_inner * esize, tokens * m.d_inner * esize, bc, bc, tokens * m.heads * esize]
    return [float(v) for v in pre], float(tokens * m.d_inner * esize)


# -- operators ------------------------------------------------------------------------------------------------------
def ops(b: OpBuilder, shape: MambaShape, lowp: bool, state_dtype: str | None = None, mem_eff: bool = True
        ) -> list[Pair]:
    """The Mamba layer's operators on one rank as `Pair`s (module docstring); `state_dtype`: Megatron's
    --mamba-training-ssm-states-dtype (None: the activation dtype); `mem_eff` False (--disable-mamba-mem-eff-path):
    the convolution is a call of its own whose backward recomputes nothing, and the norm gates y with silu(z)."""
    c = b.c
    cp = c.cp
    m = local(shape, b.t, cp)
    rows = b.tokens
    pairs: list[Pair] = []
    fwd, bwd = norm(b, "mixer.in_proj.layer_norm")
    pairs.append((fwd, bwd, MODULE))
    pairs.extend(b.tp_in("mixer.in_proj", MODULE))
    pairs.extend(b.linear("mixer.in_proj", "mamba_in_proj", rows, m.in_proj, b.h, MODULE, lowp, bias=False))
    pre, post = cp_all_to_all_bytes(shape, b.t, cp, rows, b.bytes)
    if cp > 1:
        for name, nbytes in zip(("z", "x", "B", "C", "dt"), pre):
            pairs.append((b.collective(f"mixer.cp.{name}", "all_to_all", "cp", nbytes),
                          b.collective(f"mixer.cp.{name}.grad", "all_to_all", "cp", nbytes), MODULE))
    seq, mb = b.s * cp, b.b  # the scan runs over the whole sequence, on this rank's heads
    scan_channels = m.scan_d_inner + 2 * m.scan_groups * shape.state
    conv = b.compute("mixer.conv1d", CONV, CONV, conv_work(mb * seq, scan_channels, shape.d_conv)[0], True,
                     batch=mb, seq=seq, rows=mb * seq, width=scan_channels, k=shape.d_conv,
                     numel=mb * seq * scan_channels)
    kernels = [conv]
    features: dict[str, float] = dict(batch=mb, seq=seq, heads=m.scan_heads, head_dim=shape.head_dim,
                                      kv_heads=m.scan_groups, width=shape.state, seq_kv=shape.chunk,
                                      numel=mb * seq * m.scan_d_inner)
    for kernel in SSD_KERNELS:
        sizes = (kernel, mb, seq, m.scan_heads, shape.head_dim, m.scan_groups, shape.state, shape.chunk)
        dtype = state_dtype if kernel == "ssd_state_passing" and state_dtype else None
        fwd, bwd = b.compute(f"mixer.{kernel}", kernel, kernel, ssd_work(*sizes)[0], True, False, dtype, **features)
        assert isinstance(bwd, OpUse)
        bwd.flops = ssd_backward_work(*sizes)[0]  # its gradients' kernels (scan_work)
        kernels.append((fwd, bwd))
    for i, (fwd, bwd) in enumerate(kernels):
        if i > (0 if mem_eff else 1):  # one call issues them (mamba_split_conv1d_scan_combined: the convolution too)
            _inside(fwd, bwd)
        pairs.append((fwd, bwd, MODULE))
    # the combined call's backward recomputes its convolution and the scan's intermediates before the gradients
    if mem_eff:
        pairs.append((None, _recompute(kernels[0][0]), MODULE))
    for kernel, (fwd, _) in zip(SSD_KERNELS, kernels[1:]):
        if kernel in RECOMPUTED:
            pairs.append((None, _recompute(fwd), MODULE))
    if cp > 1:
        pairs.append((b.collective("mixer.cp.y", "all_to_all", "cp", post),
                      b.collective("mixer.cp.y.grad", "all_to_all", "cp", post), MODULE))
    fwd, bwd = b.compute("mixer.norm", "norm", FUSED_RMSNORM, 0.0, True, rows=rows, width=m.d_inner,
                         numel=rows * m.d_inner)
    pairs.append((fwd, bwd, MODULE))
    if not mem_eff:  # the norm's gate: y · silu(z)
        fwd, bwd = b.elementwise("mixer.norm.gate", "gate_silu_mul", rows * m.d_inner, m.d_inner)
        pairs.append((fwd, bwd, MODULE))
    pairs.extend(b.linear("mixer.out_proj", "mamba_out_proj", rows, b.h, m.d_inner, MODULE, lowp, bias=False))
    pairs.extend(b.tp_out("mixer.out_proj", MODULE))
    fwd, bwd = b.residual("mamba_bda")
    pairs.append((fwd, bwd, MODULE))
    return pairs


def _inside(fwd: OpUse, bwd: OpUse | tuple[OpUse, ...]) -> None:
    """A kernel issued by the host call of the one before it (no launch of its own)."""
    for op in (fwd, *(bwd if isinstance(bwd, tuple) else (bwd,))):
        op.launch = False


def _recompute(fwd: OpUse) -> OpUse:
    """A forward kernel run again inside the backward's call."""
    return OpUse(f"{fwd.name}.recompute", fwd.spec, per_layer=True, flops=fwd.flops, recompute=True, launch=False)


# -- the `M` layer as a block (predictor.layers.block.Block) --------------------------------------------------------
def settings(c: TrainingConfig) -> HybridSettings:
    assert c.hybrid is not None, "a hybrid layer of a configuration without hybrid settings"
    return c.hybrid


def shape_of(c: TrainingConfig) -> MambaShape:
    return settings(c).mamba(c.hidden_size)


#: Parameters of one layer that are neither a linear layer's weight nor a norm's (`Block.matrices` holds none of
#: them): the depthwise convolution's weight and bias, dt_bias, A_log and D, per the names of `param_tensors`.
NON_MATRIX = ("mixer.conv1d_weight", "mixer.conv1d_bias", "mixer.dt_bias", "mixer.A_log", "mixer.D")


class Mamba:
    """A Mamba2 layer (`M`): MambaLayer's fused input norm and in-projection, the convolution and SSD scan, the
    gated norm and out-projection, the residual add (module docstring)."""

    name = "mamba"

    def ops(self, b: OpBuilder, window: int | None, lowp: bool) -> list[Pair]:
        s = settings(b.c)
        return ops(b, shape_of(b.c), lowp, s.mamba_training_ssm_states_dtype, s.use_mamba_mem_eff_path)

    def params(self, c: TrainingConfig) -> tuple[int, int]:
        return params(shape_of(c), c.tp, c.normalization), 0

    def flops_per_token(self, c: TrainingConfig, layer: int, causal: bool) -> float:
        return flops_per_token(shape_of(c), c.seq_length)

    def saved(self, c: TrainingConfig, saving: Saving) -> Saved:
        """`activation_bytes`; selective recompute names no part of a Mamba layer and fine-grained offloading opens
        no group in it (MambaLayer has none): neither changes what it keeps."""
        replicated, split = activation_bytes(shape_of(c), saving.q, c.hidden_dropout > 0)
        return Saved(replicated, split)

    def matrices(self, c: TrainingConfig, split_qkv: bool) -> tuple[list[Matrix], list[Matrix]]:
        shape = shape_of(c)
        return [(shape.in_proj_dim, c.hidden_size), (c.hidden_size, shape.d_inner)], []

    def tensors(self, c: TrainingConfig) -> Tensors:
        """The two projections (no bias), the input norm fused into the in-projection, and the gated RMSNorm's
        weight (RMSNorm whatever `normalization` says) with the non-matrix parameters (`NON_MATRIX`)."""
        return Tensors(linears=2, biased=0, norms=1, other=1 + len(NON_MATRIX))

    def offload_tensors(self, c: TrainingConfig) -> dict[str, list[float]]:
        return {}


def norm_parameters(c: TrainingConfig) -> int:
    """The norms' parameters of one `M` layer on one TP rank: the input norm and the gated RMSNorm."""
    return norm_params(c, c.hidden_size) + local(shape_of(c), c.tp).d_inner


MAMBA = Mamba()
