"""numpy columns and lists of text → Arrow arrays, built from their buffers (`pa.Array.from_buffers`).

Written here on purpose rather than with `pa.array`: pyarrow's converters (`pa.array`, `pa.scalar`, and the compute
functions given a Python value or a numpy array) import pandas on their first call to check whether they were handed
pandas objects, which alone takes about as long as ingesting a folder of small traces (~0.4 s on a 2-core VM). The
arrays made here are the ones `pa.array(values, type=..., from_pandas=True)` makes: NaN and None are null.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

#: The most bytes of text one `pa.string()` array holds (32-bit offsets).
_MAX_STRING_BYTES = 2**31 - 1


def _validity(valid: np.ndarray | None, n: int) -> tuple[pa.Buffer | None, int]:
    """Arrow's validity bitmap (least significant bit first) and null count; no bitmap when nothing is null."""
    if valid is None:
        return None, 0
    nulls = n - int(np.count_nonzero(valid))
    return (pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None), nulls


def float64_array(values: np.ndarray, nan_as_null: bool = True) -> pa.Array:
    """float64, NaN as null (or kept, a value)."""
    values = np.ascontiguousarray(values, dtype=np.float64)
    bitmap, nulls = _validity(~np.isnan(values) if nan_as_null else None, len(values))
    return pa.Array.from_buffers(pa.float64(), len(values), [bitmap, pa.py_buffer(values)], null_count=nulls)


def int64_array(values: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """int64; where `valid` is False, null."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    bitmap, nulls = _validity(valid, len(values))
    return pa.Array.from_buffers(pa.int64(), len(values), [bitmap, pa.py_buffer(values)], null_count=nulls)


def _distinct_strings(values: list[str]) -> pa.Array:
    encoded = [value.encode() for value in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    if offsets[-1] > _MAX_STRING_BYTES:
        raise ValueError(f"{offsets[-1]} bytes of text in one column: more than an Arrow string array holds")
    return pa.Array.from_buffers(pa.string(), len(encoded),
                                 [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(encoded))])


def string_array(values: Sequence[str | None] | np.ndarray) -> pa.Array:
    """string, None as null. Each distinct text is encoded once (columns of a trace's events repeat a few)."""
    index: dict[str, int] = {}
    codes = np.fromiter((-1 if value is None else index.setdefault(value, len(index)) for value in values),
                        dtype=np.int64, count=len(values))
    valid = codes >= 0
    if not index:
        return pa.nulls(len(codes), pa.string())
    return _distinct_strings(list(index)).take(int64_array(np.where(valid, codes, 0), valid))


def integer_values(array: pa.Array) -> np.ndarray:
    """The values of an integer array without nulls, as a numpy view of its buffer (`to_numpy` goes through
    pyarrow's pandas conversion, which imports pandas)."""
    if array.null_count or not pa.types.is_integer(array.type):
        raise ValueError(f"not an integer array without nulls: {array.type}, {array.null_count} null")
    dtype = np.dtype(array.type.to_pandas_dtype())
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)
