"""Samples of the recurrent mixers' kernels (`predictor.layers.ssm`): torch reference implementations of Mamba2's
chunked SSD scan, the depthwise causal convolution and Gated DeltaNet's chunked delta rule, written here from their
recurrences, timed step by step on any device; on a GPU where `mamba_ssm` / `causal_conv1d` import, their kernels
instead (variant `triton` / `cuda`; the SSD's Triton kernels forward only: their backward kernels take the whole
forward's intermediates).

Design note
-----------
Each SSD step is a function of its own, in the order and with the inputs of mamba_ssm's kernels (`chunk_cumsum`,
`chunk_state`, `state_passing`, `bmm_chunk`, `chunk_scan`), so each is timed alone (forward and autograd backward)
as the operator graph has one row per kernel (`predictor.layers.ssm.mamba`). Layouts: x [batch, seq, heads, head
dim], dt [batch, seq, heads], A [heads], B and C [batch, seq, groups, state], chunked tensors [batch, heads, chunks,
chunk]. The recurrence they compute, per head h of group g(h):

    state_t = exp(dt_t·A) · state_{t−1} + dt_t · x_t ⊗ B_t,    y_t = state_t · C_t + D · x_t,    out_t = y_t · silu(z_t)

with dt_t = softplus(dt_t + dt_bias); `ssd_sequential` runs it token by token (what the tests check the chunked form
against). The gated delta rule, per value head: S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ, o_t = S_tᵀ q_t,
α_t = exp(g_t); chunked in WY form: inside a chunk with incoming state S₀ and cumulative decay γ_i = exp(Σ_{j≤i} g_j),
the pseudo-values U solve (I + L)·U = β·V − β·γ·K·S₀ with L_ij = β_i (γ_i/γ_j) k_i·k_j below the diagonal, then
o_i = γ_i S₀ᵀ q_i + Σ_{j≤i} (γ_i/γ_j)(q_i·k_j) u_j and S_C = γ_C S₀ + Σ_j (γ_C/γ_j) k_j u_jᵀ.

Features of the cases are the operator rows' (`predictor.layers.kernel_work`): SSD kernels batch, seq, heads,
head_dim, kv_heads (groups), width (state), seq_kv (chunk); the convolution batch, seq, rows, width (channels), k
(taps); the delta rule batch, seq, heads, head_dim (value dim), width (key dim), seq_kv (chunk), kv_heads.
"""
from __future__ import annotations

import itertools
import random
from typing import Callable

import torch
import torch.nn.functional as F

from .shapes import Case

SSD_STEPS = ("ssd_chunk_cumsum", "ssd_chunk_state", "ssd_state_passing", "ssd_bmm_chunk", "ssd_chunk_scan")
GRIDS = {  # batch, seq, (heads, head_dim), (groups, state), chunk
    "cpu": ((1, 2), (64, 128, 256), ((2, 16), (4, 16), (4, 32)), ((1, 16), (2, 32)), (16, 32, 64)),
    "cuda": ((1, 2), (2048, 4096, 8192), ((32, 64), (64, 64), (128, 64)), ((1, 128), (8, 128)), (128, 256)),
}
CONV_CHANNELS = {"cpu": (64, 256, 1024), "cuda": (2048, 6144, 12288)}
CONV_TAPS = 4
GDN_HEADS = {"cpu": ((2, 2, 16), (4, 2, 32)), "cuda": ((16, 8, 128), (32, 16, 128))}  # value heads, key heads, dim
GDN_CHUNK = 64


# -- Mamba2's SSD, step by step -------------------------------------------------------------------------------------
def chunk_cumsum(dt: torch.Tensor, A: torch.Tensor, chunk: int, dt_bias: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(dt, cumulative dt·A) per chunk, [batch, heads, chunks, chunk], fp32: dt after its bias and softplus."""
    b, length, h = dt.shape
    if length % chunk:
        raise ValueError(f"the reference scan needs seq ({length}) divisible by the chunk ({chunk})")
    dt = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
    dt = F.softplus(dt).reshape(b, length // chunk, chunk, h).permute(0, 3, 1, 2)
    return dt, torch.cumsum(dt * A.float().view(1, h, 1, 1), dim=-1)


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., groups, n] → [..., heads, n]: each group's row for the heads it serves."""
    return t.repeat_interleave(heads // t.shape[-2], dim=-2)


def chunk_state(B: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, dA: torch.Tensor) -> torch.Tensor:
    """Each chunk's own final state [batch, chunks, heads, head_dim, state] (from a zero state), fp32."""
    b, length, h, p = x.shape
    chunks, q = dA.shape[2], dA.shape[3]
    Bh = _heads(B, h).reshape(b, chunks, q, h, -1).float()
    xc = x.reshape(b, chunks, q, h, p).float()
    decay = torch.exp(dA[..., -1:] - dA) * dt  # [b, h, c, q]
    return torch.einsum("bclhp,bclhn,bhcl->bchpn", xc, Bh, decay)


def state_passing(states: torch.Tensor, dA: torch.Tensor) -> torch.Tensor:
    """The state entering each chunk [batch, chunks, heads, head_dim, state]: the recurrence over chunk ends."""
    decay = torch.exp(dA[..., -1])  # [b, h, c]
    running = torch.zeros_like(states[:, 0])
    out = []
    for c in range(states.shape[1]):
        out.append(running)
        running = decay[:, :, c, None, None] * running + states[:, c]
    return torch.stack(out, dim=1)


def bmm_chunk(C: torch.Tensor, B: torch.Tensor, chunk: int) -> torch.Tensor:
    """C·Bᵀ inside each chunk per group [batch, chunks, groups, chunk, chunk], fp32."""
    b, length, g, n = C.shape
    Cc = C.reshape(b, length // chunk, chunk, g, n).float()
    Bc = B.reshape(b, length // chunk, chunk, g, n).float()
    return torch.einsum("bclgn,bcsgn->bcgls", Cc, Bc)


def chunk_scan(CB: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, dA: torch.Tensor, C: torch.Tensor,
               states: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None) -> torch.Tensor:
    """The output [batch, seq, heads, head_dim]: the causal in-chunk part, the incoming state read by C, D·x, and
    the gate silu(z)."""
    b, length, h, p = x.shape
    chunks, q = dA.shape[2], dA.shape[3]
    CBh = CB.repeat_interleave(h // CB.shape[2], dim=2)  # [b, c, h, l, s]
    diff = dA[..., :, None] - dA[..., None, :]  # [b, h, c, l, s]
    causal = torch.ones(q, q, dtype=torch.bool, device=x.device).tril()
    weight = torch.exp(diff.masked_fill(~causal, float("-inf"))) * dt[..., None, :]
    weight = weight.permute(0, 2, 1, 3, 4) * CBh  # [b, c, h, l, s]
    xc = x.reshape(b, chunks, q, h, p).float()
    y = torch.einsum("bchls,bcshp->bclhp", weight, xc)
    Ch = _heads(C, h).reshape(b, chunks, q, h, -1).float()
    y = y + torch.einsum("bclhn,bchpn,bhcl->bclhp", Ch, states, torch.exp(dA))
    if D is not None:
        y = y + xc * D.float().view(1, 1, 1, h, 1)
    y = y.reshape(b, length, h, p)
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(x.dtype)


def ssd_chunked(x, dt, A, B, C, chunk: int, D=None, z=None, dt_bias=None) -> torch.Tensor:
    """The whole chunked scan: the five steps in order."""
    dt_c, dA = chunk_cumsum(dt, A, chunk, dt_bias)
    states = state_passing(chunk_state(B, x, dt_c, dA), dA)
    return chunk_scan(bmm_chunk(C, B, chunk), x, dt_c, dA, C, states, D, z)


def ssd_sequential(x, dt, A, B, C, D=None, z=None, dt_bias=None) -> torch.Tensor:
    """The SSM recurrence token by token (module docstring), fp32."""
    b, length, h, p = x.shape
    dt = F.softplus(dt.float() + (dt_bias.float() if dt_bias is not None else 0.0))
    Bh, Ch = _heads(B, h).float(), _heads(C, h).float()
    state = torch.zeros(b, h, p, B.shape[-1], dtype=torch.float32, device=x.device)
    out = []
    for t in range(length):
        state = torch.exp(dt[:, t] * A.float())[:, :, None, None] * state \
            + dt[:, t, :, None, None] * x[:, t, :, :, None].float() * Bh[:, t, :, None, :]
        y = torch.einsum("bhpn,bhn->bhp", state, Ch[:, t])
        if D is not None:
            y = y + D.float().view(1, h, 1) * x[:, t].float()
        if z is not None:
            y = y * F.silu(z[:, t].float())
        out.append(y)
    return torch.stack(out, dim=1)


# -- the depthwise causal convolution -------------------------------------------------------------------------------
def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, silu: bool = True
                  ) -> torch.Tensor:
    """y[t, c] = Σ_k weight[c, k] · x[t − K + 1 + k, c] + bias[c] (zeros before the start), then SiLU; x [batch,
    seq, channels], weight [channels, K]."""
    length, channels, taps = x.shape[1], x.shape[2], weight.shape[1]
    y = F.conv1d(x.transpose(1, 2), weight.unsqueeze(1), bias, padding=taps - 1, groups=channels)[..., :length]
    y = y.transpose(1, 2)
    return F.silu(y) if silu else y


# -- Gated DeltaNet's delta rule ------------------------------------------------------------------------------------
def gated_delta_chunked(q, k, v, g, beta, chunk: int, scale: float | None = None) -> torch.Tensor:
    """The chunked gated delta rule in WY form (module docstring); q, k [batch, seq, heads, dk], v [..., dv], g and
    beta [batch, seq, heads] (g the log decay, ≤ 0); returns o [batch, seq, heads, dv], fp32."""
    b, length, h, dk = k.shape
    dv = v.shape[-1]
    if length % chunk:
        raise ValueError(f"the reference rule needs seq ({length}) divisible by the chunk ({chunk})")
    scale = dk ** -0.5 if scale is None else scale
    n = length // chunk

    def split(t: torch.Tensor) -> torch.Tensor:  # [b, L, h, ...] → [b, h, n, C, ...]
        return t.float().reshape(b, n, chunk, h, *t.shape[3:]).transpose(1, 3).transpose(2, 3)

    qc, kc, vc = split(q) * scale, split(k), split(v)
    gc, bc = split(g), split(beta)
    G = torch.cumsum(gc, dim=-1)  # [b, h, n, C]
    rel = G[..., :, None] - G[..., None, :]
    below = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril(-1)
    on_or_below = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    L = (bc[..., :, None] * (kc @ kc.transpose(-1, -2)) * torch.exp(rel.masked_fill(~below, float("-inf"))))
    eye = torch.eye(chunk, device=q.device)
    system = eye + L
    u_tilde = torch.linalg.solve_triangular(system, bc[..., None] * vc, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, bc[..., None] * torch.exp(G)[..., None] * kc, upper=False,
                                      unitriangular=True)
    decay_qk = (qc @ kc.transpose(-1, -2)) * torch.exp(rel.masked_fill(~on_or_below, float("-inf")))
    state = torch.zeros(b, h, dk, dv, dtype=torch.float32, device=q.device)
    out = []
    for i in range(n):
        u = u_tilde[:, :, i] - w[:, :, i] @ state
        gamma = torch.exp(G[:, :, i])  # [b, h, C]
        out.append(gamma[..., None] * (qc[:, :, i] @ state) + decay_qk[:, :, i] @ u)
        last = G[:, :, i, -1]
        state = torch.exp(last)[..., None, None] * state \
            + (kc[:, :, i] * torch.exp(last[..., None] - G[:, :, i])[..., None]).transpose(-1, -2) @ u
    return torch.stack(out, dim=2).reshape(b, h, length, dv).transpose(1, 2)


def gated_delta_sequential(q, k, v, g, beta, scale: float | None = None) -> torch.Tensor:
    """The gated delta rule token by token, fp32."""
    b, length, h, dk = k.shape
    scale = dk ** -0.5 if scale is None else scale
    state = torch.zeros(b, h, dk, v.shape[-1], dtype=torch.float32, device=q.device)
    out = []
    for t in range(length):
        kt, vt, bt = k[:, t].float(), v[:, t].float(), beta[:, t].float()[..., None]
        state = torch.exp(g[:, t].float())[..., None, None] * state
        erased = torch.einsum("bhk,bhkv->bhv", kt, state)
        state = state + kt[..., None] * (bt * (vt - erased))[..., None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t].float() * scale, state))
    return torch.stack(out, dim=1)


# -- cases and their timing -----------------------------------------------------------------------------------------
def _case(primitive: str, variant: str, **features: float) -> Case:
    return Case(primitive, variant, tuple(sorted((k, float(v)) for k, v in features.items())))


def ssm_cases(device: str, primitives: set[str], seed: int = 0) -> list[Case]:
    """The shapes to time for the recurrent mixers' kernels in `primitives`, spread first (a fixed shuffled order)."""
    batch, seq, heads, groups, chunk = GRIDS[device]
    dev = torch.device(device)
    ssd_variant = "triton" if _real_ssd(SSD_STEPS[0], dev) is not None else "torch"
    conv_variant = "cuda" if _real_conv(dev) is not None else "torch"
    ssd: list[Case] = []
    points = [(bb, s, hp, gn, q) for bb, s, hp, gn, q in itertools.product(batch, seq, heads, groups, chunk)
              if hp[0] % gn[0] == 0 and s % q == 0 and s // q >= 2]  # state passing needs two chunks
    random.Random(seed).shuffle(points)
    for bb, s, (h, p), (g, n), q in points:
        for step in SSD_STEPS:
            if step in primitives:
                ssd.append(_case(step, ssd_variant, batch=bb, seq=s, heads=h, head_dim=p, kv_heads=g, width=n,
                                 seq_kv=q, numel=bb * s * h * p))
    conv: list[Case] = []
    if "causal_conv1d" in primitives:
        for bb, s, ch in itertools.product(batch, seq, CONV_CHANNELS[device]):
            conv.append(_case("causal_conv1d", conv_variant, batch=bb, seq=s, rows=bb * s, width=ch, k=CONV_TAPS,
                              numel=bb * s * ch))
    rule: list[Case] = []
    if "gdn_chunk_rule" in primitives:
        for bb, s, (hv, hk, d) in itertools.product(batch, seq, GDN_HEADS[device]):
            if s % GDN_CHUNK == 0:
                rule.append(_case("gdn_chunk_rule", "gdn", batch=bb, seq=s, heads=hv, kv_heads=hk, head_dim=d,
                                  width=d, seq_kv=GDN_CHUNK, numel=bb * s * hv * d))
    # one of each kind in turn, so that a budget that runs out leaves every kind some shapes
    return [case for group in itertools.zip_longest(ssd, conv, rule) for case in group if case is not None]


def _ssd_inputs(f: dict[str, float], dtype: torch.dtype, dev: torch.device) -> dict[str, torch.Tensor]:
    b, s, h, p, g, n = (int(f[k]) for k in ("batch", "seq", "heads", "head_dim", "kv_heads", "width"))
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(device=dev, dtype=dtype)

    return {"x": rand(b, s, h, p), "dt": rand(b, s, h, scale=0.5), "A": -torch.rand(h, generator=gen).to(dev) - 0.5,
            "B": rand(b, s, g, n, scale=0.3), "C": rand(b, s, g, n, scale=0.3), "D": torch.ones(h, device=dev),
            "z": rand(b, s, h, p), "dt_bias": torch.zeros(h, device=dev)}


def _leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_() for t in tensors]


def time_ssm_case(case: Case, dtype_name: str, timer) -> dict[str, float]:
    """{pass: µs} of one case (`timer`: tracekit.sampling.compute.Timer): the real kernel where it imports on a GPU
    (`ssm_cases` names it in the variant), else the torch reference."""
    from .compute import DTYPES

    dtype, dev = DTYPES[dtype_name], timer.device
    f = dict(case.features)
    kind = case.primitive
    if kind == "causal_conv1d":
        b, s, ch, taps = int(f["batch"]), int(f["seq"]), int(f["width"]), int(f["k"])
        x, w, bias = _leaves(torch.randn(b, s, ch, device=dev, dtype=dtype),
                             torch.randn(ch, taps, device=dev, dtype=dtype) * 0.2, torch.zeros(ch, device=dev,
                                                                                              dtype=dtype))
        real = _real_conv(dev)
        if real is not None:
            fwd, bwd = timer.fwd_bwd([x, w, bias], lambda: real(x.transpose(1, 2), w, bias, activation="silu"))
        else:
            fwd, bwd = timer.fwd_bwd([x, w, bias], lambda: causal_conv1d(x, w, bias))
        return {"fwd": fwd, "bwd": bwd}
    if kind == "gdn_chunk_rule":
        b, s, hv, d, q = (int(f[k]) for k in ("batch", "seq", "heads", "head_dim", "seq_kv"))
        qq, kk, vv = (torch.nn.functional.normalize(torch.randn(b, s, hv, d, device=dev), dim=-1).to(dtype)
                      for _ in range(3))
        g = -torch.rand(b, s, hv, device=dev) * 0.1
        beta = torch.rand(b, s, hv, device=dev).to(dtype)
        leaves = _leaves(qq, kk, vv, g, beta)
        ql, kl, vl, gl, bl = leaves
        fwd, bwd = timer.fwd_bwd(leaves, lambda: gated_delta_chunked(ql, kl, vl, gl, bl, chunk=q))
        return {"fwd": fwd, "bwd": bwd}
    if kind not in SSD_STEPS:
        raise ValueError(f"no timing recipe for primitive {kind!r}")
    chunk = int(f["seq_kv"])
    t = _ssd_inputs(f, dtype, dev)
    with torch.no_grad():
        dt_c, dA = chunk_cumsum(t["dt"], t["A"], chunk, t["dt_bias"])
        states = chunk_state(t["B"], t["x"], dt_c, dA)
        passed = state_passing(states, dA)
        cb = bmm_chunk(t["C"], t["B"], chunk)
    real = _real_ssd(kind, dev)
    if real is not None:
        return {"fwd": timer.once(real(t, chunk))}
    steps: dict[str, tuple[list[torch.Tensor], Callable]] = {}
    if kind == "ssd_chunk_cumsum":
        leaves = _leaves(t["dt"], t["dt_bias"])
        steps[kind] = (leaves, lambda: chunk_cumsum(leaves[0], t["A"], chunk, leaves[1])[1])
    elif kind == "ssd_chunk_state":
        leaves = _leaves(t["B"], t["x"], dt_c, dA)
        steps[kind] = (leaves, lambda: chunk_state(*leaves))
    elif kind == "ssd_state_passing":
        leaves = _leaves(states, dA)
        steps[kind] = (leaves, lambda: state_passing(*leaves))
    elif kind == "ssd_bmm_chunk":
        leaves = _leaves(t["C"], t["B"])
        steps[kind] = (leaves, lambda: bmm_chunk(leaves[0], leaves[1], chunk))
    else:
        leaves = _leaves(cb, t["x"], dt_c, dA, t["C"], passed, t["D"], t["z"])
        steps[kind] = (leaves, lambda: chunk_scan(*leaves))
    fwd, bwd = timer.fwd_bwd(*steps[kind])
    return {"fwd": fwd, "bwd": bwd}


def _real_conv(dev: torch.device):
    """causal_conv1d's CUDA kernel (x [batch, channels, seq]) on a GPU where it imports, else None."""
    if dev.type != "cuda":
        return None
    try:
        from causal_conv1d import causal_conv1d_fn  # type: ignore[import-not-found]
    except ImportError:
        return None
    return lambda x, w, bias, activation: causal_conv1d_fn(x, w, bias, activation=activation).transpose(1, 2)


def _real_ssd(kind: str, dev: torch.device) -> Callable | None:
    """mamba_ssm's forward Triton kernel of one SSD step on a GPU where it imports (its 2.x private entry points):
    a function of the inputs that runs the earlier steps once and returns the step alone; else None."""
    if dev.type != "cuda":
        return None
    try:
        from mamba_ssm.ops.triton import (  # type: ignore[import-not-found]
            ssd_bmm,
            ssd_chunk_scan,
            ssd_chunk_state,
            ssd_state_passing,
        )
    except ImportError:
        return None

    def prepare(t: dict[str, torch.Tensor], chunk: int) -> Callable[[], object]:
        def cumsum():
            return ssd_chunk_state._chunk_cumsum_fwd(t["dt"], t["A"], chunk, dt_bias=t["dt_bias"], dt_softplus=True)

        if kind == "ssd_chunk_cumsum":
            return cumsum
        dA, dt = cumsum()
        if kind == "ssd_chunk_state":
            return lambda: ssd_chunk_state._chunk_state_fwd(t["B"], t["x"], dt, dA, states_in_fp32=True)
        if kind == "ssd_bmm_chunk":
            return lambda: ssd_bmm._bmm_chunk_fwd(t["C"], t["B"], chunk, output_dtype=torch.float32)
        states = ssd_chunk_state._chunk_state_fwd(t["B"], t["x"], dt, dA, states_in_fp32=True)
        if kind == "ssd_state_passing":
            return lambda: ssd_state_passing._state_passing_fwd(states.flatten(-2), dA[:, :, :, -1],
                                                                out_dtype=t["C"].dtype)
        passed, _ = ssd_state_passing._state_passing_fwd(states.flatten(-2), dA[:, :, :, -1], out_dtype=t["C"].dtype)
        passed = passed.unflatten(-1, (-1, t["B"].shape[-1]))
        cb = ssd_bmm._bmm_chunk_fwd(t["C"], t["B"], chunk, output_dtype=torch.float32)
        return lambda: ssd_chunk_scan._chunk_scan_fwd(cb, t["x"], dt, dA, t["C"], passed, D=t["D"], z=t["z"])

    return prepare
