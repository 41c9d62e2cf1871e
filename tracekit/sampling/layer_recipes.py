"""Timing recipes of a decoder layer's memory-bound operators and unfused attention chain, each as Megatron-core's
local implementation runs it (its source, `megatron/core/`: fusions/fused_bias_swiglu.py, transformer/torch_norm.py,
models/common/embeddings/rope_utils.py, fusions/fused_softmax.py, transformer/dot_product_attention.py), written
here from what those functions compute. Each takes (case, dtype name, timer) and returns {pass: µs}; the features
they read are tracekit.sampling.model_cases'.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from .compute import DTYPES, Timer, leaf
from .shapes import Case

#: Megatron's default attention dropout, and the value its torch softmax writes where the causal mask hides a score.
DROPOUT, MASKED = 0.1, -10000.0
EPS = 1e-5


def _features(case: Case) -> dict[str, float]:
    return dict(case.features)


# -- activations -------------------------------------------------------------------------------------------------
def swiglu_forward(y: torch.Tensor) -> torch.Tensor:
    """SiLU of the first half of the last dimension times the second (Megatron's `swiglu`)."""
    gate, up = torch.chunk(y, 2, -1)
    return F.silu(gate) * up


def swiglu_backward(grad: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The gradient of `swiglu_forward` at `y` (Megatron's `swiglu_back`): d(silu(a)·b)/da = σ(a)(1 + a(1 − σ(a)))·b,
    d/db = silu(a), both halves concatenated."""
    gate, up = torch.chunk(y, 2, -1)
    sig = torch.sigmoid(gate)
    return torch.cat((grad * sig * (1 + gate * (1 - sig)) * up, grad * gate * sig), -1)


class _SwiGLU(torch.autograd.Function):
    """Megatron's fused SwiGLU (`SwiGLUFunction`): its forward and backward functions, each compiled into one kernel by
    `jit_fuser` (torch.compile on torch ≥ 2.2), saving only the input."""

    @staticmethod
    def forward(ctx, y, forward, backward):
        ctx.save_for_backward(y)
        ctx.backward_fn = backward
        return forward(y)

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return ctx.backward_fn(grad, y), None, None


@functools.cache
def compiled_swiglu() -> tuple:
    """(forward, backward) compiled once for every shape (`dynamic`), as Megatron's jit_fuser compiles them."""
    return (torch.compile(swiglu_forward, dynamic=True), torch.compile(swiglu_backward, dynamic=True))


def swiglu(case: Case, dtype_name: str, timer: Timer, compiled: bool = True) -> dict[str, float]:
    """Megatron's fused SwiGLU (`bias_swiglu_fusion`, its default); `compiled=False` runs the same functions eagerly
    (not a fused kernel: for checking them)."""
    forward, backward = compiled_swiglu() if compiled else (swiglu_forward, swiglu_backward)
    y = _glu_input(case, dtype_name, timer)
    return _fwd_bwd(timer, [y], lambda: _SwiGLU.apply(y, forward, backward))


def swiglu_unfused(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    """SwiGLU without the fusion (`--no-bias-swiglu-fusion`: the MLP's `glu` with SiLU): chunk, SiLU, multiply, and
    autograd's backward of each."""
    y = _glu_input(case, dtype_name, timer)
    return _fwd_bwd(timer, [y], lambda: swiglu_forward(y))


def glu(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    """torch's GLU (F.glu: one kernel each way reading both halves, sigmoid gate)."""
    y = _glu_input(case, dtype_name, timer)
    return _fwd_bwd(timer, [y], lambda: F.glu(y, dim=-1))


def squared_relu(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    """Megatron's `squared_relu` (`--squared-relu`): ReLU, then its square, as two kernels each way."""
    f = _features(case)
    x = leaf((int(f["rows"]), int(f["width"])), DTYPES[dtype_name], timer.device)
    return _fwd_bwd(timer, [x], lambda: torch.pow(F.relu(x), 2))


def _glu_input(case: Case, dtype_name: str, timer: Timer) -> torch.Tensor:
    """The FC1 output a gated unit reads: [rows, 2 · width] (the case's real rows, not the stored GELU rows)."""
    return leaf((int(case.get("rows")), 2 * int(case.feature("width"))), DTYPES[dtype_name], timer.device)


# -- norms -------------------------------------------------------------------------------------------------------
def rmsnorm_fused(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    """torch's RMSNorm (F.rms_norm, what torch.nn.RMSNorm and Megatron's WrappedTorchNorm run), where torch has a
    fused kernel for the device (tracekit.sampling.recipes checks)."""
    x, weight = _norm_inputs(case, dtype_name, timer)
    width = int(case.feature("width"))
    return _fwd_bwd(timer, [x, weight], lambda: F.rms_norm(x, (width,), weight, EPS))


def rmsnorm_unfused(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    """RMSNorm as separate kernels, as Megatron's legacy RMSNorm and Llama's reference compute it: in fp32, the mean
    square, its reciprocal root, the product, back to the input dtype, times the weight."""
    x, weight = _norm_inputs(case, dtype_name, timer)

    def forward() -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS)).type_as(x) * weight

    return _fwd_bwd(timer, [x, weight], forward)


def _norm_inputs(case: Case, dtype_name: str, timer: Timer) -> tuple[torch.Tensor, torch.Tensor]:
    f, dtype = _features(case), DTYPES[dtype_name]
    x = leaf((int(f["rows"]), int(f["width"])), dtype, timer.device)
    weight = torch.ones(int(f["width"]), device=timer.device, dtype=dtype, requires_grad=True)
    return x, weight


# -- rotary embeddings -------------------------------------------------------------------------------------------
def rope_freqs(seq: int, dim: int, device: torch.device) -> torch.Tensor:
    """The [seq, 1, 1, dim] angles Megatron's RotaryEmbedding gives a layer (base 10000, both halves alike): made
    once per model forward and shared by every layer, so not part of a layer's time."""
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    return torch.cat((angles, angles), dim=-1)[:, None, None, :]


def apply_rope(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Megatron's unfused RoPE of an [s, b, heads, dim] tensor (`_apply_rotary_pos_emb_bshd`, not interleaved,
    mscale 1): cos and sin of the angles in the tensor's dtype, t·cos + rotate_half(t)·sin, and the unrotated rest
    concatenated back (empty when the whole head dim rotates, still a copy)."""
    rot = freqs.shape[-1]
    t, rest = t[..., :rot], t[..., rot:]
    cos = (torch.cos(freqs) * 1.0).to(t.dtype)
    sin = (torch.sin(freqs) * 1.0).to(t.dtype)
    first, second = torch.chunk(t, 2, dim=-1)
    rotated = torch.cat((-second, first), dim=-1)
    return torch.cat((t * cos + rotated * sin, rest), dim=-1)


def rope(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    """The unfused RoPE of one attention layer: the query's and the key's (`--no-rope-fusion`)."""
    dev, dtype, d = timer.device, DTYPES[dtype_name], int(case.feature("head_dim"))
    s, b = int(case.get("seq")), int(case.get("micro_batch"))
    q = leaf((s, b, int(case.get("q_heads")), d), dtype, dev)
    k = leaf((s, b, int(case.get("k_heads")), d), dtype, dev)
    freqs = rope_freqs(s, d, dev)
    return _fwd_bwd(timer, [q, k], lambda: (apply_rope(q, freqs), apply_rope(k, freqs)))


@functools.cache
def te_rope():
    """Transformer Engine's `apply_rotary_pos_emb` (TE ≥ 2.3 and older layouts), as Megatron imports it."""
    try:
        from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb  # type: ignore[import-not-found]
    except ImportError:
        from transformer_engine.pytorch.attention import apply_rotary_pos_emb  # type: ignore[import-not-found]
    return apply_rotary_pos_emb


def rope_fused(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    """Transformer Engine's fused RoPE kernel on one [s, b, heads, dim] tensor (Megatron's `apply_rope_fusion`)."""
    dev, d = timer.device, int(case.feature("width"))
    s = int(case.get("seq"))
    t = leaf((s, int(case.get("micro_batch")), int(case.get("heads")), d), DTYPES[dtype_name], dev)
    freqs, apply = rope_freqs(s, d, dev), te_rope()
    return _fwd_bwd(timer, [t], lambda: apply(t, freqs, tensor_format="sbhd", fused=True))


# -- the unfused attention chain (DotProductAttention) -------------------------------------------------------------
def dropout(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    """Dropout on the attention probabilities ([b · heads · s, s]), at Megatron's default probability."""
    f = _features(case)
    x = leaf((int(f["rows"]), int(f["width"])), DTYPES[dtype_name], timer.device)
    return _fwd_bwd(timer, [x], lambda: F.dropout(x, p=DROPOUT, training=True))


def baddbmm(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    """The scores: baddbmm of the query [s, b · heads, d] and key, as strided [b · heads, s, d] views, into a buffer
    (beta 0), scaled by 1/√d in the GEMM (alpha)."""
    f, dev, dtype = _features(case), timer.device, DTYPES[dtype_name]
    batch, s, d = int(f["batch"]), int(f["m"]), int(f["k"])
    q, k = (leaf((s, batch, d), dtype, dev) for _ in range(2))
    out = torch.empty((batch, s, int(f["n"])), device=dev, dtype=dtype)
    return _fwd_bwd(timer, [q, k], lambda: torch.baddbmm(out, q.transpose(0, 1), k.transpose(0, 1).transpose(1, 2),
                                                         beta=0.0, alpha=1.0 / math.sqrt(d)))


def bmm(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    """The context: bmm of the probabilities [b · heads, s, s] and the value [s, b · heads, d] as a strided view."""
    f, dev, dtype = _features(case), timer.device, DTYPES[dtype_name]
    batch, s, d = int(f["batch"]), int(f["m"]), int(f["n"])
    probs = leaf((batch, s, int(f["k"])), dtype, dev)
    value = leaf((int(f["k"]), batch, d), dtype, dev)
    return _fwd_bwd(timer, [probs, value], lambda: torch.bmm(probs, value.transpose(0, 1)))


def fillmask(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    """The causal mask filled into the scores as Megatron's torch softmax path does it (`forward_torch_softmax`,
    `--no-masked-softmax-fusion` or no fused kernel for the shape): `attention_mask_func` writes -10000 in place
    (`masked_fill_`) through the [b, heads, s, s] view of the baddbmm output [b · heads, s, s], so that its backward
    is autograd's `CopySlices` over an as-strided view (AsStridedBackward0, then the fill's gradient into a copy of
    the output's): the seed paper's `fillmask` operator. Each call fills a fresh copy of the scores (untimed), as
    each step fills the baddbmm output it has just written."""
    f, dev = _features(case), timer.device
    b, heads, s, sk = int(f["batch"]), int(f["heads"]), int(f["seq"]), int(f["width"])
    scores = leaf((b * heads, s, sk), DTYPES[dtype_name], dev)
    mask = torch.triu(torch.ones((s, sk), device=dev, dtype=torch.bool), diagonal=1)
    return _fwd_bwd(timer, [scores], lambda out: fill_causal_mask(out, b, mask), scores.clone)


def fill_causal_mask(scores: torch.Tensor, batch: int, mask: torch.Tensor) -> torch.Tensor:
    """`attention_mask_func` on Megatron's torch softmax path: MASKED written in place where `mask` is set, through
    the [batch, heads, s, sk] view of the baddbmm output `scores` [batch · heads, s, sk]; returns the view."""
    return scores.view(batch, -1, *scores.shape[1:]).masked_fill_(mask, MASKED)


def softmax(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    """Softmax over the keys of the masked scores [b, heads, s, s] (`torch.nn.Softmax(dim=-1)` of the same path), in
    the input dtype (`attention_softmax_in_fp32` is off unless asked): the seed paper's `softmax` operator."""
    f = _features(case)
    scores = leaf((int(f["batch"]), int(f["heads"]), int(f["seq"]), int(f["width"])), DTYPES[dtype_name],
                  timer.device)
    return _fwd_bwd(timer, [scores], lambda: torch.softmax(scores, dim=-1))


def _fwd_bwd(timer: Timer, leaves: list[torch.Tensor], forward, prepare=None) -> dict[str, float]:
    fwd, bwd = timer.fwd_bwd(leaves, forward, prepare)
    return {"fwd": fwd, "bwd": bwd}
