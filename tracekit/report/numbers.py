"""Numbers for people: the one place tables, reports and summaries format durations, shares, counts and sizes.

Machine outputs (`--json`, CSV) keep full precision; what a person reads is rounded to what the measurement
supports: durations in the unit that gives 3–4 significant digits, percentages to 0.1 (0.01 for model errors),
counts as integers with thousands separators, and float residue (2.9e-17 s of bubble) as zero.
"""
from __future__ import annotations

import math
from typing import Any

MISSING = "—"
#: Below this many seconds a duration is float residue of sums and differences, not time.
RESIDUE_S = 1e-12


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def seconds(value: Any) -> str:
    """A duration in s, ms or µs: `1.234 s`, `12.35 ms`, `250.0 µs`; `0 s` for float residue."""
    if _missing(value):
        return MISSING
    v = float(value)
    if abs(v) < RESIDUE_S:
        return "0 s"
    size = abs(v)
    text = f"{size:.3f} s" if size >= 1 else f"{size * 1e3:.2f} ms" if size >= 1e-3 else f"{size * 1e6:.1f} µs"
    return ("−" if v < 0 else "") + text


#: Units a table of durations is shown in: (name, seconds per unit, decimals).
UNITS = (("s", 1.0, 3), ("ms", 1e-3, 3), ("µs", 1e-6, 1))


def time_unit(values: Any) -> tuple[str, float, int]:
    """The one unit for a column of durations (s): the largest value's (`seconds` would write it in), so a table can
    name its unit in the header and its cells be plain numbers."""
    largest = max((abs(float(v)) for v in values if not _missing(v)), default=0.0)
    return next((unit for unit in UNITS if largest >= unit[1]), UNITS[-1])


def in_unit(value: Any, unit: tuple[str, float, int], signed: bool = False) -> str:
    """A duration (s) as a number of `unit` (from `time_unit`): `48.786`, `0.084`; `signed` writes `+`/`−`."""
    if _missing(value):
        return MISSING
    v = float(value) / unit[1]
    v = 0.0 if abs(float(value)) < RESIDUE_S else v
    text = f"{abs(v):.{unit[2]}f}"
    return ("−" if v < 0 else "+" if signed else "") + text


def signed_seconds(value: Any) -> str:
    """A difference of durations with its sign: `+12.35 ms`, `−1.234 s`."""
    if _missing(value):
        return MISSING
    return ("+" if float(value) >= 0 or abs(float(value)) < RESIDUE_S else "") + seconds(value)


def percent(value: Any, digits: int = 1, signed: bool = False) -> str:
    """A fraction as a percentage: `percent(0.1234)` → `12.3%`; `signed` adds `+` to positive ones."""
    if _missing(value):
        return MISSING
    return f"{float(value) * 100:{'+' if signed else ''}.{digits}f}%"


def count(value: Any) -> str:
    """A count as an integer: `1,204`; a mean count over ranks (288.5) is rounded, not shown as a fraction."""
    return MISSING if _missing(value) else f"{round(float(value)):,}"


def plural(n: Any, word: str, words: str | None = None) -> str:
    """`1 iteration`, `3 iterations`, `0 iterations`."""
    return f"{count(n)} {word if round(float(n)) == 1 else (words or word + 's')}"


def size_bytes(value: Any) -> str:
    """Bytes in binary units: `512 B`, `1.5 MiB`."""
    if _missing(value):
        return MISSING
    v = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    raise AssertionError("unreachable")
