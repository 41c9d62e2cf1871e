"""End-to-end accuracy of `tracekit predict` with the CLI's defaults on the corpus's measured Megatron iterations.

Six sets of the corpus's e2e/ folder (`$TRACEKIT_CORPUS`, else ../shared/corpus, as the test suite reads it): vTrain
single node (727 rows, 2–8 A100), vTrain multi node (55 rows, 64–512 A100), Narayanan 2021 Table 1 (10 rows,
32–3,072 A100 on Selene), llm-foundry (139 rows), Megatron-LM's CI (301 rows) and the Megatron-Bridge tables (91 rows).

Narayanan's table states neither the micro-batch, nor the interleaving, nor the DDP implementation of its runs; the
CLI takes the fastest micro-batch of 1, 2, 4, 8 and 16 that fits (Megatron has no default), no interleaving and the
stack's DDP for them (and says so in each row's notes and warnings). The authors'
reproduction scripts state all three (benchmarks/launch/narayanan2021_sc21.json, with their sources): the set is
scored twice, as published (`narayanan 2021`, the CLI's answer on the file) and with those launch lines added as the
rows' `megatron_args` (`narayanan launched`: micro-batches 16 to 1, five rows interleaved, PyTorch's DDP on the
four pp = 1 rows), which is what the runs were.

Two figures per set, side by side:
- **shipped** (the headline, what the README quotes): every row predicted by `predictor.batch.predict_rows`, the very
  call `tracekit predict --batch FILE --csv-out OUT` makes, with the shipped files (tracekit/data: models, stack
  profiles, hardware data) and no other flag: the software-stack profile from the row's `framework`, the hardware
  from `hardware_gpu`, the cluster preset from `gpus_per_node` + `interconnect`. Where a shipped constant was fitted
  on the set's own rows this figure is in-sample, and says what a user gets;
- **held out**, named by how: each fitted constant refitted without the rows it predicts (5-fold CV on vTrain single
  node, 5-fold CV of the A100's sustained GEMM ceiling on vTrain multi node, leave-one-model-size-out on
  llm-foundry, 5-fold CV by test case on the CI rows, leave-one-model-out for the Bridge device scale, Hopper's
  sustained GEMM ceiling as shipped there: its own leave-one-model-out is in tracekit/data/sustained_gemm.json); on a
  set no constant was fitted on, the shipped figure itself.
Printed per set: MAPE, median and p90 of the absolute percentage error, a table per parallel shape, model or GPU
with the signed bias, and the worst rows; beside them the same rows without any stack constants (the operator models
and the collective physics alone).

What is fitted, and where it is scored (tools/stack_fits.py, which this benchmark and `make profiles` share): the
host constants of the `megatron-deepspeed-2023` stack profile (host_op_us, microbatch_overhead_us) are fitted on
vTrain single node; they are scored on vTrain multi node (same stack, other runs) and on Narayanan (the
`megatron-lm-2021` profile takes them from its fork, another stack and era). The A100's sustained GEMM ceiling (a
hardware fact: tools/fit_sustained_gemm.py) is fitted on vTrain multi node and scored on every other A100 set;
Hopper's (tools/fit_hopper_ceiling.py) on the Bridge rows' dense H100 models, scored on the CI rows' H100 runs. The
collective physics constants come from operator-level nccl samples (benchmarks/collective_physics.py), never from these
rows. This benchmark fits nothing into the shipped files: `make profiles` (tools/fit_profiles.py) does, from every row.

Peers, in the same run (`--peers`, after `bash benchmarks/peers/setup.sh`): the seed paper's released tool
(estimate-train-time, trained on the same corpus samples) and llm-analysis (an analytical model from PyPI), each in
its own virtualenv, on the same rows with the same facts (benchmarks/peers/README.md says what each can express).
estimate-train-time takes 2–3 s a row, so it runs on every row of the two small sets and on every
`--ett-stride`-th row of the 727. On the Megatron-core sets (`--only megatron-core --peers`) both peers are given
every row, with the facts those rows add (GQA, MoE, MLA, context parallelism, the GPU's datasheet figures, the
precision recipe): llm-analysis predicts each (its compute-only model, MoE and GQA as its config takes them);
estimate-train-time refuses at once what it cannot express (any GPU but A100, MoE, context parallelism, fp8), which
leaves the dense A100 CI rows. Beside each peer's MAPE is tracekit's held-out figure on the same rows (no peer was
fitted on them either).

llm-foundry (MosaicML's MPT runs, Composer + FSDP; `--only llm-foundry`): every row predicted with the `composer`
stack, whose two scales are fitted on these rows — so the held-out figure is leave-one-model-size-out: each MPT size
predicted with the scales fitted on the other sizes; printed per model size × GPU count.

Megatron-core (`--only megatron-core`): Megatron-LM's own CI runs (megatron_ci_golden: 301 runs of small GPT and
MoE models on DGX A100, DGX H100 and GB200, with their exact launch lines) and NVIDIA's Megatron-Bridge performance
tables (megatron_bridge_perf: Llama 3, DeepSeek-V3, Qwen3, GPT-OSS on H100, B200 and GB200). The `megatron-core`
stack's host constants (host_op_us, microbatch_overhead_us, tensor_op_us) and its host CPU scales (one per host
CPU class besides DGX A100's EPYC: DGX H100's Xeon, Grace) are fitted on the CI rows only: the CI figure is 5-fold
cross-validated by test case (the rows of one test case — its runs on several GPUs and containers — in one fold,
predicted with the constants fitted on the other folds); the Bridge rows, a different set never fitted on for them,
are predicted with the profile's constants (megatron-bridge takes megatron-core's), as `predict --batch` does. The
tensor-core scales per GPU architecture of the `megatron-bridge` profile (its own, read by no other stack) are
fitted on the Bridge rows' dense models: held out leave-one-model-out there, and scored on the CI rows beside the CI
figure (what they would do there; they are not applied to them). Printed per model family × GPU × precision, with
the signed bias.

Hybrid models (`--only hybrid`): Megatron-Bridge's Nemotron 3 Nano rows (megatron_bridge_hybrid.csv: 23 Mamba2, 23
MoE and 6 attention layers, on H100, B200 and GB200), predicted as `predict --batch` predicts them and scored
untouched: nothing is fitted on them (the megatron-bridge profile's constants come from the CI and the other Bridge
rows; the Mamba2 kernels are the roofline of their bytes and FLOPs, predictor.layers.ssm.scan_work). Printed: MAPE,
median and p90, per GPU × precision with the signed bias, the predicted share of the Mamba layers, and how slow they
would have to be to close each row's gap alone (the gap over their predicted time, a bound on what the rows could
say about Mamba's real cost against its roofline), beside the bias of the Bridge table's Qwen3-30B-A3B rows on the
same GPUs and precisions (a transformer of the same size class whose MoE layers take the same path: the share of
the gap that is not Mamba's).

`--what-if-memory-scale X` (an experiment, nothing shipped) also scores the four A100 Megatron sets with every
memory-bound op × X and the megatron-deepspeed-2023 host constants refitted on vTrain single node over it.
`--what-if-gemm-ceiling T [T ...]`: the A100 Megatron sets and llm-foundry with no sustained GEMM ceiling (the
samples' bursts) and with each ceiling T (TFLOP/s) on every A100 SXM GEMM, the megatron-deepspeed-2023 host
constants refitted on vTrain single node and the composer scales on llm-foundry over each — and beside them a scale
of composer's tensor-core kernels fitted too (what the profile dropped once the ceiling stood for it).
`--what-if-hopper-ceiling [T ...]`: the Hopper rows of the Bridge (dense and MoE apart), Nano and CI sets with no
sustained GEMM ceiling, with the shipped one and each T, and with no ceiling but the Hopper device scale it replaced,
refitted on the dense Bridge rows: the mechanism beside the scale, in one run.
`--what-if-blackwell-ceiling [T ...]`: the same for Blackwell, which has no ceiling and keeps Megatron-Bridge's device
scale: its rows with the scale (shipped), with neither, and with a sustained GEMM ceiling T (bf16 TFLOP/s; fp8 at T ×
the fp8 speed-up B200's matmul table measured, fp4 at that × the datasheet's fp4-over-fp8) in its place — the best T
on the dense Bridge rows among them, with its leave-one-model-out figure.

Run: .venv/bin/python benchmarks/e2e_accuracy.py [--models DIR] [--peers]
     [--only megatron|llm-foundry|megatron-core|hybrid] [--what-if-memory-scale X] [--what-if-gemm-ceiling T ...]
     [--what-if-hopper-ceiling [T ...]] [--what-if-blackwell-ceiling [T ...]]
(about 3 minutes of CPU; the held-out fits are most of it)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from extractors import jobs  # noqa: E402
from predictor import batch as B  # noqa: E402
from predictor.costs.learned.models import ModelSet  # noqa: E402
from predictor.costs.physics import achieved_rates  # noqa: E402
from predictor.costs.physics.sustained_gemm import ceilings, floor_us, half  # noqa: E402
from predictor.predict import prepare_many  # noqa: E402
from predictor.sweeps.calibration_fit import fit_prepared, iteration_times_s  # noqa: E402
from tools import fit_hopper_ceiling as fhc, fit_sustained_gemm as fsg, stack_fits as sf  # noqa: E402
from tracekit.core.calibration import NONE, device_scaled  # noqa: E402
from tracekit.core.hardware import architecture, hardware_spec  # noqa: E402
from tracekit.core.stacks import get_stack  # noqa: E402

E2E = sf.E2E
#: Goals of issue #36 (the shipped figure: one run, shipped files, no flags).
SETS = {
    "vtrain single node": (sf.VTRAIN_SINGLE, "≤ 7.5%", None),
    "vtrain multi node": ("vtrain_a100_multi_node.csv", "≤ 10%", None),
    "narayanan 2021": ("narayanan2021_table1_a100_selene.csv", "≤ 5%", None),
    # the same rows with the launch lines of the authors' scripts (micro-batch, interleaving, DDP implementation): the
    # runs as they ran, where the table alone leaves the micro-batch to the CLI (the fastest that fits)
    "narayanan launched": ("narayanan2021_table1_a100_selene.csv", "≤ 5%", ROOT / "benchmarks" / "launch" /
                           "narayanan2021_sc21.json"),
}
FIT_SET = "vtrain single node"
LLMFOUNDRY_GOAL = "≤ 5%"
CI, CI_GOAL = sf.CI, "≤ 13%"
BRIDGE, BRIDGE_GOAL = sf.BRIDGE, "≤ 11%"
PEER_TIMEOUT_S = 3600


def launch_lines(path: Path) -> dict[str, str]:
    """row_ref → launch line of a set's runs (benchmarks/launch/*.json: what its table leaves out, from the
    authors' scripts, with their sources)."""
    return {ref: run["megatron_args"] for ref, run in json.loads(path.read_text())["rows"].items()}


def memory_what_if(sets: dict[str, sf.CorpusSet], scale: float) -> None:
    """The A100 Megatron sets as loaded (vTrain single and multi node, Narayanan as published and as launched) with
    every memory-bound op × `scale` and the megatron-deepspeed-2023 host constants refitted on vTrain single node over
    it, beside the shipped constants: what an A100 memory-bound rate in training below the samples' would do (nothing
    shipped)."""
    shipped = sets[FIT_SET].rows[0].calibration or NONE
    refit = fit_prepared(sets[FIT_SET].prepared, sets[FIT_SET].measured, sf.DEEPSPEED_PARAMS, rounds=5,
                            base=shipped.with_values(memory_scale=scale))[0]
    print(f"\n== what if every memory-bound op took × {scale:g} on A100 (host constants refitted on vTrain single "
          f"node: host_op_us {refit.host_op_us:.1f}, microbatch_overhead_us {refit.microbatch_overhead_us:.0f})")
    for name, data in sets.items():
        cells = []
        for cal in (shipped, refit):
            err = iteration_times_s(data.prepared, cal) / data.measured - 1
            cells.append(f"{100 * np.mean(np.abs(err)):.2f}% (bias {100 * np.mean(err):+.1f}%)")
        print(f"  {name:<20} shipped {cells[0]:<22} what-if {cells[1]}")


def gemm_ceiling_what_if(models, levels: list[float], taken: dict[str, dict[str, str]]) -> None:
    """The A100 Megatron sets and llm-foundry predicted with no sustained GEMM ceiling and with each of `levels`
    (TFLOP/s), the megatron-deepspeed-2023 host constants refitted on vTrain single node and the composer scales on
    llm-foundry over each (beside: those two with a scale of composer's tensor-core kernels fitted too, which the
    profile no longer has): what the shipped ceiling, fitted on vTrain multi node, does to each family, and what
    others would. `taken`: per set, the micro-batch the CLI took for each row that states none (kept at every
    ceiling)."""
    bare = models.unsustained()
    every = {name: sf.load_set(bare, file, launch_lines(launch) if launch else taken.get(name))
             for name, (file, _, launch) in SETS.items()}
    every["llm-foundry"] = foundry = sf.load_set(bare, sf.LLMFOUNDRY)
    units = {name: fsg.unit_floors(data.prepared) for name, data in every.items()}
    print("\n== what the A100's sustained GEMM ceiling does (none: the samples' bursts; the shipped one is "
          f"{ceilings()[fsg.FIT_PART]['fp16']:g} TFLOP/s; megatron-deepspeed-2023 host constants refitted on vTrain "
          "single node and composer's scales on llm-foundry over each; MAPE, bias)")
    print(f"  {'ceiling':<9} {'host_op_us / mb_us':<19} {'composer a · m':<20} "
          + " ".join(f"{name:<20}" for name in every) + " llm-foundry, a compute scale too")
    for tflops in [None, *levels]:
        capped = {name: data.prepared if tflops is None else fsg.at_ceiling(data.prepared, units[name], tflops)
                  for name, data in every.items()}
        host = fit_prepared(capped[FIT_SET], every[FIT_SET].measured, sf.DEEPSPEED_PARAMS, rounds=5)[0]
        comp = fit_prepared(capped["llm-foundry"], foundry.measured, sf.COMPOSER_PARAMS, rounds=6)[0]
        free = fit_prepared(capped["llm-foundry"], foundry.measured, ("compute_scale", *sf.COMPOSER_PARAMS),
                            rounds=6)[0]
        cells = []
        for name, data in every.items():
            err = iteration_times_s(capped[name], comp if name == "llm-foundry" else host) / data.measured - 1
            cells.append(f"{100 * np.mean(np.abs(err)):5.2f}% ({100 * np.mean(err):+5.1f}%)")
        err = iteration_times_s(capped["llm-foundry"], free) / foundry.measured - 1
        scales = f"c {free.compute_scale:.3f}"
        cells.append(f"{100 * np.mean(np.abs(err)):5.2f}% ({scales})")
        label = "none" if tflops is None else f"{tflops:g}"
        print(f"  {label:<9} {f'{host.host_op_us:.0f} / {host.microbatch_overhead_us:.0f}':<19} "
              f"{f'{comp.attention_scale:.2f} · {comp.memory_scale:.2f}':<20} "
              + " ".join(f"{c:<20}" for c in cells))


def part_groups(models, on) -> dict[str, tuple[list, list, np.ndarray, np.ndarray]]:
    """The rows of the Bridge (dense and MoE apart), Nano and CI sets whose part `on(hardware)` accepts, prepared with
    `models`: per group, its prepared graphs, calibrations as shipped, measured times (s) and each row's model (the
    Bridge rows') or set."""
    groups = {}
    for file, short in ((sf.BRIDGE, "Bridge"), (HYBRID, "Nano"), (sf.CI, "CI")):
        data = sf.load_set(models, file)
        idx = [i for i, r in enumerate(data.rows) if on(r.cluster.hardware)]
        split = (("Bridge dense", [i for i in idx if data.rows[i].config.moe is None]),
                 ("Bridge MoE", [i for i in idx if data.rows[i].config.moe is not None])) if file == sf.BRIDGE \
            else ((short, idx),)
        for name, rows in split:
            groups[name] = ([data.prepared[i] for i in rows], [data.rows[i].calibration or NONE for i in rows],
                            data.measured[rows], np.array([sf.bridge_model(data.rows[i]) if file == sf.BRIDGE else short
                                                           for i in rows]))
    return groups


def group_row(label: str, width: int, groups: dict, times: dict[str, np.ndarray]) -> None:
    """One line of a what-if table: `label`, then each group's MAPE and bias under `times`."""
    cells = [f"{100 * np.mean(np.abs(t / groups[n][2] - 1)):5.2f}% ({100 * np.mean(t / groups[n][2] - 1):+5.1f}%)"
             for n, t in times.items()]
    print(f"  {label:<{width}} " + " ".join(f"{c:<18}" for c in cells))


def hopper_ceiling_what_if(models, levels: list[float]) -> None:
    """The Hopper rows of the Bridge, Nano and CI sets with no sustained GEMM ceiling, with each ceiling of `levels`
    (bf16 TFLOP/s; fp8 at it × the measured fp8 speed-up) and the shipped one, and with no ceiling but a Hopper device
    scale on every tensor-core op refitted on the dense Bridge rows (what the megatron-bridge profile held before
    Hopper's ceiling replaced it): the mechanism and the scale side by side, each row under its shipped calibration."""
    ratio, _ = fhc.fp8_speedup()
    shipped = ceilings()[fhc.FIT_PART]["bf16"]
    groups = part_groups(models.unsustained(), lambda hw: hw in fhc.PARTS)
    units = {name: fhc.unit_floors(prepared) for name, (prepared, *_) in groups.items()}

    def row(label: str, times: dict[str, np.ndarray]) -> None:
        group_row(label, 34, groups, times)

    def at(tflops: float | None, scale: float = 1.0) -> dict[str, np.ndarray]:
        return {name: np.array([iteration_times_s([g], device_scaled(cal, scale))[0] for g, cal in zip(
            prepared if tflops is None else fhc.at_ceiling(prepared, units[name], tflops, ratio), cals)])
            for name, (prepared, cals, *_) in groups.items()}

    print(f"\n== what Hopper's sustained GEMM ceiling does on the rows of {', '.join(fhc.PARTS)} (shipped: {shipped:g} "
          f"TFLOP/s bf16, × {ratio:g} fp8; MAPE, bias)")
    print(f"  {'':<34} " + " ".join(f"{f'{n} ({len(g[2])} rows)':<18}" for n, g in groups.items()))
    row("no ceiling, no scale", at(None))
    for tflops in sorted({*levels, shipped}):
        row(f"ceiling {tflops:g}" + (" (shipped)" if tflops == shipped else ""), at(tflops))
    prepared, cals, measured, _ = groups["Bridge dense"]
    grid = np.round(np.arange(1.0, 1.5001, 0.005), 3)
    errors = [np.mean(np.abs(np.array([iteration_times_s([g], device_scaled(c, s))[0] for g, c in zip(prepared, cals)])
                             / measured - 1)) for s in grid]
    scale = float(grid[int(np.argmin(errors))])
    row(f"no ceiling, Hopper scale ×{scale:g}", at(None, scale))


def blackwell_ceiling_what_if(models, levels: list[float]) -> None:
    """The Blackwell rows of the Bridge (dense and MoE apart), Nano and CI sets as shipped (no ceiling; Bridge's rows
    with its Blackwell device scale), with neither, and with a sustained GEMM ceiling in the scale's place: bf16 GEMMs
    no faster than T, every fp8 recipe than T × the fp8 speed-up Blackwell's matmul table measured, fp4 than that × the
    datasheet's fp4-over-fp8 (one clock) — each T of `levels` and the best on the dense Bridge rows (a grid 20 TFLOP/s
    apart), with that one's leave-one-model-out figure. Nothing shipped: what a ceiling would do where the scale is."""
    measured8 = {hw: r for hw, r in achieved_rates.fp8_speedups().items() if architecture(hw) == "blackwell"}
    if not measured8:
        print("\n== Blackwell: no matmul table measured fp8 beside bf16 (tracekit/data/gemm_rates.json): no what-if")
        return
    ratio8 = float(np.median(list(measured8.values())))
    groups = part_groups(models, lambda hw: architecture(hw) == "blackwell")
    parts = {cluster.hardware for prepared, *_ in groups.values() for _, _, cluster, _ in prepared}
    ratio4 = {hw: hardware_spec(hw).peak_tflops("nvfp4") / hardware_spec(hw).peak_tflops("fp8") for hw in parts}
    # per graph, each operator's least time at 1 TFLOP/s: its half-precision, fp8 and (at the fp4 ratio) fp4 GEMMs'
    at_one = ({hw: half(1.0) for hw in parts}, {hw: {"fp8": 1.0} for hw in parts},
              {hw: {"nvfp4": ratio4[hw], "mxfp4": ratio4[hw]} for hw in parts})
    units = {name: [[floor_us(frame, one) for one in at_one] for frame in (pd.DataFrame(g.specs) for g, *_ in prepared)]
             for name, (prepared, *_) in groups.items()}

    def at(tflops: float | None, scaled: bool = False) -> dict[str, np.ndarray]:
        out = {}
        for name, (prepared, cals, _, _) in groups.items():
            graphs = prepared if tflops is None else sf.floored(prepared, [
                np.fmax(u_half / tflops, np.fmax(u_fp8, u_fp4) / (tflops * ratio8)) for u_half, u_fp8, u_fp4 in
                units[name]])
            out[name] = np.array([iteration_times_s([g], cal if scaled else cal.with_values(compute_scale=1.0))[0]
                                  for g, cal in zip(graphs, cals)])
        return out

    def row(label: str, times: dict[str, np.ndarray]) -> None:
        group_row(label, 46, groups, times)

    scale = get_stack("megatron-bridge").device_scale.get("blackwell", 1.0)
    print(f"\n== what a sustained GEMM ceiling would do on Blackwell in the place of Megatron-Bridge's device scale "
          f"(×{scale:g}) on the rows of {', '.join(sorted(parts))} (fp8 at × {ratio8:g}, {', '.join(sorted(measured8))}"
          f"'s table; fp4 at a further × {', '.join(f'{r:g}' for r in sorted(set(ratio4.values())))}, the "
          "datasheet's; MAPE, bias)")
    print(f"  {'':<46} " + " ".join(f"{f'{n} ({len(g[2])} rows)':<18}" for n, g in groups.items()))
    row(f"no ceiling, Bridge's scale ×{scale:g} (shipped)", at(None, scaled=True))
    row("no ceiling, no scale", at(None))
    grid = np.arange(600.0, hardware_spec(sorted(parts)[0]).peak_tflops("bf16") + 1.0, 20.0)
    _, _, measured, names = groups["Bridge dense"]
    dense = np.array([at(t)["Bridge dense"] for t in grid])
    best = float(grid[int(np.argmin(np.abs(dense / measured - 1).mean(axis=1)))])
    held, chosen = sf.grid_held_out(dense, measured, names, grid)
    for tflops in sorted({*levels, best}):
        row(f"ceiling {tflops:g}, no scale" + (" (best on Bridge dense)" if tflops == best else ""), at(tflops))
    print(f"  the best ceiling on the dense Bridge rows held out (leave-one-model-out, {chosen}): MAPE "
          f"{100 * np.mean(np.abs(held / measured - 1)):.2f}%")


def shipped_times(rows, models, micro: list | None = None) -> np.ndarray:
    """What `tracekit predict --batch FILE` answers for each row, with the shipped profiles and models and no other
    flag: `predictor.batch.predict_rows`, the call the CLI makes (NaN where a row is refused). `micro`, when given,
    receives each row's micro-batch as predicted (the one taken where the row states none)."""
    results = B.predict_rows(rows, models)
    if micro is not None:
        micro.extend(None if isinstance(p, Exception) else p.config.micro_batch_size for p in results)
    return np.array([np.nan if isinstance(p, Exception) else p.iteration_time_s for p in results])


def times_with_row_stacks(rows, prepared) -> np.ndarray:
    """Iteration times with each row's own stack constants (what `predict --batch` applies)."""
    return np.array([iteration_times_s([p], r.calibration or NONE)[0] for r, p in zip(rows, prepared)])


def header(name: str, data: sf.CorpusSet, seconds: float | None = None) -> None:
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    print(f"\n== {name} ({data.file}): {len(data.rows)} rows predicted, {len(data.failed)} not{took}; stacks "
          f"{sorted({r.stack.name for r in data.rows})}, clusters {sorted({r.cluster.name for r in data.rows})}, "
          f"models {sorted({p[0].hardware for p in data.prepared})}")
    for r in data.failed:
        print(f"  not predicted: line {r.line}: {r.error}")


def stats(predicted: np.ndarray, measured: np.ndarray) -> tuple[float, float, float]:
    err = np.abs(predicted - measured) / measured
    return 100 * err.mean(), 100 * np.median(err), 100 * np.quantile(err, 0.9)


def print_figures(shipped: tuple[float, float, float], goal: str, held_out: float, label: str, bare: float,
                  launched: bool = False) -> None:
    """A set's figures: the shipped one (the headline: what `predict --batch` answers; `launched`: on the file with
    the runs' launch lines added), the held-out one beside it (each fitted constant fitted without the rows it
    predicts; `label` says how) and the one without stack constants."""
    what = "predict --batch on the rows with their launch lines" if launched else "predict --batch FILE, no flag"
    print(f"  shipped ({what}): MAPE {shipped[0]:.2f}% (median {shipped[1]:.2f}%, "
          f"p90 {shipped[2]:.2f}%); goal {goal}")
    print(f"  held out ({label}): MAPE {held_out:.2f}%")
    print(f"  without stack constants: MAPE {bare:.2f}%")


def shapes(rows, predicted: np.ndarray, measured: np.ndarray, worst: int, micro: list) -> None:
    """MAPE and bias per parallel split, then the worst rows (`micro`: each row's micro-batch as predicted)."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault((r.config.tp, r.config.pp, r.config.dp), []).append(i)
    print(f"  {'tp':>3} {'pp':>3} {'dp':>4} {'rows':>5} {'MAPE %':>8} {'bias %':>8}")
    for key in sorted(groups):
        idx = groups[key]
        rel = (predicted[idx] - measured[idx]) / measured[idx]
        print(f"  {key[0]:>3} {key[1]:>3} {key[2]:>4} {len(idx):>5} {100 * np.abs(rel).mean():>8.2f} "
              f"{100 * rel.mean():>+8.2f}")
    err = np.abs(predicted - measured) / measured
    print(f"  worst {worst} rows:")
    for i in np.argsort(-err)[:worst]:
        c = rows[i].config
        print(f"    line {rows[i].line}: {c.world_size} GPUs L{c.num_layers} h{c.hidden_size} gbs "
              f"{c.global_batch_size} mb {micro[i]} tp{c.tp} pp{c.pp} dp{c.dp}: measured "
              f"{measured[i]:.4g} s, predicted {predicted[i]:.4g} s "
              f"({100 * (predicted[i] - measured[i]) / measured[i]:+.1f}%)")


def peer_rows(rows) -> list[dict]:
    """The facts of each row a peer predictor is given (the same tracekit uses; keys in benchmarks/peers/README.md):
    the model, the parallel split (`dp` without context parallelism: num_gpus = tp·pp·cp·dp), GQA, MoE, MLA, the
    GPU with its datasheet figures (tracekit/data/hardware.json) and the precision recipe."""
    out = []
    for i, r in enumerate(rows):
        c, cl = r.config, r.cluster
        spec = hardware_spec(cl.hardware)
        moe = c.moe
        row = {"id": i, "num_layers": c.num_layers, "hidden_size": c.hidden_size,
               "ffn_hidden_size": c.ffn_hidden_size, "num_attention_heads": c.num_attention_heads,
               "num_query_groups": c.num_query_groups, "kv_channels": c.kv_channels,
               "seq_length": c.seq_length, "vocab_size": c.vocab_size,
               "global_batch_size": c.global_batch_size, "micro_batch_size": c.micro_batch_size, "tp": c.tp,
               "pp": c.pp, "dp": c.dp, "cp": c.cp, "num_gpus": c.world_size, "gpus_per_node": cl.gpus_per_node,
               "precision": c.precision, "recompute": c.recompute_granularity,
               "sequence_parallel": c.sequence_parallel, "attention": c.attention, "swiglu": c.swiglu,
               "normalization": c.normalization,
               "position_embedding_type": c.position_embedding_type,
               "multi_latent_attention": bool(c.attn and c.attn.multi_latent_attention),
               "intra_node_gbs": cl.link_gbs(False), "inter_node_gbs": cl.link_gbs(True), "gpu": cl.hardware}
        if spec is not None:
            row.update({"gpu_memory_gb": spec.memory_gb, "gpu_mem_bw_gbs": spec.mem_bw_gbs,
                        "gpu_peak_tflops_fp16": spec.peak_tflops_fp16, "gpu_peak_tflops_fp8": spec.peak_tflops_fp8,
                        "gpu_peak_tflops_fp4": spec.peak_tflops_fp4})
        if moe is not None:
            row.update({"num_experts": moe.num_experts, "moe_router_topk": moe.moe_router_topk,
                        "moe_ffn_hidden_size": moe.ffn(c.ffn_hidden_size),
                        "moe_shared_expert_intermediate_size": moe.moe_shared_expert_intermediate_size or 0,
                        "expert_model_parallel_size": moe.ep,
                        "expert_tensor_parallel_size": moe.etp(c.tp),
                        "moe_layers": sum(moe.pattern(c.num_layers))})
        out.append(row)
    return out


def run_peers(rows, measured: np.ndarray, ours: np.ndarray, stride: int
              ) -> list[tuple[str, int, float | None, str, float | None]]:
    """(peer, rows predicted, MAPE % over them, note, tracekit's MAPE % on the same rows) per peer; estimate-train-time
    is given every `stride`-th row. The note counts the rows, and the rows the peer refused by reason; a peer that is
    not set up says so."""
    from benchmarks.peers import client

    facts = peer_rows(rows)
    out: list[tuple[str, int, float | None, str, float | None]] = []
    for name in client.PEERS:
        picked = facts if name != "estimate-train-time" else facts[::stride]
        try:
            answers = client.predict(name, picked, PEER_TIMEOUT_S)
        except client.PeerUnavailable as exc:
            out.append((name, 0, None, str(exc), None))
            continue
        got = [(a["id"], a["iteration_time_s"]) for a in answers if a.get("iteration_time_s")]
        refused: dict[str, int] = {}
        for a in answers:
            if not a.get("iteration_time_s"):
                reason = re.sub(r"^[A-Za-z]*Error: ", "", a.get("error") or "no prediction").split(":")[0]
                refused[reason] = refused.get(reason, 0) + 1
        why = "; refused: " + ", ".join(f"{k} ({v})" for k, v in sorted(refused.items(), key=lambda kv: -kv[1]))
        if not got:
            out.append((name, 0, None, f"no row of {len(picked)} predicted{why if refused else ''}", None))
            continue
        ids = np.array([i for i, _ in got])
        predicted = np.array([t for _, t in got])
        err = np.abs(predicted - measured[ids]) / measured[ids]
        same = 100 * float((np.abs(ours[ids] - measured[ids]) / measured[ids]).mean())
        note = ""
        if len(got) < len(facts):
            note = (f"{len(got)} of {len(facts)} rows{f' (every {stride}th given)' if len(picked) < len(facts) else ''}"
                    f"; tracekit on the same rows {same:.2f}%{why if refused else ''}")
        out.append((name, len(got), 100 * float(err.mean()), note, same))
    return out


def print_peers(peers) -> None:
    for peer, n, peer_mape, note, _ in peers:
        figure = "no MAPE" if peer_mape is None else f"MAPE {peer_mape:.2f}% on {n} rows"
        print(f"  peer {peer}: {figure}{' (' + note + ')' if note else ''}")


def llmfoundry(models, worst: int) -> tuple:
    """Every llm-foundry row predicted as `predict --batch` predicts it (the composer stack's constants), and the
    same constants fitted leave-one-model-size-out: each model size's rows predicted with the constants fitted on the
    other sizes. Prints MAPE, median and p90, and a table per model size × GPU count."""
    data = sf.load_set(models, sf.LLMFOUNDRY)
    good, measured = data.rows, data.measured
    header("llm-foundry", data)
    held_out = sf.composer_held_out(data)
    shipped = shipped_times(good, models)
    bare = iteration_times_s(data.prepared, NONE)
    cv = stats(held_out, measured)
    ship = stats(shipped, measured)
    label = f"{sf.COMPOSER} constants leave-one-model-size-out"
    print_figures(ship, LLMFOUNDRY_GOAL, cv[0], f"{label} (median {cv[1]:.2f}%, p90 {cv[2]:.2f}%)",
                  stats(bare, measured)[0])
    compiled_what_if(models, good, shipped, measured)
    groups: dict[tuple[str, int], list[int]] = {}
    for i, r in enumerate(good):
        groups.setdefault((r.cells["model_name"], r.config.world_size), []).append(i)
    print(f"  {'model':<9} {'GPUs':>5} {'rows':>5} {'MAPE %':>8} {'bias %':>8}  (leave-one-model-size-out)")
    for name in sf.model_sizes(data):
        for (model, gpus) in sorted(k for k in groups if k[0] == name):
            idx = groups[(model, gpus)]
            rel = (held_out[idx] - measured[idx]) / measured[idx]
            print(f"  {model:<9} {gpus:>5} {len(idx):>5} {100 * np.abs(rel).mean():>8.2f} {100 * rel.mean():>+8.2f}")
    err = np.abs(held_out - measured) / measured
    print(f"  worst {worst} rows (leave-one-model-size-out):")
    for i in np.argsort(-err)[:worst]:
        c = good[i].config
        print(f"    line {good[i].line}: {good[i].cells['model_name']} {c.world_size} GPUs seq {c.seq_length} mb "
              f"{c.micro_batch_size} recompute {c.recompute_granularity}: measured {measured[i]:.4g} s, predicted "
              f"{held_out[i]:.4g} s ({100 * (held_out[i] - measured[i]) / measured[i]:+.1f}%)")
    return ("llm-foundry", len(good), len(data.failed), *ship, cv[0], label, stats(bare, measured)[0],
            LLMFOUNDRY_GOAL, [])


def compiled_what_if(models, good: list, shipped: np.ndarray, measured: np.ndarray) -> None:
    """The same rows as if each had compiled its blocks (`torch_compile`, predictor.layers.compile_fusion; the rows
    state no compile: MosaicML's benchmarks ran eager), with the shipped composer constants: what compile changes."""
    rows = [jobs.parse_row(r.cells, r.line, None, None, {"torch_compile": True}) for r in good]
    prepared = prepare_many([r.config for r in rows], [r.cluster for r in rows], models)
    times = times_with_row_stacks(rows, prepared)
    change = 100 * (times - shipped) / shipped
    print(f"  as if compiled (torch_compile on every row, shipped constants): MAPE {stats(times, measured)[0]:.2f}%; "
          f"predicted time {np.median(change):+.1f}% median ({change.min():+.1f}% to {change.max():+.1f}%)")


def groups_table(rows, predicted: np.ndarray, measured: np.ndarray, key, title: str, worst: int) -> None:
    """MAPE and signed bias per group (`key(row)` → tuple of strings), and the worst rows."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(key(r), []).append(i)
    print(f"  {title:<52} {'rows':>5} {'MAPE %':>8} {'bias %':>8}")
    for k in sorted(groups):
        idx = groups[k]
        rel = (predicted[idx] - measured[idx]) / measured[idx]
        print(f"  {' × '.join(k):<52} {len(idx):>5} {100 * np.abs(rel).mean():>8.2f} {100 * rel.mean():>+8.2f}")
    err = np.abs(predicted - measured) / measured
    print(f"  worst {worst} rows:")
    for i in np.argsort(-err)[:worst]:
        r, c = rows[i], rows[i].config
        print(f"    line {r.line}: {r.cells.get('model_name', '')} on {c.world_size} × {r.cells['hardware_gpu']} "
              f"tp{c.tp} pp{c.pp} dp{c.dp} ep{c.moe.ep if c.moe else 1}: measured {measured[i]:.4g} s, predicted "
              f"{predicted[i]:.4g} s ({100 * (predicted[i] - measured[i]) / measured[i]:+.1f}%)")


def _family_gpu_precision(r) -> tuple[str, ...]:
    return (r.cells.get("model_family") or "?", r.cells["hardware_gpu"], r.config.precision)


def _model_gpu_precision(r) -> tuple[str, ...]:
    return (r.cells.get("model_name") or "?", r.cells["hardware_gpu"], r.config.precision)


def megatron_ci(models, worst: int, peer_stride: int | None = None) -> tuple:
    """The CI rows with the shipped megatron-core constants, and held out: the constants fitted by test-case 5-fold
    cross-validation (module docstring); with `peer_stride` the peers too, on the same rows (estimate-train-time on
    every `peer_stride`-th), beside the held-out figure."""
    data = sf.load_set(models, CI)
    rows, prepared, measured = data.rows, data.prepared, data.measured
    header("megatron ci golden", data)
    print(f"  {len(set(sf.case_folds(rows)))} folds over {len({sf.test_case(r) for r in rows})} test cases")
    held_out = sf.core_held_out(data, report=lambda line: print(f"  {line}"))
    cv = stats(held_out, measured)
    shipped = stats(shipped_times(rows, models), measured)
    bare = stats(iteration_times_s(prepared, NONE), measured)[0]
    label = f"{sf.CORE} constants, {sf.FOLDS}-fold CV by test case"
    print_figures(shipped, CI_GOAL, cv[0], f"{label} (median {cv[1]:.2f}%, p90 {cv[2]:.2f}%)", bare)
    bridge = get_stack(sf.BRIDGE_STACK).device_scale
    scaled = np.array([iteration_times_s([p], device_scaled(r.calibration or NONE,
                                                            bridge.get(sf.arch_of(r), 1.0)))[0]
                       for r, p in zip(rows, prepared)])
    print(f"  with megatron-bridge's device scales {bridge} on the CI rows (scored here, not applied to them): MAPE "
          f"{stats(scaled, measured)[0]:.2f}%")
    groups_table(rows, held_out, measured, _family_gpu_precision, "family × GPU × precision (CV)", worst)
    peers = run_peers(rows, measured, held_out, peer_stride) if peer_stride else []
    print_peers(peers)
    return ("megatron ci golden", len(rows), len(data.failed), *shipped, cv[0], label, bare, CI_GOAL, peers)


#: What makes two Bridge rows the same run apart from the container that measured it.
LAYOUT_COLUMNS = ("model_name", "hardware_gpu", "num_gpus", "tp", "pp", "virtual_pipeline_stages", "cp",
                  "expert_model_parallel_size", "expert_tensor_parallel_size", "global_batch_size",
                  "micro_batch_size", "precision", "seq_length")


def container_twins(rows, predicted: np.ndarray, measured: np.ndarray) -> None:
    """How far one measurement of a layout is from the same layout measured in other containers (NeMo releases):
    each row that has such twins is "predicted" by the median of its twins' times, beside tracekit's prediction of
    the same rows. What releases change (kernels, recipes) is not in a row's columns, so this spread is part of any
    predictor's error on these rows."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(tuple(r.cells.get(k, "") for k in LAYOUT_COLUMNS), []).append(i)
    twin_err, ours_err, spreads = [], [], []
    for idx in groups.values():
        if len(idx) < 2:
            continue
        spreads.append((measured[idx].max() / measured[idx].min(), idx))
        for i in idx:
            others = measured[[j for j in idx if j != i]]
            twin_err.append(abs(np.median(others) - measured[i]) / measured[i])
            ours_err.append(abs(predicted[i] - measured[i]) / measured[i])
    if not twin_err:
        return
    print(f"  same layout measured in other containers: {len(twin_err)} rows in {len(spreads)} layouts; the median "
          f"of a row's twins is off by {100 * np.mean(twin_err):.2f}% (MAPE), tracekit by "
          f"{100 * np.mean(ours_err):.2f}% on the same rows")
    for spread, idx in sorted(spreads, key=lambda s: -s[0])[:3]:
        r = rows[idx[0]]
        times = ", ".join(f"{rows[i].cells.get('container', '?')} {measured[i]:.3g} s" for i in idx)
        print(f"    widest: {r.cells.get('model_name')} on {r.cells['num_gpus']} × {r.cells['hardware_gpu']} "
              f"{r.cells['precision']}: ×{spread:.2f} ({times})")


def megatron_bridge(models, worst: int, peer_stride: int | None = None) -> tuple:
    """The Megatron-Bridge rows with the shipped profile (host constants fitted on CI rows only), and held out: the
    device scales leave-one-model-out (each model's rows predicted with scales fitted on the others); with
    `peer_stride` the peers too, beside the held-out figure."""
    data = sf.load_set(models, BRIDGE)
    rows, prepared, measured = data.rows, data.prepared, data.measured
    header("megatron bridge perf", data)
    held_out = sf.bridge_held_out(data, report=lambda line: print(f"  {line}"))
    figure = stats(held_out, measured)
    shipped = stats(shipped_times(rows, models), measured)
    ci_only = stats(np.array([iteration_times_s([p], sf.undeviced(r))[0] for r, p in zip(rows, prepared)]), measured)
    bare = stats(iteration_times_s(prepared, NONE), measured)[0]
    label = f"host constants fitted on CI, {sf.BRIDGE_STACK}'s device scales leave-one-model-out"
    print_figures(shipped, BRIDGE_GOAL, figure[0], f"{label} (median {figure[1]:.2f}%, p90 {figure[2]:.2f}%)", bare)
    print(f"  host constants fitted on CI only, no device scale: MAPE {ci_only[0]:.2f}%")
    groups_table(rows, held_out, measured, _model_gpu_precision, "model × GPU × precision (leave-one-model-out)",
                 worst)
    container_twins(rows, held_out, measured)
    peers = run_peers(rows, measured, held_out, peer_stride) if peer_stride else []
    print_peers(peers)
    return ("megatron bridge perf", len(rows), len(data.failed), *shipped, figure[0], label, bare, BRIDGE_GOAL, peers)


# -- hybrid models: Nemotron 3 Nano (Mamba2 + MoE + attention) -------------------------------------------------------
HYBRID = "megatron_bridge_hybrid.csv"
HYBRID_GOAL = "≤ 15%"


def block_seconds(prepared, cal, prefix: str) -> float:
    """Predicted seconds per iteration of the ops of the layers whose kind starts with `prefix`, on the busiest
    stage's GPU (their per-micro-batch time × micro-batches; overlap with communication not taken off)."""
    from predictor.costs.estimates import calibrated_durations

    graph, est = prepared[0], prepared[1]
    dur = calibrated_durations(graph, est, cal)
    m = graph.config.num_microbatches
    total = 0.0
    for seg in graph.segments:
        for op in seg.fwd + seg.bwd:
            if op.per_layer and str(op.block).split(":")[-1].startswith(prefix):
                total += float(dur[op.spec]) * op.count * m
    return total / 1e6


def hybrid_models(models, worst: int) -> tuple:
    """The hybrid rows as `predict --batch` predicts them (the row's stack, nothing fitted on them): shipped is the
    only figure, and the held-out one is the same (no constant is fitted on these rows)."""
    data = sf.load_set(models, HYBRID)
    rows, prepared, measured = data.rows, data.prepared, data.measured
    header("hybrid (Nano)", data)
    shipped = stats(shipped_times(rows, models), measured)
    predicted = times_with_row_stacks(rows, prepared)
    bare = stats(iteration_times_s(prepared, NONE), measured)[0]
    label = "megatron-bridge profile, nothing fitted on these rows"
    print_figures(shipped, HYBRID_GOAL, shipped[0], label, bare)
    groups_table(rows, predicted, measured, lambda r: (r.cells["hardware_gpu"], r.config.precision),
                 "GPU × precision", worst)
    print(f"  {'row':<36} {'Mamba share %':>13} {'Mamba × to close the gap':>25}")
    for r, p, t, meas in zip(rows, prepared, predicted, measured):
        mamba = block_seconds(p, r.calibration or NONE, "mamba")
        name = f"line {r.line}: {r.cells['hardware_gpu']} {r.config.precision}"
        print(f"  {name:<36} {100 * mamba / t:>13.1f} {(mamba + meas - t) / mamba:>25.2f}")
    control = sf.load_set(models, BRIDGE)
    keep = [i for i, r in enumerate(control.rows) if sf.bridge_model(r).lower().startswith("qwen3_30b")]
    c_predicted = times_with_row_stacks([control.rows[i] for i in keep], [control.prepared[i] for i in keep])
    groups_table([control.rows[i] for i in keep], c_predicted, control.measured[keep],
                 lambda r: (r.cells["hardware_gpu"], r.config.precision),
                 "control: Qwen3-30B-A3B (Bridge table), GPU × precision", 0)
    return ("hybrid (Nano)", len(rows), len(data.failed), *shipped, shipped[0], label, bare, HYBRID_GOAL, [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="model directory (default: bundled)")
    parser.add_argument("--only", choices=("megatron", "llm-foundry", "megatron-core", "hybrid"), default=None,
                        help="run one part only (default: all)")
    parser.add_argument("--worst", type=int, default=5)
    parser.add_argument("--peers", action="store_true", help="also run the peer predictors on the same rows")
    parser.add_argument("--what-if-memory-scale", type=float, default=None, metavar="X",
                        help="also score the A100 Megatron sets with every memory-bound op × X and the "
                             f"{sf.DEEPSPEED} host constants refitted on vTrain single node over it (an experiment: "
                             "nothing shipped; composer's memory_scale, fitted on llm-foundry, is 1.29)")
    parser.add_argument("--what-if-gemm-ceiling", type=float, nargs="+", default=None, metavar="T",
                        help="also score the A100 Megatron sets and llm-foundry with no sustained GEMM ceiling "
                             "and with each ceiling T (TFLOP/s) on every A100 GEMM, host and composer constants "
                             "refitted over each (the shipped ceiling is fitted by make profiles)")
    parser.add_argument("--what-if-hopper-ceiling", type=float, nargs="*", default=None, metavar="T",
                        help="also score the Hopper rows of the Bridge, Nano and CI sets with no sustained GEMM "
                             "ceiling, with the shipped one and each ceiling T (bf16 TFLOP/s), and with the Hopper "
                             "device scale it replaced (the shipped ceiling is fitted by make profiles)")
    parser.add_argument("--what-if-blackwell-ceiling", type=float, nargs="*", default=None, metavar="T",
                        help="also score the Blackwell rows of the Bridge, Nano and CI sets as shipped (Bridge's "
                             "Blackwell device scale, no ceiling), with neither, and with a sustained GEMM ceiling T "
                             "(bf16 TFLOP/s) and the best one on the dense Bridge rows in the scale's place (nothing "
                             "shipped)")
    parser.add_argument("--ett-stride", type=int, default=10,
                        help="estimate-train-time predicts every Nth row of the Megatron sets larger than 100 rows "
                             "(default 10); the Megatron-core sets give it every row (it refuses all but ~133 at once)")
    args = parser.parse_args()
    if not E2E.is_dir():
        parser.error(f"{E2E}: no such folder (the corpus is read from $TRACEKIT_CORPUS, else ../shared/corpus)")
    models = ModelSet.load(args.models)
    print(f"models: {models.path} ({', '.join(models.hardware_ids())})")
    summary = []
    loaded: dict[str, sf.CorpusSet] = {}
    taken: dict[str, dict[str, str]] = {}  # set → row_ref → the micro-batch the CLI took where the row states none
    for name, (file, goal, launch) in (SETS.items() if args.only in (None, "megatron") else ()):
        t0 = time.perf_counter()
        data = loaded[name] = sf.load_set(models, file, launch_lines(launch) if launch else None)
        rows, prepared, measured = data.rows, data.prepared, data.measured
        header(name, data, time.perf_counter() - t0)
        micro: list = []
        shipped = shipped_times(rows, models, micro)
        if launch is None and any(m != r.config.micro_batch_size for m, r in zip(micro, rows)):
            # rows that state no micro-batch: the other figures and the what-ifs at the one the CLI took for each
            taken[name] = {r.cells["row_ref"]: f"--micro-batch-size {m}" for r, m in zip(rows, micro)}
            data = loaded[name] = sf.load_set(models, file, taken[name])
            rows, prepared = data.rows, data.prepared
        bare = iteration_times_s(prepared, NONE)
        if name == FIT_SET:
            held_out = sf.deepspeed_held_out(data)
            label = f"{sf.DEEPSPEED} constants {sf.FOLDS}-fold CV"
        elif file == fsg.FIT_SET and not launch:
            multi, _, times = fsg.scan(models)
            assert [r.line for r in multi.rows] == [r.line for r in rows], "the ceiling's rows are the set's"
            held_out, label = fsg.held_out(multi, times)[0], f"the A100's sustained GEMM ceiling {sf.FOLDS}-fold CV"
        else:  # no constant is fitted on these rows: the shipped figure is held out
            held_out, label = shipped, "never fitted on: the shipped figure"
        figure = stats(shipped, measured)
        print_figures(figure, goal, stats(held_out, measured)[0], label, stats(bare, measured)[0], bool(launch))
        shapes(rows, shipped, measured, args.worst, micro)
        peers = run_peers(rows, measured, held_out, args.ett_stride if len(rows) > 100 else 1) if args.peers else []
        print_peers(peers)
        summary.append((name, len(rows), len(data.failed), *figure, stats(held_out, measured)[0], label,
                        stats(bare, measured)[0], goal, peers))
    if args.what_if_memory_scale is not None and args.only in (None, "megatron"):
        memory_what_if(loaded, args.what_if_memory_scale)
    if args.what_if_gemm_ceiling and args.only in (None, "megatron"):
        gemm_ceiling_what_if(models, args.what_if_gemm_ceiling, taken)
    if args.only in (None, "llm-foundry"):
        summary.append(llmfoundry(models, args.worst))
    if args.only in (None, "megatron-core"):
        # estimate-train-time refuses every row but the dense A100 ones at once (benchmarks/peers/README.md): it is
        # given every row of both sets
        stride = 1 if args.peers else None
        summary.append(megatron_ci(models, args.worst, stride))
        summary.append(megatron_bridge(models, args.worst, stride))
    if args.only in (None, "hybrid"):
        summary.append(hybrid_models(models, args.worst))
    if args.what_if_hopper_ceiling is not None and args.only in (None, "megatron-core", "hybrid"):
        hopper_ceiling_what_if(models, args.what_if_hopper_ceiling)
    if args.what_if_blackwell_ceiling is not None and args.only in (None, "megatron-core", "hybrid"):
        blackwell_ceiling_what_if(models, args.what_if_blackwell_ceiling)
    print("\nshipped: `tracekit predict --batch FILE` with the shipped files and no flag · held out: each fitted "
          "constant fitted without the rows it predicts")
    print(f"{'set':<20} {'rows':>5} {'failed':>6} {'shipped %':>9} {'median %':>8} {'p90 %':>6} {'goal':<7} "
          f"{'held out %':>10} {'no stack constants %':>20}  (held out: how)")
    for name, n, bad, mape, median, p90, held, label, bare, goal, _ in summary:
        print(f"{name:<20} {n:>5} {bad:>6} {mape:>9.2f} {median:>8.2f} {p90:>6.2f} {goal:<7} {held:>10.2f} "
              f"{bare:>20.2f}  ({label})")
    if args.peers:
        names = next((tuple(p[0] for p in peers) for *_, peers in summary if peers), ())
        print(f"\n{'set':<20} {'tracekit held out MAPE %':>24} "
              + " ".join(f"{p + ' MAPE % (rows; tracekit on them)':>44}" for p in names))
        for name, n, _, _, _, _, mape, *_, peers in summary:
            if not peers:
                continue
            cells = [f"{'—' if m is None else f'{m:.2f}'} ({k}{'' if same is None else f'; {same:.2f}'})"
                     for _, k, m, _, same in peers]
            print(f"{name:<20} {mape:>24.2f} " + " ".join(f"{c:>44}" for c in cells))


if __name__ == "__main__":
    main()
