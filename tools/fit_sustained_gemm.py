"""The sustained GEMM ceilings: `tracekit/data/sustained_gemm.json` (a `make profiles` stage): the A100's, fitted
here, then Hopper's over it (tools/fit_hopper_ceiling.py).

The seed paper's A100 samples time each GEMM in a short burst at the boost clock; a training run holds the tensor cores
busy for minutes under the 400 W limit (`predictor.costs.physics.sustained_gemm` says why a ceiling, and which GEMMs
it bounds). No table in the corpus times a GEMM held busy that long, so the ceiling is fitted on end-to-end runs:
vTrain's multi-node runs (55 Megatron-DeepSpeed iterations on 64–512 A100s, GPT models up to h 12288 with large
GEMMs held for 5–65 s an iteration), whose iterations the samples' bursts predict 7% too fast. The fit:

- predictions with no ceiling (`ModelSet.unsustained`) and the megatron-deepspeed-2023 host constants fitted on vTrain
  single node over them (the constants the next stage refits over the ceiling: `tools.stack_fits.fit_deepspeed`);
- each ceiling of GRID (1 TFLOP/s apart, up to the dense fp16 peak, which is no ceiling) laid on every half-precision
  GEMM and batched GEMM of those graphs as `predict` lays it (`sustained_gemm.floor_us`); the ceiling with the lowest
  MAPE on the multi-node rows wins (the lower one on a tie);
- held out: 5-fold CV over the multi-node rows (rows dealt at random, seed 0), each fold's ceiling chosen on the others.

It is scored, not fitted, on every other A100 set it applies to: vTrain single node, Narayanan 2021, llm-foundry (its
composer scales refitted over it by the composer stage), Megatron-LM's CI A100 rows (benchmarks/e2e_accuracy.py).
The parts it is written for: the A100 SXM's 80 and 40 GB parts (one die, one 400 W power limit); a PCIe card
(300 W), priced with their models, takes it with them, though its own would be lower (no row measures one).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from predictor.costs.learned.models import ModelSet
from predictor.costs.physics.sustained_gemm import floor_us, half
from predictor.sweeps.calibration_fit import iteration_times_s
from tools import fit_hopper_ceiling, stack_fits as sf
from tracekit.core.hardware import hardware_spec

FIT_SET = "vtrain_a100_multi_node.csv"
FIT_PART = "A100-SXM4-80GB"
#: The parts the ceiling is written for (one die and one board power limit).
PARTS = ("A100-SXM4-80GB", "A100-SXM4-40GB")


def peak_tflops() -> float:
    """FIT_PART's dense fp16 peak (TFLOP/s, tracekit/data/hardware.json): the grid's end, which is no ceiling."""
    spec = hardware_spec(FIT_PART)
    assert spec is not None, f"{FIT_PART}: no datasheet entry"
    return spec.peak_tflops("fp16")


GRID = np.arange(200.0, peak_tflops() + 1.0, 1.0)


def unit_floors(prepared: list) -> list[np.ndarray]:
    """Per prepared graph (`predictor.predict.prepare_many` items), each operator's least time (µs) at a ceiling of
    1 TFLOP/s on PARTS (0 for operators no ceiling bounds): divided by a ceiling, what `predict` lays on it."""
    return [floor_us(pd.DataFrame(graph.specs), {part: half(1.0) for part in PARTS}) for graph, *_ in prepared]


def at_ceiling(prepared: list, units: list[np.ndarray], tflops: float) -> list:
    """The prepared graphs with every half-precision GEMM and batched GEMM of PARTS no faster than `tflops`
    (`units`: their `unit_floors`)."""
    return sf.floored(prepared, [unit / tflops for unit in units])


def _mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted / measured - 1)))


def scan(models: ModelSet | None = None) -> tuple[sf.CorpusSet, Any, np.ndarray]:
    """(the multi-node set, the host constants fitted on vTrain single node without a ceiling, its rows' predicted
    iteration times (s) under each ceiling of GRID: ceiling × row), from predictions with no ceiling."""
    models = (models or ModelSet.load()).unsustained()
    single = sf.load_set(models, sf.VTRAIN_SINGLE)
    multi = sf.load_set(models, FIT_SET)
    host = sf.fit_deepspeed(single.prepared, single.measured)
    units = unit_floors(multi.prepared)
    return multi, host, np.array([iteration_times_s(at_ceiling(multi.prepared, units, t), host) for t in GRID])


def held_out(multi: sf.CorpusSet, times: np.ndarray) -> tuple[np.ndarray, list[float]]:
    """5-fold CV over the multi-node rows (rows dealt at random, seed 0): each row's iteration time (s) under the
    ceiling chosen on the other folds, and the ceilings chosen."""
    folds = np.random.default_rng(0).permutation(len(multi.rows)) % sf.FOLDS
    held, chosen = sf.grid_held_out(times, multi.measured, folds, GRID)
    return held, [chosen[k] for k in range(sf.FOLDS)]


def fit(models: ModelSet | None = None) -> tuple[dict[str, Any], list[str], list[str]]:
    """(the document `tracekit/data/sustained_gemm.json` holds, lines that report it, corpus files read): the A100's
    ceiling, then Hopper's fitted over it."""
    multi, host, times = scan(models)
    errors = np.abs(times / multi.measured - 1)  # ceiling × row
    best = int(np.argmin(errors.mean(axis=1)))
    held, chosen = held_out(multi, times)
    tflops = float(GRID[best])
    peak = peak_tflops()
    hopper_parts, hopper_fit, hopper_lines, hopper_files = fit_hopper_ceiling.fit(
        {part: half(tflops) for part in PARTS}, models)
    doc = {
        "format": "tracekit-sustained-gemm/2", "by": "make profiles (tools/fit_sustained_gemm.py)",
        "what": "What a part's GEMMs sustain through a training run (TFLOP/s): a training graph's half-precision GEMMs "
                "and batched GEMMs are no faster than `tflops`, its fp8 GEMMs than `fp8_tflops` where a part has one "
                "(predictor.costs.physics.sustained_gemm). Fitted on end-to-end runs, not measured: no table of the "
                "corpus times a GEMM held busy for minutes.",
        "parts": {**{part: {"tflops": tflops, "fraction_of_peak": round(tflops / peak, 4)} for part in PARTS},
                  **hopper_parts},
        "fits": {"A100": {
            "by": "tools/fit_sustained_gemm.py", "parts": list(PARTS), "rows": multi.rows_record(),
            "what": "vTrain's measured Megatron-DeepSpeed iterations on 64–512 A100s",
            "method": f"grid {GRID[0]:g}–{GRID[-1]:g} TFLOP/s, step 1: the lowest MAPE over the rows, with the "
                      f"{sf.DEEPSPEED} host constants fitted on e2e/{sf.VTRAIN_SINGLE} without a ceiling",
            "host_constants": {k: round(getattr(host, k), 3) for k in sf.DEEPSPEED_PARAMS},
            "mape": round(float(errors[best].mean()), 4),
            "mape_without": round(float(errors[-1].mean()), 4),
            "held_out": {"how": f"{sf.FOLDS}-fold CV (rows dealt at random, seed 0)",
                         "mape": round(_mape(held, multi.measured), 4), "ceilings": chosen},
            "scored_on": [f"e2e/{sf.VTRAIN_SINGLE}", "e2e/narayanan2021_table1_a100_selene.csv",
                          f"e2e/{sf.LLMFOUNDRY}", f"e2e/{sf.CI} (A100 rows)"],
        }, "Hopper": hopper_fit},
    }
    lines = [f"{', '.join(PARTS)}: {tflops:g} TFLOP/s sustained ({100 * tflops / peak:.1f}% of {peak:g}); vTrain "
             f"multi node MAPE {100 * errors[best].mean():.2f}% (without: {100 * errors[-1].mean():.2f}%), held out "
             f"({sf.FOLDS}-fold CV) {100 * _mape(held, multi.measured):.2f}%", *hopper_lines]
    return doc, lines, sorted({f"e2e/{sf.VTRAIN_SINGLE}", f"e2e/{FIT_SET}", *hopper_files})
