"""The fitted constants of the shipped stack profiles: the rows each is fitted on, how, and how it is held out.

Shared by `tools/fit_profiles.py` (`make profiles`: fits every constant on all of its rows and writes the profiles)
and `benchmarks/e2e_accuracy.py` (scores each held out beside the shipped figure), so that the two never disagree on
what was fitted where.

- megatron-deepspeed-2023: host_op_us, microbatch_overhead_us on vtrain_a100_single_node.csv; held out by 5-fold CV
  (rows dealt at random, seed 0);
- megatron-core: host_op_us, microbatch_overhead_us, tensor_op_us and a host_scale per host CPU on
  megatron_ci_golden.csv; held out by 5-fold CV by test case;
- composer: attention_scale, memory_scale on llmfoundry_mpt_fsdp_a100.csv; held out leave-one-model-size-out (no
  compute_scale: the A100's sustained GEMM ceiling, a hardware fact, stands for what it held);
- megatron-bridge: device_scale per GPU architecture (its own; its host constants are megatron-core's) on
  megatron_bridge_perf.csv, for the architectures whose parts have no sustained GEMM ceiling (Blackwell; Hopper's
  ceiling, a hardware fact, is fitted on the same table's dense H100 rows by tools/fit_hopper_ceiling.py); held out
  leave-one-model-out.

Each fit starts from the profile's other constants as shipped (megatron-bridge's device scales multiply the host
constants megatron-core was fitted with) and is deterministic: Gauss–Newton from fixed starts, golden-section
search, folds dealt by a seeded generator. `fit(name, models)` returns the fields the profile gets (its constants and
a `fit` block: the rows, the method, the held-out score); `held_out(name, data)` the held-out iteration times.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from extractors import jobs as B
from predictor.costs.physics import sustained_gemm
from predictor.predict import prepare_many
from predictor.sweeps.calibration_fit import fit_prepared, fit_with_hosts, held_out_times_s, iteration_times_s
from tracekit.core.calibration import Calibration, device_scaled, host_scaled
from tracekit.core.hardware import architecture
from tracekit.core.stacks import host_class

ROOT = Path(__file__).resolve().parent.parent
#: The corpus, as the test suite finds it (tests/conftest.py): `TRACEKIT_CORPUS`, else ../shared/corpus.
CORPUS = Path(os.environ.get("TRACEKIT_CORPUS") or ROOT.parent / "shared" / "corpus")
E2E = CORPUS / "e2e"
FOLDS = 5

VTRAIN_SINGLE = "vtrain_a100_single_node.csv"
LLMFOUNDRY = "llmfoundry_mpt_fsdp_a100.csv"
CI = "megatron_ci_golden.csv"
BRIDGE = "megatron_bridge_perf.csv"

DEEPSPEED = "megatron-deepspeed-2023"
DEEPSPEED_PARAMS = ("host_op_us", "microbatch_overhead_us")
COMPOSER = "composer"
#: The composer stack's constants: MPT's attention kernel (triton flash attention with ALiBi) beside flash-attention 2,
#: and eager memory-bound kernels (unfused LayerNorm, GeLU, dropout). Its tensor-core kernels run at the samples'
#: speed under the A100's sustained GEMM ceiling (a scale of them, fitted here until the ceiling stood for it, came
#: to 1.03 and held nothing out: leave-one-model-size-out 5.02% with it, 4.89% without).
COMPOSER_PARAMS = ("attention_scale", "memory_scale")
CORE = "megatron-core"
#: The megatron-core stack's host constants (per graph op, per micro-batch call, per parameter tensor a
#: per-parameter pass visits) and the host CPU its runs' scales are relative to (DGX A100's).
CORE_PARAMS = ("host_op_us", "microbatch_overhead_us", "tensor_op_us")
CORE_REFERENCE_HOST = "amd-zen2"
BRIDGE_STACK = "megatron-bridge"
GOLDEN_STEPS = 24


@dataclass
class CorpusSet:
    """The rows of one corpus e2e file as `predict --batch FILE` parses them, their prepared graphs and measured
    iteration times (s); `failed` are the rows that did not parse or could not be predicted."""

    file: str
    rows: list
    prepared: list
    measured: np.ndarray
    failed: list

    def rows_record(self) -> dict[str, Any]:
        """What a fitted profile records of the rows it was fitted on: the file, its SHA-256, the rows used and the
        CSV lines left out (not predictable)."""
        path = E2E / self.file
        return {"file": f"e2e/{self.file}", "sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16],
                "rows": len(self.rows), "lines_not_predicted": sorted(r.line for r in self.failed)}


def load_set(models, file: str, launch: dict[str, str] | None = None) -> CorpusSet:
    """A corpus e2e file parsed as `predict --batch FILE` parses it (no flag), its rows prepared with `models`;
    `launch`: row_ref → the launch line of the run (a `megatron_args` cell added to each row; every row needs one)."""
    _, cells = B.read_rows(E2E / file)
    if launch is not None:
        missing = [c.get("row_ref", "") for c in cells if c.get("row_ref", "") not in launch]
        if missing:
            raise ValueError(f"{file}: no launch line for {', '.join(missing)}")
        cells = [{**c, "megatron_args": launch[c["row_ref"]]} for c in cells]
    rows = [B.parse_row(c, i + 2, None, None) for i, c in enumerate(cells)]
    failed = [r for r in rows if r.error]
    good = [r for r in rows if not r.error]
    parsed = [r.complete() for r in good]
    prepared = prepare_many([config for config, _, _ in parsed], [cluster for _, cluster, _ in parsed], models)
    for r, p in zip(good, prepared):
        if isinstance(p, Exception):
            r.error = str(p)
            failed.append(r)
    keep = [i for i, p in enumerate(prepared) if not isinstance(p, Exception)]
    good, prepared = [good[i] for i in keep], [prepared[i] for i in keep]
    return CorpusSet(file, good, prepared, np.array([float(r.cells["iteration_time_s"]) for r in good]), failed)


def floored(prepared: list, floors: list[np.ndarray]) -> list:
    """The prepared graphs (`prepare_many` items) with each operator no faster than its floor (µs; one array per
    graph): how the ceiling fits lay a sustained GEMM ceiling's `sustained_gemm.floor_us` on them."""
    return [(graph, dataclasses.replace(est, duration_us=np.fmax(est.duration_us, floor)), cluster, notes)
            for (graph, est, cluster, notes), floor in zip(prepared, floors)]


def grid_held_out(times: np.ndarray, measured: np.ndarray, groups: np.ndarray, grid: np.ndarray
                  ) -> tuple[np.ndarray, dict[Any, float]]:
    """A value fitted on a grid, held out by group (folds, models): each row's time at the grid value with the least
    MAPE over the other groups' rows (`times`: grid value × row), and the value each group took."""
    errors = np.abs(times / measured - 1)
    held = np.empty(len(measured))
    chosen: dict[Any, float] = {}
    for group in sorted(set(groups.tolist())):
        pick = int(np.argmin(errors[:, groups != group].mean(axis=1)))
        chosen[group] = float(grid[pick])
        held[groups == group] = times[pick, groups == group]
    return held, chosen


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - measured) / measured))


# -- megatron-deepspeed-2023: host constants on vTrain's single-node runs -------------------------------------------
def fit_deepspeed(prepared, measured: np.ndarray) -> Calibration:
    return fit_prepared(prepared, measured, DEEPSPEED_PARAMS, rounds=5)[0]


def deepspeed_folds(data: CorpusSet) -> np.ndarray:
    return np.random.default_rng(0).permutation(len(data.rows)) % FOLDS


def deepspeed_held_out(data: CorpusSet) -> np.ndarray:
    return held_out_times_s(data.prepared, data.measured, deepspeed_folds(data), fit_deepspeed)


# -- composer: two scales on llm-foundry's MPT runs ---------------------------------------------------------------
def fit_composer(prepared, measured: np.ndarray) -> Calibration:
    return fit_prepared(prepared, measured, COMPOSER_PARAMS, rounds=6)[0]


def model_sizes(data: CorpusSet) -> list[str]:
    """The MPT sizes of the rows, smallest first."""
    sizes = {r.cells["model_name"] for r in data.rows}
    return sorted(sizes, key=lambda n: float(re.sub(r"[^0-9.]", "", n)) * (1e-3 if n.lower().endswith("m") else 1.0))


def composer_held_out(data: CorpusSet) -> np.ndarray:
    names = model_sizes(data)
    fold = np.array([names.index(r.cells["model_name"]) for r in data.rows])
    return held_out_times_s(data.prepared, data.measured, fold, fit_composer)


# -- megatron-core: host constants and host CPU scales on Megatron-LM's CI runs -------------------------------------
def host_of(row) -> str:
    return host_class(row.cluster.hardware) or CORE_REFERENCE_HOST


def fit_core(prepared, measured: np.ndarray, hosts: list[str]) -> tuple[Calibration, dict[str, float]]:
    """(calibration on the reference host, {host class: scale}) fitted on CI rows."""
    cal, scales, _ = fit_with_hosts(prepared, measured, hosts, CORE_PARAMS, CORE_REFERENCE_HOST, rounds=5)
    return cal, scales


def test_case(row) -> str:
    """A CI row's test case: the directory of its golden-values file (`row_ref`)."""
    return row.cells["row_ref"].split("/")[0]


def case_folds(rows, folds: int = FOLDS) -> np.ndarray:
    """Fold of each row: its test case's, the cases dealt to `folds` folds in a seeded random order."""
    cases = sorted({test_case(r) for r in rows})
    order = np.random.default_rng(0).permutation(len(cases))
    fold_of = {case: int(order[i]) % folds for i, case in enumerate(cases)}
    return np.array([fold_of[test_case(r)] for r in rows])


def core_held_out(data: CorpusSet, report: Callable[[str], None] | None = None) -> np.ndarray:
    """CI rows predicted with the constants and host scales fitted on the other test cases' folds."""
    hosts = [host_of(r) for r in data.rows]
    folds = case_folds(data.rows)
    out = np.empty(len(data.rows))
    for k in sorted(set(folds)):
        train, test = np.flatnonzero(folds != k), np.flatnonzero(folds == k)
        cal, scales = fit_core([data.prepared[i] for i in train], data.measured[train], [hosts[i] for i in train])
        if report:
            report(f"fold {k}: {', '.join(f'{p} {getattr(cal, p):.1f}' for p in CORE_PARAMS)}; host scales "
                   f"{', '.join(f'{h} {v:.2f}' for h, v in scales.items())}")
        for i in test:
            out[i] = iteration_times_s([data.prepared[i]], host_scaled(cal, scales.get(hosts[i], 1.0)))[0]
    return out


# -- megatron-bridge: tensor-core scales per GPU architecture on the Bridge tables' dense models ---------------------
def bridge_model(row) -> str:
    """The model a Bridge row trains (its variants — w/ or w/o MTP, token-drop — are the same model)."""
    return (row.cells.get("model_name") or "?").split(" (")[0]


def arch_of(row) -> str:
    return architecture(row.cluster.hardware) or "?"


def undeviced(row) -> Calibration:
    """A row's stack calibration without any device scale (what the device fit multiplies)."""
    stack = dataclasses.replace(row.stack, device_scale={arch_of(row): 1.0})
    return stack.calibration(row.cluster.hardware)


def fit_devices(prepared, measured: np.ndarray, rows) -> dict[str, float]:
    """One tensor-core scale per GPU architecture, from the dense models' rows, whose time the tensor-core ops
    dominate (an MoE row's error has other causes: routing, dispatch, host time): for each architecture, the scale
    whose predictions of its dense rows have the least mean absolute relative error (golden-section search on
    [0.5, 3]); an architecture without dense rows gets none, and so does one whose rows' parts have a sustained GEMM
    ceiling (`predictor.costs.physics.sustained_gemm`: a hardware fact, fitted on these rows for Hopper, stands
    for what the scale held)."""
    archs = [arch_of(r) for r in rows]
    bounded = set(sustained_gemm.ceilings())
    out = {}
    for arch in sorted(set(archs)):
        idx = [i for i, a in enumerate(archs)
               if a == arch and rows[i].config.moe is None and rows[i].cluster.hardware not in bounded]
        if not idx:
            continue
        bases = [undeviced(rows[i]) for i in idx]

        def error(scale: float, idx=idx, bases=bases) -> float:
            t = np.array([iteration_times_s([prepared[i]], device_scaled(b, scale))[0] for i, b in zip(idx, bases)])
            return mape(t, measured[idx])

        lo, hi = 0.5, 3.0
        golden = (np.sqrt(5) - 1) / 2
        a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
        fa, fb = error(a), error(b)
        for _ in range(GOLDEN_STEPS):
            if fa < fb:
                hi, b, fb = b, a, fa
                a = hi - golden * (hi - lo)
                fa = error(a)
            else:
                lo, a, fa = a, b, fb
                b = lo + golden * (hi - lo)
                fb = error(b)
        out[arch] = round(float((lo + hi) / 2), 3)
    return out


def bridge_held_out(data: CorpusSet, report: Callable[[str], None] | None = None) -> np.ndarray:
    """Bridge rows predicted with the device scales fitted on the other models' rows."""
    names = np.array([bridge_model(r) for r in data.rows])
    out = np.empty(len(data.rows))
    for name in sorted(set(names)):
        train, test = np.flatnonzero(names != name), np.flatnonzero(names == name)
        scales = fit_devices([data.prepared[i] for i in train], data.measured[train], [data.rows[i] for i in train])
        if report:
            report(f"without {name}: device scales {scales}")
        for i in test:
            row = data.rows[i]
            out[i] = iteration_times_s([data.prepared[i]], device_scaled(undeviced(row),
                                                                         scales.get(arch_of(row), 1.0)))[0]
    return out


# -- the profile fields each fit writes -----------------------------------------------------------------------------
BY = "make profiles (tools/fit_profiles.py)"
GAUSS_NEWTON = ("Gauss–Newton on relative error of predicted vs measured iteration time "
                "(predictor.sweeps.calibration_fit)")


def deepspeed_fields(data: CorpusSet) -> dict[str, Any]:
    cal = fit_deepspeed(data.prepared, data.measured)
    held = deepspeed_held_out(data)
    return {"constants": {k: round(getattr(cal, k), 3) for k in DEEPSPEED_PARAMS}, "fit": {
        "by": BY, "rows": data.rows_record(),
        "what": "vTrain's measured Megatron-DeepSpeed iterations, one 8×A100 node",
        "method": GAUSS_NEWTON, "params": list(DEEPSPEED_PARAMS),
        "held_out": {"how": f"{FOLDS}-fold CV (rows dealt at random, seed 0)", "mape": round(mape(held, data.measured),
                                                                                                4)},
        "scored_on": ["e2e/vtrain_a100_multi_node.csv", "e2e/narayanan2021_table1_a100_selene.csv "
                      "(through megatron-lm-2021)"]}}


def composer_fields(data: CorpusSet) -> dict[str, Any]:
    cal = fit_composer(data.prepared, data.measured)
    held = composer_held_out(data)
    return {"constants": {k: round(getattr(cal, k), 4) for k in COMPOSER_PARAMS}, "fit": {
        "by": BY, "rows": data.rows_record(),
        "what": "MosaicML's MPT 125M-70B benchmarks, Composer + FSDP FULL_SHARD on A100 40/80 GB, 8-512 GPUs",
        "method": GAUSS_NEWTON, "params": list(COMPOSER_PARAMS),
        "held_out": {"how": f"leave-one-model-size-out ({len(model_sizes(data))} sizes)",
                     "mape": round(mape(held, data.measured), 4)}}}


def core_fields(data: CorpusSet) -> dict[str, Any]:
    cal, scales = fit_core(data.prepared, data.measured, [host_of(r) for r in data.rows])
    held = core_held_out(data)
    return {"constants": {k: round(getattr(cal, k), 3) for k in CORE_PARAMS},
            "host_scale": {h: round(v, 4) for h, v in sorted(scales.items())}, "fit": {
        "by": BY, "rows": data.rows_record(),
        "what": f"Megatron-LM's CI functional-test runs on DGX A100, DGX H100 and GB200 "
                f"({len({test_case(r) for r in data.rows})} test cases)",
        "method": GAUSS_NEWTON + ", the constants on DGX A100's host CPU and one scale of them per other host CPU "
                                 "(predictor.sweeps.calibration_fit.fit_with_hosts)",
        "params": list(CORE_PARAMS), "reference_host": CORE_REFERENCE_HOST,
        "held_out": {"how": f"{FOLDS}-fold CV by test case", "mape": round(mape(held, data.measured), 4)},
        "scored_on": [f"e2e/{BRIDGE} (through megatron-bridge; never fitted on)"]}}


def bridge_fields(data: CorpusSet) -> dict[str, Any]:
    scales = fit_devices(data.prepared, data.measured, data.rows)
    held = bridge_held_out(data)
    return {"device_scale": dict(sorted(scales.items())), "device_fit": {
        "by": BY, "rows": data.rows_record(),
        "what": "NVIDIA's Megatron-Bridge performance tables (Llama 3 8B/70B, DeepSeek-V3, Qwen3-30B-A3B, "
                "GPT-OSS-120B on H100, B200 and GB200), with the host constants megatron-core was fitted with",
        "method": "per GPU architecture, the scale of the tensor-core ops (GEMM, bmm, attention) minimising the mean "
                  "absolute relative error of that architecture's dense-model rows (golden-section search), for the "
                  "architectures whose parts have no sustained GEMM ceiling (Hopper's, tracekit/data/"
                  "sustained_gemm.json, is fitted on the same dense rows and stands for its scale)",
        "held_out": {"how": "leave-one-model-out", "mape": round(mape(held, data.measured), 4)}}}


#: profile → (corpus file, the fields fitted on it).
FITS: dict[str, tuple[str, Callable[[CorpusSet], dict[str, Any]]]] = {
    DEEPSPEED: (VTRAIN_SINGLE, deepspeed_fields),
    CORE: (CI, core_fields),
    BRIDGE_STACK: (BRIDGE, bridge_fields),
    COMPOSER: (LLMFOUNDRY, composer_fields),
}
