"""FLOPs and bytes of the kernels the recurrent mixers add, as functions of their shapes (plain arithmetic: numbers or
numpy arrays alike), for the operator rows of `mamba` / `gated_delta_net` and the roofline (`predictor.layers.
kernel_work`).

Design note
-----------
Mamba2's SSD ("Transformers are SSMs", Dao & Gu 2024) splits a sequence of T tokens into chunks of Q. With H heads of
head dim P, a state of N per head and G groups of (B, C) shared by H/G heads each, Megatron's training path
(`mamba_split_conv1d_scan_combined`: mamba_ssm's Triton kernels) runs, forward:

- `ssd_chunk_cumsum`: dt ← softplus(dt + bias), dA = dt·A, cumulative sum inside each chunk (fp32 outputs);
- `ssd_chunk_state`: each chunk's final state, x weighted by B, dt and the decay to the chunk end: a [P × Q]·[Q × N]
  product per chunk and head, 2·T·H·P·N FLOPs, states written in fp32;
- `ssd_state_passing`: the recurrence over chunk boundaries, 2·(T/Q)·H·P·N FLOPs, states out in the state dtype;
- `ssd_bmm_chunk`: C·Bᵀ inside each chunk per group, 2·T·Q·G·N FLOPs (the whole square), written in fp32;
- `ssd_chunk_scan`: the outputs: the intra-chunk (causal) product of the decayed C·Bᵀ with x, T·Q·H·P FLOPs (half of
  the square: the kernel skips tiles above the diagonal), plus C times the incoming state, 2·T·H·P·N, plus the skip
  D·x and the gate y·silu(z) (Megatron passes z to the scan), writing the gated output and the ungated one it saves.
So the scan is linear in T (T·(4·H·P·N + Q·H·P + 2·Q·G·N)) where attention's scores are quadratic (2·T²·heads·d
causal). The depthwise causal convolution (`causal_conv1d`, kernel K over the x, B, C channels) is 2·T·channels·K.

Bytes count each tensor read or written once per kernel (activation dtype `esize`, fp32 for dt, dA, C·Bᵀ and the
chunk states as the kernels keep them); C·Bᵀ is read once per group, not per head (the heads of a group share it in
L2: a lower bound). A backward row of the convolution or of GDN's rule does twice its forward work (the gradients of
each input); an SSD kernel's backward row is the work of the kernels mamba_ssm runs for its gradients
(`_mamba_chunk_scan_combined_bwd` in `mamba_ssm/ops/triton/ssd_combined.py`, `ssd_backward_work`), each reading and
writing its tensors once: about 2.2× the forward's FLOPs but several passes over x and the output gradient. What the
backward recomputes first is in neither: the operator lists add it as forward rows in the backward (the combined
function recomputes the convolution, the cumulative sums, the chunk states and C·Bᵀ; FLA's gated delta rule its
chunk states).

The SSD gradients by kernel, and the forward kernel whose backward row holds them:
- `ssd_chunk_scan`: `_chunk_scan_bwd_dz` (the gate: reads x, z, the output and its gradient, writes dz and the
  ungated gradient), `_chunk_scan_bwd_dstates` (C·dout per chunk, 2·T·H·P·N), `_chunk_scan_chunk_state_bwd_dx`
  ((C·Bᵀ)ᵀ·dout, causal: T·Q·H·P, and B·dstates, 2·T·H·P·N; reads C·Bᵀ, B, dout, dstates), `_chunk_scan_bwd_dC`
  (dout·states, 2·T·H·P·N), `_chunk_scan_bwd_dcb` (dout·xᵀ per chunk, causal: T·Q·H·P) and
  `_chunk_scan_bwd_ddAcs_stable` (the decays' gradient from C·Bᵀ, x and dout: T·Q·H·P);
- `ssd_chunk_state`: `_chunk_state_bwd_db` (x·dstates, 2·T·H·P·N);
- `ssd_state_passing`: `_state_passing_bwd` (the recurrence backwards over the chunk states);
- `ssd_bmm_chunk`: two `_bmm_chunk_bwd` (dB += C·dCB, dC += B·dCBᵀ: 2·T·Q·G·N each);
- `ssd_chunk_cumsum`: `_chunk_cumsum_bwd`.

Gated DeltaNet's chunked rule (FLA's `chunk_gated_delta_rule`, chunk C = 64, value heads Hv after Megatron repeats
the query/key heads to them, key dim dk, value dim dv), per token and head: K·Kᵀ inside the chunk (2·C·dk), the
triangular solve of (I + A) (⅔·C²), w = A·(β·k·eᵍ) and u = A·(β·v) (2·C·(dk + dv)), the state recurrence v' = u −
w·S and S ← S + kᵀ·v' (4·dk·dv), the output q·kᵀ and (q·kᵀ)·v' (2·C·(dk + dv)) and q·S (2·dk·dv): linear in T too.
"""
from __future__ import annotations

import math
from typing import Any

#: The kernels of the Mamba2 SSD, in the order they run.
SSD_KERNELS = ("ssd_chunk_cumsum", "ssd_chunk_state", "ssd_state_passing", "ssd_bmm_chunk", "ssd_chunk_scan")
CONV = "causal_conv1d"
GDN_RULE = "gdn_chunk_rule"
#: Kernels whose products run on tensor cores (Triton's tl.dot); the others are vector work.
TENSOR_CORE = ("ssd_chunk_state", "ssd_bmm_chunk", "ssd_chunk_scan", GDN_RULE)
#: What the backward of each recomputes before its gradients (forward rows placed in the backward).
RECOMPUTED = ("ssd_chunk_cumsum", "ssd_chunk_state", "ssd_state_passing", "ssd_bmm_chunk")
FP32 = 4.0


def chunks(seq: Any, chunk: Any) -> Any:
    """Chunks of one sequence (the last one partial): a number for numbers, an array for arrays."""
    if isinstance(seq, (int, float)) and isinstance(chunk, (int, float)):
        return math.ceil(seq / chunk)
    import numpy as np

    return np.ceil(np.asarray(seq, dtype="float64") / chunk)


def ssd_work(kernel: str, batch: Any, seq: Any, heads: Any, head_dim: Any, groups: Any, state: Any, chunk: Any,
             esize: Any = 2.0, state_esize: Any = None) -> tuple[Any, Any]:
    """(FLOPs, bytes) of one forward SSD kernel over `batch` sequences of `seq` tokens (module docstring); the chunk
    states leave `ssd_state_passing` in `state_esize` (default: the activation dtype, Megatron's default)."""
    t = batch * seq
    n_chunks = batch * chunks(seq, chunk)
    se = esize if state_esize is None else state_esize
    hp = heads * head_dim
    states = n_chunks * hp * state
    if kernel == "ssd_chunk_cumsum":
        return t * heads * 8.0, t * heads * (esize + 2 * FP32)
    if kernel == "ssd_chunk_state":
        return (2.0 * t * hp * state + t * hp,
                t * hp * esize + t * groups * state * esize + t * heads * 2 * FP32 + states * FP32)
    if kernel == "ssd_state_passing":
        return 2.0 * states, states * (FP32 + se) + n_chunks * heads * FP32
    if kernel == "ssd_bmm_chunk":
        return 2.0 * t * chunk * groups * state, 2.0 * t * groups * state * esize + t * groups * chunk * FP32
    if kernel == "ssd_chunk_scan":
        flops = t * chunk * hp + 2.0 * t * hp * state + t * chunk * heads + 4.0 * t * hp
        moved = (t * groups * chunk * FP32 + t * hp * esize + t * groups * state * esize + states * se
                 + t * heads * 2 * FP32 + t * hp * esize * 3.0)  # x; z read, the gated and ungated outputs written
        return flops, moved
    raise ValueError(f"not an SSD kernel: {kernel!r}")


def ssd_backward_work(kernel: str, batch: Any, seq: Any, heads: Any, head_dim: Any, groups: Any, state: Any,
                      chunk: Any, esize: Any = 2.0) -> tuple[Any, Any]:
    """(FLOPs, bytes) of the kernels that compute the gradients of forward SSD kernel `kernel` (module docstring),
    over `batch` sequences of `seq` tokens; the chunk states they read and write in the activation dtype, fp32 where
    the kernels keep them so (dt, the decays and their gradients, C·Bᵀ and its gradient, dB and dC before the cast)."""
    t = batch * seq
    n_chunks = batch * chunks(seq, chunk)
    hp = heads * head_dim
    states = n_chunks * hp * state
    act = t * hp * esize  # x, z, the output, its gradient: one pass over one of them
    bc = t * groups * state * esize  # B or C
    per_head = t * heads * FP32  # dt, the decays, their gradients
    cb = t * groups * chunk * FP32  # C·Bᵀ or its gradient (read once per group: a lower bound, as forward)
    if kernel == "ssd_chunk_cumsum":
        return t * heads * 8.0, per_head * 3.0 + t * heads * esize
    if kernel == "ssd_chunk_state":  # _chunk_state_bwd_db
        return 2.0 * t * hp * state, act + 2.0 * per_head + states * esize + bc + t * groups * state * FP32 + per_head
    if kernel == "ssd_state_passing":
        return 4.0 * states, states * (2.0 * FP32 + 2.0 * esize) + n_chunks * heads * FP32 * 2.0
    if kernel == "ssd_bmm_chunk":  # two _bmm_chunk_bwd: the operand, dCB, the residual gradient in, the sum out
        return 2.0 * (2.0 * t * chunk * groups * state), 2.0 * (bc + cb + t * groups * state * FP32 + bc)
    if kernel == "ssd_chunk_scan":  # (bytes, FLOPs) of each kernel
        dz = (6.0 * act, 10.0 * t * hp)  # x, z, out, dout in; dz, dout·silu(z) out
        dstates = (bc + per_head + act + states * FP32, 2.0 * t * hp * state)  # C, dA, dout in; dstates out
        dx = (3.0 * act + 3.0 * per_head + bc + cb + states * esize,  # x, dt, dA, B, CB, dout, dstates; dx, ddt
              t * chunk * hp + 2.0 * t * hp * state)
        dc = (states * esize + 2.0 * per_head + act + bc + t * groups * state * FP32, 2.0 * t * hp * state)
        dcb = (2.0 * act + 2.0 * per_head + cb, t * chunk * hp)  # x, dt, dA, dout in; dCB out
        ddacs = (2.0 * act + 3.0 * per_head + cb, t * chunk * hp + t * chunk * heads)  # x, dout, dt, dA, CB; ddA
        parts = (dz, dstates, dx, dc, dcb, ddacs)
        return sum(f for _, f in parts), sum(m for m, _ in parts)
    raise ValueError(f"not an SSD kernel: {kernel!r}")


def conv_work(tokens: Any, channels: Any, kernel: Any, esize: Any = 2.0) -> tuple[Any, Any]:
    """(FLOPs, bytes) of a forward depthwise causal convolution with bias and SiLU over `tokens` × `channels`."""
    return 2.0 * tokens * channels * kernel + 5.0 * tokens * channels, \
        2.0 * tokens * channels * esize + channels * (kernel + 1) * esize


def gdn_work(batch: Any, seq: Any, heads: Any, key_dim: Any, value_dim: Any, chunk: Any, esize: Any = 2.0
             ) -> tuple[Any, Any]:
    """(FLOPs, bytes) of FLA's forward chunked gated delta rule (module docstring) over `heads` value heads."""
    t = batch * seq
    n_chunks = batch * chunks(seq, chunk)
    per = 2.0 * chunk * key_dim + 2.0 * chunk * chunk / 3.0 + 2.0 * chunk * (key_dim + value_dim) \
        + 6.0 * key_dim * value_dim + 2.0 * chunk * (key_dim + value_dim)
    flops = t * heads * per
    io = t * heads * (2 * key_dim + value_dim) * esize + t * heads * 2 * FP32 + t * heads * value_dim * esize
    intermediate = 2.0 * t * heads * (key_dim + value_dim) * esize  # w and u written and read back
    states = n_chunks * heads * key_dim * value_dim * FP32
    return flops, io + intermediate + states


def backward(flops: Any, moved: Any) -> tuple[Any, Any]:
    """A backward row's work: the gradients of each input, twice the forward's (recomputation apart)."""
    return 2.0 * flops, 2.0 * moved
