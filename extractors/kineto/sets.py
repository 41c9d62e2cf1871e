"""Sets of integers as sorted numpy arrays: what `np.unique(values)` and `np.isin` give, without their masked-array
check (`np.unique` without indices nor counts, also inside `np.isin`, asks `np.ma.is_masked`, whose import of
numpy.ma costs every ingest ~20 ms)."""
from __future__ import annotations

import numpy as np


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted."""
    ordered = np.sort(np.asarray(values).ravel())
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]] if len(ordered) else ordered


def members(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """Whether each value is in `sorted_set` (sorted, as `distinct` gives)."""
    if not len(sorted_set):
        return np.zeros(np.shape(values), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_set, values), len(sorted_set) - 1)
    return sorted_set[at] == values
