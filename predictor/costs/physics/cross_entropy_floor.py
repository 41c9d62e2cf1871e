"""The floor Megatron-core's native vocab-parallel cross entropy puts under its estimate: its bytes
(`predictor.layers.embedding.cross_entropy`: the fp32 passes over the logits) at the GPU's HBM bandwidth."""
from __future__ import annotations

import numpy as np
import pandas as pd

from predictor.costs.features import dtype_bytes, numeric_column
from predictor.costs.physics.hbm_floor import raise_to_bytes
from predictor.layers.embedding.cross_entropy import FP32_BYTES, NATIVE, bytes_per_logit


def apply(frame: pd.DataFrame, duration: np.ndarray) -> None:
    """Raise, in place, each native cross-entropy row's estimate on a datasheet GPU to at least its bytes at the HBM
    bandwidth."""
    if "variant" not in frame.columns or "numel" not in frame.columns:
        return
    rows = np.flatnonzero(((frame["primitive"] == "cross_entropy") & (frame["variant"] == NATIVE)).to_numpy())
    if not len(rows):
        return
    sub = frame.iloc[rows]
    element = dtype_bytes(sub["dtype"] if "dtype" in sub.columns else None, len(sub))
    per_logit = np.array([bytes_per_logit(p, e) if p in FP32_BYTES else np.nan
                          for p, e in zip(sub["pass"].astype(str), element)])
    raise_to_bytes(sub, duration, rows, numeric_column(sub, "numel") * per_logit)
