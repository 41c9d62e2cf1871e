"""Model inputs: each primitive's shape features plus physics features derived from them and the hardware.

Physics features (all vectorized over a DataFrame of samples or operator rows):
- compute primitives: FLOPs, bytes moved, arithmetic intensity, output tiles (128×128) and waves over the SMs;
- collectives: bytes each rank puts on the wire (ring algorithm), ring steps, whether the group crosses nodes.

Conventions for collectives: `bytes` is the per-rank buffer handed to the collective — the whole buffer for
all_reduce/broadcast/send_recv/all_to_all, each rank's input shard for all_gather and each rank's output shard for
reduce_scatter (so all_gather and reduce_scatter at the same `bytes` move the same traffic).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from predictor.layers import kernel_work
from tracekit.core.samples import COLLECTIVE_PRIMITIVES

TILE = 128  # output tile edge used for tile/wave counts (typical tensor-core CTA tile)

#: Bytes per element, the scales of the block-scaled formats included (fp8_block: an fp32 scale per 128 elements,
#: MXFP8 / MXFP4: an E8M0 byte per 32, NVFP4: an E4M3 byte per 16).
_DTYPE_BYTES = {
    "fp16": 2, "float16": 2, "half": 2, "c10::half": 2, "bf16": 2, "bfloat16": 2, "c10::bfloat16": 2,
    "fp32": 4, "float32": 4, "float": 4, "tf32": 4, "fp8": 1, "float8": 1, "fp64": 8, "double": 8, "float64": 8,
    "fp8_block": 1 + 4 / 128, "fp8_row": 1, "mxfp8": 1 + 1 / 32, "nvfp4": 0.5 + 1 / 16, "mxfp4": 0.5 + 1 / 32,
}

#: Shape features each primitive is described by (subset of core.samples.FEATURE_COLUMNS).
SHAPE_FEATURES: dict[str, tuple[str, ...]] = {
    "gemm": ("m", "n", "k", "batch"),
    "bmm": ("m", "n", "k", "batch"),
    "attention": ("batch", "heads", "kv_heads", "seq", "seq_kv", "head_dim", "causal"),
    "softmax": ("rows", "width", "batch", "heads", "head_dim", "numel"),
    "norm": ("rows", "width", "numel"),
    "activation": ("rows", "width", "numel"),
    "elementwise": ("rows", "width", "heads", "head_dim", "numel"),
    "embedding": ("rows", "width", "params", "tp", "numel"),
    "cross_entropy": ("rows", "width", "tp", "numel"),
    "optimizer": ("params", "layers", "width", "tp"),
    "memcpy": ("bytes", "numel"),
    "memset": ("bytes", "numel"),
    **{c: ("bytes", "group_size", "ranks_per_node", "nodes") for c in COLLECTIVE_PRIMITIVES},
    **kernel_work.SHAPE_FEATURES,  # the hybrid layers' kernels (Mamba2's SSD and convolution, GDN's rule, DSA's)
}
DEFAULT_SHAPE_FEATURES = ("numel", "rows", "width", "bytes")

#: Physics features computed for every row (NaN where they do not apply).
PHYSICS_FEATURES = ("log_flops", "log_bytes", "intensity", "tiles", "waves", "wave_efficiency", "log_roofline")


def dtype_bytes(dtype: pd.Series | None, length: int) -> np.ndarray:
    """Bytes per element for each row's dtype string (2 when unknown: the samples are mostly fp16/bf16)."""
    if dtype is None:
        return np.full(length, 2.0)
    keys = dtype.astype("string").str.lower().str.strip()
    return keys.map(_DTYPE_BYTES).astype("float64").fillna(2.0).to_numpy()


def numeric_column(frame: pd.DataFrame, name: str, default: float = np.nan) -> np.ndarray:
    """A column as float64 (unparseable values NaN; `default` everywhere when the frame has no such column)."""
    if name in frame.columns:
        return pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    return np.full(len(frame), default)


def ring_traffic(primitive: np.ndarray, nbytes: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Bytes each rank sends with a ring algorithm (nccl-tests' bus-bandwidth convention)."""
    n = np.maximum(group, 1.0)
    out = np.full(len(nbytes), np.nan)
    out = np.where(primitive == "all_reduce", 2.0 * (n - 1.0) / n * nbytes, out)
    out = np.where(np.isin(primitive, ("all_gather", "reduce_scatter")), (n - 1.0) * nbytes, out)
    out = np.where(primitive == "all_to_all", (n - 1.0) / n * nbytes, out)
    out = np.where(np.isin(primitive, ("broadcast", "send_recv")), nbytes, out)
    return out


def compute_work(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FLOPs, bytes moved and output tiles per row (NaN where a primitive's work is not modelled).

    The backward pass of GEMM-like primitives does twice the forward work (dgrad + wgrad); attention's backward
    2.5× (recompute of scores included), causal attention half the score work. A backward row with a `role`
    (features of the forward GEMM M × K · K × N) is one part of it: `dgrad` and `wgrad` one forward's work each
    with M × K and K × N output tiles, `bgrad` a reduction of the M × N gradient to N.
    """
    prim = frame["primitive"].astype("string").fillna("").to_numpy()
    passes = (frame["pass"].astype("string").fillna("").to_numpy() if "pass" in frame.columns
              else np.full(len(frame), ""))
    esize = dtype_bytes(frame["dtype"] if "dtype" in frame.columns else None, len(frame))
    m, n, k = numeric_column(frame, "m"), numeric_column(frame, "n"), numeric_column(frame, "k")
    batch = np.nan_to_num(numeric_column(frame, "batch"), nan=1.0)
    rows, width, numel = numeric_column(frame, "rows"), numeric_column(frame, "width"), numeric_column(frame, "numel")
    numel = np.where(np.isnan(numel), rows * width, numel)
    bwd = passes == "bwd"
    role = frame["role"].astype("string").fillna("").to_numpy() if "role" in frame.columns else np.full(len(frame), "")

    flops = np.full(len(frame), np.nan)
    moved = np.full(len(frame), np.nan)
    tiles = np.full(len(frame), np.nan)

    is_mm = np.isin(prim, ("gemm", "bmm"))
    whole = np.where(bwd & ~np.isin(role, ("dgrad", "wgrad")), 2.0, 1.0)
    mm_flops = 2.0 * batch * m * n * k * whole
    mm_bytes = esize * batch * (m * k + k * n + m * n) * whole
    out_m = np.where(role == "wgrad", k, m)  # output of dgrad: M × K, of wgrad: K × N
    out_n = np.where(role == "dgrad", k, n)
    mm_tiles = batch * np.ceil(out_m / TILE) * np.ceil(out_n / TILE)
    bias = role == "bgrad"
    mm_flops = np.where(bias, batch * m * n, mm_flops)
    mm_bytes = np.where(bias, esize * batch * (m * n + n), mm_bytes)
    mm_tiles = np.where(bias, np.ceil(batch * m * n / (TILE * TILE)), mm_tiles)
    flops = np.where(is_mm, mm_flops, flops)
    moved = np.where(is_mm, mm_bytes, moved)
    tiles = np.where(is_mm, mm_tiles, tiles)

    is_attn = prim == "attention"
    heads, seq, dim = numeric_column(frame, "heads"), numeric_column(frame, "seq"), numeric_column(frame, "head_dim")
    seq_kv = numeric_column(frame, "seq_kv")
    seq_kv = np.where(np.isnan(seq_kv), seq, seq_kv)
    causal = np.nan_to_num(numeric_column(frame, "causal"), nan=0.0)
    at_flops = 4.0 * batch * heads * seq * seq_kv * dim * np.where(causal > 0, 0.5, 1.0) * np.where(bwd, 2.5, 1.0)
    at_bytes = esize * batch * heads * dim * (2.0 * seq + 2.0 * seq_kv) * np.where(bwd, 2.5, 1.0)
    flops = np.where(is_attn, at_flops, flops)
    moved = np.where(is_attn, at_bytes, moved)
    tiles = np.where(is_attn, batch * heads * np.ceil(seq / TILE), tiles)

    # Memory-bound primitives: read + write the main tensor (backward reads the gradient too).
    rw = np.where(bwd, 3.0, 2.0)
    is_stream = np.isin(prim, ("softmax", "norm", "activation", "elementwise", "embedding", "cross_entropy"))
    moved = np.where(is_stream, esize * numel * rw, moved)
    flops = np.where(is_stream, numel * 8.0, flops)
    tiles = np.where(is_stream, np.ceil(numel / (TILE * TILE)), tiles)

    # Adam: fp32 master weight, grad, two moments read and written, fp16 copy written: ~18 bytes/parameter.
    params = numeric_column(frame, "params")
    is_opt = prim == "optimizer"
    moved = np.where(is_opt, 18.0 * params, moved)
    flops = np.where(is_opt, 12.0 * params, flops)

    is_copy = np.isin(prim, ("memcpy", "memset"))
    nb = numeric_column(frame, "bytes")
    moved = np.where(is_copy, np.where(prim == "memcpy", 2.0, 1.0) * nb, moved)

    # the hybrid layers' kernels: their work as `predictor.layers.kernel_work` counts it
    hybrid = np.isin(prim, kernel_work.PRIMITIVES)
    if hybrid.any():
        k_flops, k_moved, k_tiles = kernel_work.work(frame, esize)
        flops, moved, tiles = (np.where(hybrid, k, v) for k, v in ((k_flops, flops), (k_moved, moved),
                                                                    (k_tiles, tiles)))
    return flops, moved, tiles


def physics_features(frame: pd.DataFrame, sms: np.ndarray, roofline_us: np.ndarray) -> pd.DataFrame:
    """Physics features of each row given the SM count of its hardware and its roofline estimate (µs)."""
    flops, moved, tiles = compute_work(frame)
    prim = frame["primitive"].astype("string").fillna("").to_numpy()
    is_coll = np.isin(prim, COLLECTIVE_PRIMITIVES)
    traffic = ring_traffic(prim, numeric_column(frame, "bytes"), numeric_column(frame, "group_size"))
    moved = np.where(is_coll, traffic, moved)
    with np.errstate(divide="ignore", invalid="ignore"):
        waves = tiles / sms
        wave_eff = tiles / (np.ceil(waves) * sms)
        intensity = flops / moved
        out = pd.DataFrame(
            {
                "log_flops": np.log10(flops),
                "log_bytes": np.log10(moved),
                "intensity": intensity,
                "tiles": tiles,
                "waves": waves,
                "wave_efficiency": wave_eff,
                "log_roofline": np.log10(roofline_us),
            },
            index=frame.index,
        )
    return out.replace([np.inf, -np.inf], np.nan)


def shape_features(primitive: str) -> tuple[str, ...]:
    return SHAPE_FEATURES.get(primitive, DEFAULT_SHAPE_FEATURES)
