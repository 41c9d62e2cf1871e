"""The work (FLOPs, bytes moved, output tiles) of the operator rows the hybrid layers add, vectorized over a frame of
rows as `predictor.costs.features.compute_work` takes it: what the roofline answers for them until samples of them train
a model (their rows then take the path `roofline`, listed in a prediction's fallbacks).

Primitives and the shape features their rows carry (columns of `tracekit.core.samples.FEATURE_COLUMNS`):
- `causal_conv1d`: batch, seq, rows (= batch · seq), width (channels), k (kernel taps);
- `ssd_chunk_cumsum`, `ssd_chunk_state`, `ssd_state_passing`, `ssd_bmm_chunk`, `ssd_chunk_scan` (Mamba2's SSD):
  batch, seq, heads, head_dim, kv_heads (the B/C groups), width (the state size N), seq_kv (the chunk size);
- `gdn_chunk_rule` (Gated DeltaNet): batch, seq, heads (value heads), head_dim (value dim), width (key dim), seq_kv
  (the chunk);
- `dsa_index_scores`: batch, seq, seq_kv (keys), heads (index heads), head_dim, causal (1: a fused kernel's causal
  tiles; 0: PyTorch's dense fp32 path), width (element-wise steps per score: 3, or 2 without the ReLU; 3 when
  absent); `dsa_topk`: rows, width (keys), k (top-k);
- `sparse_attention`: the attention features, seq_kv the keys each query reads, head_dim the mean of the latent
  query/key and value dims (its work: attention's at that seq_kv, not causal).
A backward row of an SSD kernel is the work of the kernels that compute its gradients
(`predictor.layers.ssm.scan_work.ssd_backward_work`); any other backward row twice its forward's
(`predictor.layers.ssm.scan_work.backward`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .dsa import index_scores_work, sparse_attention_work, topk_work
from .ssm.scan_work import (
    CONV,
    GDN_RULE,
    SSD_KERNELS,
    TENSOR_CORE,
    conv_work,
    gdn_work,
    ssd_backward_work,
    ssd_work,
)

PRIMITIVES = (CONV, *SSD_KERNELS, GDN_RULE, "dsa_index_scores", "dsa_topk", "sparse_attention")
#: Shape features per primitive (for `predictor.costs.features.SHAPE_FEATURES`).
SHAPE_FEATURES: dict[str, tuple[str, ...]] = {
    CONV: ("batch", "seq", "rows", "width", "k"),
    **{k: ("batch", "seq", "heads", "head_dim", "kv_heads", "width", "seq_kv") for k in SSD_KERNELS},
    GDN_RULE: ("batch", "seq", "heads", "head_dim", "width", "seq_kv"),
    "dsa_index_scores": ("batch", "seq", "seq_kv", "heads", "head_dim", "causal", "width"),
    "dsa_topk": ("rows", "width", "k"),
    "sparse_attention": ("batch", "heads", "seq", "seq_kv", "head_dim"),
}
#: Of these, the kernels whose products run on tensor cores (the roofline's tensor peak).
TENSOR_CORE_PRIMITIVES = (*[k for k in TENSOR_CORE], "dsa_index_scores", "sparse_attention")
TILE = 128


def _col(frame: pd.DataFrame, name: str, rows: np.ndarray) -> np.ndarray:
    if name not in frame.columns:
        return np.full(int(rows.sum()), np.nan)
    return pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype="float64")[rows]


def work(frame: pd.DataFrame, esize: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(FLOPs, bytes, tiles) per row for the primitives above (NaN for other rows); `esize`: each row's bytes per
    element (`predictor.costs.features.dtype_bytes`)."""
    n = len(frame)
    flops, moved, tiles = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    prim = frame["primitive"].astype("string").fillna("").to_numpy()
    bwd = (frame["pass"].astype("string").fillna("").to_numpy() == "bwd") if "pass" in frame.columns \
        else np.zeros(n, dtype=bool)
    for kind in PRIMITIVES:
        rows = prim == kind
        if not rows.any():
            continue

        def col(name: str) -> np.ndarray:
            return _col(frame, name, rows)  # noqa: B023 - used inside this iteration only

        e = esize[rows]
        if kind == CONV:
            f, m = conv_work(col("rows"), col("width"), col("k"), e)
            t = np.ceil(col("rows") * col("width") / (TILE * TILE))
        elif kind in SSD_KERNELS:
            args = (kind, col("batch"), col("seq"), col("heads"), col("head_dim"), col("kv_heads"), col("width"),
                    col("seq_kv"))
            f, m = ssd_work(*args, e)
            back_f, back_m = ssd_backward_work(*args, e)
            b_rows = bwd[rows]  # their gradients' kernels, not twice the forward (undone by the scale below)
            f = np.where(b_rows, np.asarray(back_f, dtype="float64") / 2.0, f)
            m = np.where(b_rows, np.asarray(back_m, dtype="float64") / 2.0, m)
            t = col("batch") * np.ceil(col("seq") / col("seq_kv")) * col("heads")
        elif kind == GDN_RULE:
            f, m = gdn_work(col("batch"), col("seq"), col("heads"), col("width"), col("head_dim"), col("seq_kv"), e)
            t = col("batch") * np.ceil(col("seq") / col("seq_kv")) * col("heads")
        elif kind == "dsa_index_scores":
            passes = np.nan_to_num(col("width"), nan=3.0)
            f, m = index_scores_work(col("batch"), col("seq"), col("seq_kv"), col("heads"), col("head_dim"),
                                     col("causal") > 0, e, passes)
            f, m = np.asarray(f, dtype="float64"), np.asarray(m, dtype="float64")
            t = col("batch") * np.ceil(col("seq") / TILE) * np.ceil(col("seq_kv") / TILE)
        elif kind == "dsa_topk":
            f, m = topk_work(col("rows"), col("width"), col("k"))
            t = np.ceil(col("rows") / TILE)
        else:
            qk_v = 2.0 * col("head_dim")  # the mean of the latent query/key and value dims, doubled
            f, m = sparse_attention_work(col("batch"), col("seq"), col("seq_kv"), col("heads"), qk_v / 2, qk_v / 2, e)
            t = col("batch") * col("heads") * np.ceil(col("seq") / TILE)
        scale = np.where(bwd[rows], 2.0, 1.0)
        flops[rows] = np.asarray(f, dtype="float64") * scale
        moved[rows] = np.asarray(m, dtype="float64") * scale
        tiles[rows] = t
    return flops, moved, tiles
