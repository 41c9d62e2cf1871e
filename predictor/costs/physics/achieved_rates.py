"""What a GPU's GEMMs achieve, measured: the hardware facts of `tracekit/data/gemm_rates.json`.

The file is written by `make profiles` (tools/fit_gemm_rates.py) from the corpus's GEMM measurements — XLA's matmul
tables (H100, B200), the matmul rates measured on an H200, the seed paper's linear-layer samples (A100, GH200) — and
holds, per measured GPU, the median bf16 rate over large shapes as a fraction of its dense datasheet peak, and the
fp8 speed-up curves of the tables no model was trained on. These are properties of the hardware, not of a software
stack: what a datasheet-only GPU inherits from them is the first thing its predictions get, before any stack
constant.

- `fraction(hardware, left_out)`: the GPU's own measured fraction; for a GPU without one, the median of the measured
  parts of its GPU family (`tracekit.core.hardware.gpu_family`, the parts that share operator models: GB200 takes
  B200's); None when none was measured. Not the die's: one die runs at different rates in different parts — of the
  three Hopper parts measured, GH200 (a superchip with up to 1,000 W) reaches 81% of the dense peak, H100 SXM 76%
  (XLA's table), H200 SXM 68.5% (its own table) — so a part never measured keeps its datasheet scaling. `left_out`
  names GPUs whose measurements must not be used (a leave-one-GPU-out test leaves a GPU's tables out with its
  models: `ModelSet.without`).
- `ratio(source, target, left_out)`: fraction(source) / fraction(target), the factor by which a compute-bound GEMM
  timed on `source` runs longer on `target` beyond their datasheet peaks (1 when either is unknown).
- `lowp_curves(left_out)`: the file's fp8 speed-up curves (`predictor.costs.physics.lowp_gemm` format).
- `fp8_speedups()`: per GPU whose table measured fp8 at the bf16 shapes, the median fp8-over-bf16 speed-up at its
  large shapes.
"""
from __future__ import annotations

import json
from functools import lru_cache

import numpy as np

from tracekit.core.data_files import DATA
from tracekit.core.errors import ModelError
from tracekit.core.hardware import gpu_family, hardware_spec

RATES = DATA / "gemm_rates.json"


@lru_cache(maxsize=1)
def _document() -> dict:
    try:
        doc = json.loads(RATES.read_text())
        doc["gpus"], doc["lowp_speedup"]
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"{RATES}: unreadable GEMM rates ({exc}); `make profiles` writes it") from exc
    return doc


def measured_fractions() -> dict[str, float]:
    """hardware → its measured bf16 fraction of the dense peak at large shapes."""
    return {hw: float(e["bf16_large"]["fraction_of_peak"]) for hw, e in _document()["gpus"].items()}


def fraction(hardware: str, left_out: frozenset[str] = frozenset()) -> float | None:
    """The measured large-shape bf16 fraction of the dense peak of `hardware`, else of its family's measured
    parts."""
    known = {hw: f for hw, f in measured_fractions().items() if hw not in left_out}
    if hardware in known:
        return known[hardware]
    if hardware_spec(hardware) is None:
        return None
    family = [f for hw, f in known.items() if gpu_family(hw) == gpu_family(hardware)]
    return float(np.median(family)) if family else None


def ratio(source: str, target: str, left_out: frozenset[str] = frozenset()) -> float:
    """fraction(source) / fraction(target); 1 when either is unknown."""
    f_source, f_target = fraction(source, left_out), fraction(target, left_out)
    return f_source / f_target if f_source and f_target else 1.0


def lowp_curves(left_out: frozenset[str] = frozenset()) -> list[dict]:
    """The file's low-precision speed-up curves, without those of `left_out` GPUs."""
    return [c for c in _document()["lowp_speedup"] if c["hardware"] not in left_out]


def fp8_speedups() -> dict[str, float]:
    """hardware → the median fp8-over-bf16 speed-up its table measured at its large shapes (GPUs that measured
    both)."""
    return {hw: float(e["fp8_over_bf16"]["median"]) for hw, e in _document()["gpus"].items() if "fp8_over_bf16" in e}
