"""Hopper's sustained GEMM ceiling: the H100, H800 and H200 SXM parts of `tracekit/data/sustained_gemm.json` (part
of the `make profiles` sustained-gemm stage, after the A100's: tools/fit_sustained_gemm.py).

XLA's H100 matmul table times each GEMM in a burst at 76% of the dense bf16 peak (`tracekit/data/gemm_rates.json`); a
training run holds the tensor cores busy under the 700 W limit, where the clock comes down
(`predictor.costs.physics.sustained_gemm` says why a ceiling). No table in the corpus times a GEMM held busy that long
and no bf16 run on an H100 in the corpus holds large GEMMs long enough to fit one, so the ceiling is fitted on the
runs that do: Megatron-Bridge's dense H100 runs (Llama 3 8B and 70B in fp8, 8–64 GPUs). Their GEMMs run in fp8, so
the ceiling is one clock for both precisions: bf16 GEMMs no faster than `tflops`, fp8 GEMMs no faster than `tflops` ×
the fp8 speed-up over bf16 that Hopper's matmul table measured at the same shapes (H200's, 1.71×: under one clock
the two precisions keep their ratio). The fit:

- predictions with no ceiling (`ModelSet.unsustained`) but the A100's (just fitted, passed in), and megatron-core's
  host constants fitted on Megatron-LM's CI rows over them (`tools.stack_fits.fit_core`: what the megatron-core stage
  refits over both ceilings), with no Bridge device scale on Hopper;
- each ceiling of GRID (1 TFLOP/s apart, up to the dense bf16 peak, which is no ceiling) laid on every bf16 and fp8
  GEMM of those rows' graphs as `predict` lays it (`sustained_gemm.floor_us`); the ceiling with the lowest MAPE on
  the dense Hopper rows wins (the lower one on a tie);
- held out: leave-one-model-out (Llama 3 8B's rows predicted with the ceiling chosen on 70B's, and back).

It is scored, not fitted, on the CI rows' H100 runs (small bf16 models: it should move them little, and it must not
make them worse; recorded here) and on the Bridge MoE and Nano rows on H100 (`benchmarks/e2e_accuracy.py
--what-if-hopper-ceiling`, beside the Hopper device scale it replaced: the megatron-bridge stage fits none over it).
The parts it is written for are the 700 W SXM boards of one die; GH200 (a superchip with up to 1,000 W, whose own
burst reaches 81%) and the 350 W H100 PCIe card have none.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from predictor.costs.learned.models import ModelSet
from predictor.costs.physics import achieved_rates
from predictor.costs.physics.sustained_gemm import floor_us, half
from predictor.sweeps.calibration_fit import iteration_times_s
from tools import stack_fits as sf
from tracekit.core.calibration import host_scaled
from tracekit.core.hardware import architecture, hardware_spec

FIT_PART = "H100-80GB-HBM3"
#: The parts the ceiling is written for (one die, the 700 W SXM board).
PARTS = ("H100-80GB-HBM3", "H800-80GB-HBM3", "H200-141GB")


def peak_tflops() -> float:
    """FIT_PART's dense bf16 peak (TFLOP/s, tracekit/data/hardware.json): the grid's end, which is no ceiling."""
    spec = hardware_spec(FIT_PART)
    assert spec is not None, f"{FIT_PART}: no datasheet entry"
    return spec.peak_tflops("bf16")


GRID = np.arange(400.0, peak_tflops() + 1.0, 1.0)


def fp8_speedup() -> tuple[float, list[str]]:
    """(the fp8-over-bf16 speed-up Hopper's matmul tables measured at their large shapes — the median over the Hopper
    parts that measured both —, those parts)."""
    measured = {hw: r for hw, r in achieved_rates.fp8_speedups().items() if architecture(hw) == "hopper"}
    assert measured, "no Hopper matmul table measured fp8 beside bf16 (tracekit/data/gemm_rates.json)"
    return float(np.median(list(measured.values()))), sorted(measured)


def capped(prepared: list, parts: dict[str, dict[str, float]]) -> list:
    """The prepared graphs with their GEMMs no faster than `parts`' ceilings (part → dtype → TFLOP/s)."""
    return sf.floored(prepared, [floor_us(pd.DataFrame(graph.specs), parts) for graph, *_ in prepared])


def _host_constants(before: dict[str, dict[str, float]], models: ModelSet) -> tuple[Any, dict[str, float],
                                                                                   sf.CorpusSet]:
    """(megatron-core's host constants on the reference host, its host CPU scales, the CI set), fitted on the CI rows
    with the ceilings `before` (the A100's) and no Hopper one."""
    ci = sf.load_set(models, sf.CI)
    prepared = capped(ci.prepared, before)
    cal, scales = sf.fit_core(prepared, ci.measured, [sf.host_of(r) for r in ci.rows])
    return cal, scales, dataclasses.replace(ci, prepared=prepared)


def unit_floors(prepared: list) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per prepared graph, each operator's least time (µs) at 1 TFLOP/s on FIT_PART's ceiling: (its bf16 and fp16
    GEMMs', its fp8 GEMMs') — 0 for operators no ceiling bounds; divided by a ceiling, what `predict` lays on them."""
    return [(floor_us(pd.DataFrame(graph.specs), {FIT_PART: half(1.0)}),
             floor_us(pd.DataFrame(graph.specs), {FIT_PART: {"fp8": 1.0}})) for graph, *_ in prepared]


def at_ceiling(prepared: list, units: list[tuple[np.ndarray, np.ndarray]], tflops: float, ratio: float) -> list:
    """The prepared graphs with their bf16 GEMMs no faster than `tflops` and their fp8 GEMMs than `tflops` × `ratio`
    (`units`: their `unit_floors`)."""
    return sf.floored(prepared, [np.fmax(u_half / tflops, u_fp8 / (tflops * ratio)) for u_half, u_fp8 in units])


def _times(prepared: list, cals: list, units: list[tuple[np.ndarray, np.ndarray]], tflops: float | None,
           ratio: float) -> np.ndarray:
    """Each row's iteration time (s) under its calibration, at the ceiling `tflops` (None: no ceiling)."""
    graphs = prepared if tflops is None else at_ceiling(prepared, units, tflops, ratio)
    return np.array([iteration_times_s([graph], cal)[0] for graph, cal in zip(graphs, cals)])


def fit(before: dict[str, dict[str, float]], models: ModelSet | None = None) -> tuple[dict[str, Any], dict[str, Any],
                                                                                     list[str], list[str]]:
    """(the parts' entries, the fit's record, lines that report it, corpus files read), over the ceilings fitted
    `before` it (part → dtype → TFLOP/s: the A100's, tools/fit_sustained_gemm.py)."""
    models = (models or ModelSet.load()).unsustained()
    ratio, ratio_parts = fp8_speedup()
    cal, scales, ci = _host_constants(before, models)
    bridge = sf.load_set(models, sf.BRIDGE)
    rows = [i for i, r in enumerate(bridge.rows) if r.cluster.hardware in PARTS and r.config.moe is None]
    assert rows, f"e2e/{sf.BRIDGE}: no dense-model row on {', '.join(PARTS)}"
    prepared = [bridge.prepared[i] for i in rows]
    cals = [sf.undeviced(bridge.rows[i]).with_values(
        **{k: getattr(cal, k) * scales.get(sf.host_of(bridge.rows[i]), 1.0) for k in sf.CORE_PARAMS}) for i in rows]
    units = unit_floors(prepared)
    measured = bridge.measured[rows]
    times = np.array([_times(prepared, cals, units, t, ratio) for t in GRID])  # ceiling × row
    errors = np.abs(times / measured - 1)
    best = int(np.argmin(errors.mean(axis=1)))
    tflops = float(GRID[best])
    without = _times(prepared, cals, units, None, ratio)
    held, chosen = sf.grid_held_out(times, measured, np.array([sf.bridge_model(bridge.rows[i]) for i in rows]), GRID)
    # scored on the CI rows' Hopper runs, with the host constants above, without and with the ceiling
    on = [i for i, r in enumerate(ci.rows) if r.cluster.hardware in PARTS]
    ci_cals = [host_scaled(cal, scales.get(sf.host_of(ci.rows[i]), 1.0)) for i in on]
    ci_prepared = [ci.prepared[i] for i in on]
    ci_units = unit_floors(ci_prepared)
    ci_measured = ci.measured[on]
    ci_without = sf.mape(_times(ci_prepared, ci_cals, ci_units, None, ratio), ci_measured)
    ci_with = sf.mape(_times(ci_prepared, ci_cals, ci_units, tflops, ratio), ci_measured)
    peak = peak_tflops()
    entry = {"tflops": tflops, "fraction_of_peak": round(tflops / peak, 4), "fp8_tflops": round(tflops * ratio, 1),
             "fp8_over_bf16": ratio}
    record = {
        "by": "tools/fit_hopper_ceiling.py", "parts": list(PARTS),
        "rows": {**bridge.rows_record(), "used": f"the {len(rows)} dense-model rows on {', '.join(PARTS)}"},
        "what": "Megatron-Bridge's dense H100 runs (Llama 3 8B and 70B, fp8), one clock for bf16 and fp8: fp8 GEMMs "
                f"at the ceiling × {ratio:g}, the fp8 speed-up {', '.join(ratio_parts)}'s matmul table measured",
        "method": f"grid {GRID[0]:g}–{GRID[-1]:g} TFLOP/s, step 1: the lowest MAPE over the rows, with megatron-core's "
                  f"host constants fitted on e2e/{sf.CI} over the A100's ceiling without a Hopper one, and no "
                  "megatron-bridge device scale",
        "host_constants": {k: round(getattr(cal, k), 3) for k in sf.CORE_PARAMS},
        "mape": round(float(errors[best].mean()), 4), "mape_without": round(sf.mape(without, measured), 4),
        "held_out": {"how": "leave-one-model-out", "mape": round(sf.mape(held, measured), 4), "ceilings": chosen},
        "scored_on": {f"e2e/{sf.CI} (Hopper rows)": {"rows": len(on), "mape_without": round(ci_without, 4),
                                                       "mape": round(ci_with, 4)},
                      f"e2e/{sf.BRIDGE} (MoE rows on Hopper), e2e/megatron_bridge_hybrid.csv (Hopper rows)":
                          "benchmarks/e2e_accuracy.py --what-if-hopper-ceiling"},
    }
    lines = [f"{', '.join(PARTS)}: {tflops:g} TFLOP/s sustained ({100 * tflops / peak:.1f}% of {peak:g}; fp8 "
             f"{tflops * ratio:.0f}, ×{ratio:g}); Bridge's dense Hopper rows MAPE {100 * errors[best].mean():.2f}% "
             f"(without: {100 * sf.mape(without, measured):.2f}%), held out (leave-one-model-out, {chosen}) "
             f"{100 * sf.mape(held, measured):.2f}%; CI Hopper rows {100 * ci_without:.2f}% → {100 * ci_with:.2f}%"]
    return dict.fromkeys(PARTS, entry), record, lines, [f"e2e/{sf.CI}", f"e2e/{sf.BRIDGE}"]
