"""What the readers of published performance tables (XLA's GEMM and collective tables, aiter's tuner outputs) share:
the result of reading one file — its samples, the rows refused by name and why, and what the file says about its own
provenance and cannot say — and the plausibility checks every GEMM row goes through.

A refused row is never dropped silently: it is kept in `TableRead.refused` as {"line", "row", "reason"} (the CSV
line, a name a person can find the row by, and the check it failed), and `tracekit import` counts and lists it.
A row is refused when

- its integrity check fails (`exact_ns`: XLA's tables store throughputs computed from integer-nanosecond timings,
  so the time they imply must be an integer number of nanoseconds; a mistyped digit breaks that);
- it is faster than the part's dense peak for its dtype (`dense_peak_tflops`): no kernel can do that;
- its whole (file, dtype) table is implausible against the same file's bf16 rows at the same shapes
  (`implausible_lowp`): a low-precision table whose median speed-up over bf16 on the compute-bound shapes is below
  1 (not a low-precision tensor-core path: a fallback) or above the datasheet's peak ratio (faster than the tensor
  cores allow);
- it repeats a shape and dtype listed again later in the file (the later entry is kept);
- the part it was measured on has no datasheet entry, or the file names a part whose CU/SM count disagrees.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from tracekit.core.errors import InputError
from tracekit.core.hardware import hardware_spec

#: The GEMM dtypes below bf16 a table's rows can carry (their peaks: `dense_peak_tflops`).
LOW_PRECISION = ("fp8", "fp8_block", "mxfp8", "nvfp4", "mxfp4")
#: What none of the published tables states about how it was measured.
NOT_STATED = "not stated by the table"


@dataclass
class TableRead:
    """One file read: its samples (the `tracekit.core.samples` schema), the rows refused by name, and what the file
    says about where it comes from (`facts`: source repository, commit, part, what it cannot tell)."""

    samples: pd.DataFrame
    refused: list[dict] = field(default_factory=list)
    facts: dict = field(default_factory=dict)


def read_table(path: Path, columns: tuple[str, ...], what: str) -> pd.DataFrame:
    """A table's cells as strings (column names stripped); InputError naming the file when it is unreadable, lacks
    one of `columns` (it is then not a `what`) or has no rows."""
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise InputError(path, f"unreadable CSV ({str(exc).splitlines()[0]})") from exc
    frame.columns = [c.strip() for c in frame.columns]
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise InputError(path, f"not {what}: missing column(s) {missing}")
    if frame.empty:
        raise InputError(path, "no rows")
    return frame


def numbers(frame: pd.DataFrame, path: Path, columns: Sequence[str], zero_ok: tuple[str, ...] = ()
            ) -> dict[str, np.ndarray]:
    """The columns as positive numbers (non-negative for `zero_ok`); InputError naming the file and line of the first
    cell that is not."""
    out = {}
    for col in columns:
        values = pd.to_numeric(frame[col].str.strip(), errors="coerce")
        positive = col not in zero_ok
        bad = values.isna() | ~np.isfinite(values) | ((values <= 0) if positive else (values < 0))
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise InputError(path, f"line {row + 2}: column {col!r} has {frame[col].iloc[row]!r}, "
                                   f"expected a {'positive ' if positive else ''}number")
        out[col] = values.to_numpy(dtype="float64")
    return out


def dense_peak_tflops(hardware: str, dtype: str) -> float:
    """Dense tensor-core peak (TFLOP/s) of a part for a GEMM dtype; `tf32` (what XLA's default precision runs an f32
    dot in on NVIDIA and CDNA 3 parts) among them; 0 where unknown."""
    spec = hardware_spec(hardware)
    return 0.0 if spec is None else spec.peak_tflops(dtype)


def refuse(refused: list[dict], lines: np.ndarray | list, names: list[str], reason: str) -> None:
    """Record rows (CSV line numbers and names) refused for one reason."""
    for line, name in zip(lines, names):
        refused.append({"line": int(line), "row": name, "reason": reason})


def above_peak(hardware: str, dtype: pd.Series, flops: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Rows faster than the part's dense peak for their dtype (False where the peak is unknown)."""
    out = np.zeros(len(dtype), dtype=bool)
    for name in dtype.unique():
        peak = dense_peak_tflops(hardware, str(name))
        if peak > 0:
            rows = (dtype == name).to_numpy() & (seconds > 0)
            out[rows] = flops[rows] / seconds[rows] > peak * 1e12
    return out


def implausible_lowp(frame: pd.DataFrame, hardware: str, keys: list[str]) -> dict[str, str]:
    """{low-precision dtype: reason} for the dtypes of one file that are implausible against the same file's bf16 rows:
    over the compute-bound shapes (the quarter of shapes with the highest bf16 throughput, where the tensor cores set
    the pace), the median speed-up over bf16 must lie in [1, the datasheet's peak ratio]. Below 1 the rows are not
    a low-precision tensor-core path (a fallback); above the peak ratio they are faster than the tensor cores allow.
    `frame` has `dtype` and `seconds` per row (one per shape and dtype; several variants of a dtype: their median)."""
    out: dict[str, str] = {}
    bf16 = frame[frame["dtype"] == "bf16"].groupby(keys)["seconds"].median()
    peak16 = dense_peak_tflops(hardware, "bf16")
    if bf16.empty or not peak16:
        return out
    work = pd.Series([2.0 * np.prod(ix) for ix in bf16.index], index=bf16.index)
    rate = work / bf16
    bound_shapes = rate[rate >= rate.quantile(0.75)].index
    for dtype in sorted(set(frame["dtype"]) & set(LOW_PRECISION)):
        low = frame[frame["dtype"] == dtype].groupby(keys)["seconds"].median()
        ratio = (bf16 / low).reindex(bound_shapes).dropna()
        peak = dense_peak_tflops(hardware, dtype)
        if ratio.empty or not peak:
            continue
        median, bound = float(ratio.median()), peak / peak16
        where = f"median speed-up over bf16 on the {len(ratio)} most compute-bound shapes is {median:.2f}x"
        if median < 1.0:
            out[dtype] = f"{dtype} table implausible: {where} (below 1: not a {dtype} tensor-core path, a fallback)"
        elif median > bound:
            out[dtype] = (f"{dtype} table implausible: {where}, above the datasheet's {dtype}/bf16 peak ratio "
                          f"{bound:.2f}x")
    return out


def exact_ns(work: np.ndarray, per_second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(integer nanoseconds, passes) of rows whose rate was computed as `work · 1e9 / t_ns` from an integer t_ns and
    stored as an integer (XLA's tables): t = round(work · 1e9 / rate) must give back the stored rate to within 1 (the
    generator truncates to an integer), which a slip in any digit, the last one included, breaks."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t_ns = np.round(work * 1e9 / per_second)
        ok = (t_ns > 0) & (np.abs(work * 1e9 / t_ns - per_second) < 1.0)
    return t_ns, ok


def repeated(frame: pd.DataFrame, keys: list[str]) -> np.ndarray:
    """Rows whose keys appear again later in the file (the later entry is the one kept)."""
    return frame.duplicated(subset=keys, keep="last").to_numpy()


__all__ = ["LOW_PRECISION", "NOT_STATED", "TableRead", "above_peak", "dense_peak_tflops", "exact_ns",
           "implausible_lowp", "refuse", "repeated"]
