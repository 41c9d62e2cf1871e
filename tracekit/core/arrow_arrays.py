"""numpy columns and lists of text → Arrow arrays, built from their buffers (`pa.Array.from_buffers`), and back.

Written here on purpose rather than with `pa.array`: pyarrow's converters (`pa.array`, `pa.scalar`, and the compute
functions given a Python value or a numpy array) import pandas on their first call to check whether they were handed
pandas objects, which alone takes about as long as ingesting a folder of small traces (~0.4 s on a 2-core VM). The
arrays made here are the ones `pa.array(values, type=..., from_pandas=True)` makes: NaN and None are null. Nothing
here uses `pyarrow.compute` either (nor the array methods that call it: `take`, `filter`, `unique`,
`dictionary_encode`): importing it takes ~70 ms, a sixth of `tracekit ingest`'s start-up.
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


def text_codes(values: Sequence[str | None] | np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Each value's number, the distinct texts numbered in order of first appearance (None: -1), and those texts."""
    index: dict[str, int] = {}
    codes = np.fromiter((-1 if value is None else index.setdefault(value, len(index)) for value in values),
                        dtype=np.int64, count=len(values))
    return codes, list(index)


def string_array(values: Sequence[str | None] | np.ndarray) -> pa.Array:
    """string, None as null. Each distinct text is encoded once (columns of a trace's events repeat a few); the
    data buffer is their bytes joined in the rows' order."""
    codes, distinct = text_codes(values)
    if not distinct:
        return pa.nulls(len(codes), pa.string())
    encoded = np.empty(len(distinct) + 1, dtype=object)  # code -1 (a null) reads the last: no bytes
    encoded[:] = [value.encode() for value in distinct] + [b""]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))[codes]
    offsets = np.zeros(len(codes) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > _MAX_STRING_BYTES:
        raise ValueError(f"{offsets[-1]} bytes of text in one column: more than an Arrow string array holds")
    bitmap, nulls = _validity(codes >= 0, len(codes))
    data = encoded[0] * len(codes) if len(distinct) == 1 and not nulls else b"".join(encoded[codes].tolist())
    return pa.Array.from_buffers(pa.string(), len(codes), [bitmap, pa.py_buffer(offsets.astype(np.int32)),
                                                           pa.py_buffer(data)], null_count=nulls)


def _string_buffers(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A string array's offsets (its own rows') and data buffer, as numpy views."""
    if not pa.types.is_string(array.type):
        raise ValueError(f"not a string array: {array.type}")
    _, offsets, data = array.buffers()
    offsets_view = np.frombuffer(offsets, dtype=np.int32, count=len(array) + 1, offset=array.offset * 4) if len(
        array) else np.zeros(1, dtype=np.int32)
    return offsets_view, np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)


def holds_only(array: pa.Array, text: str) -> bool:
    """Whether every row of a string array is `text` (no null)."""
    offsets, data = _string_buffers(array)
    want = text.encode()
    if array.null_count or not np.all(np.diff(offsets) == len(want)):
        return False
    return not want or bool(np.all(data[offsets[0]:offsets[-1]].view(f"V{len(want)}") == np.void(want)))


def string_codes(array: pa.Array) -> tuple[np.ndarray, list[str]]:
    """A string array without nulls as `text_codes` numbers it: each row's number and the distinct texts, read from
    its buffers. Rows become fixed-width byte strings (with a terminator, so that texts differing by trailing NULs
    stay apart), runs of equal neighbours one, and the runs' first rows are numbered: fast on columns of few, short,
    repeated texts (a sample table's hardware and primitive)."""
    if array.null_count:
        raise ValueError(f"{array.null_count} null text(s) where none may be")
    offsets, data = _string_buffers(array)
    n = len(array)
    lengths = np.diff(offsets)
    width = int(lengths.max()) + 1 if n else 1
    grid = np.zeros((n, width), dtype=np.uint8)
    if n and np.all(lengths == width - 1):  # rows of one length: one reshape
        grid[:, :-1] = data[offsets[0]:offsets[-1]].reshape(n, width - 1)
    else:
        for column in range(width - 1):
            rows = np.flatnonzero(lengths > column)
            grid[rows, column] = data[offsets[rows] + column]
    grid[np.arange(n), lengths] = 1
    fixed = grid.view(f"S{width}").ravel()
    heads = np.flatnonzero(np.r_[True, fixed[1:] != fixed[:-1]]) if n else np.zeros(0, dtype=np.int64)
    index: dict[bytes, int] = {}
    numbers = np.fromiter((index.setdefault(bytes(key), len(index)) for key in fixed[heads]), dtype=np.int64,
                          count=len(heads))
    codes = np.repeat(numbers, np.diff(np.r_[heads, n]))
    return codes, [key[:-1].decode() for key in index]
