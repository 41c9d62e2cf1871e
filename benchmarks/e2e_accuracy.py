"""End-to-end accuracy of `tracekit predict` with the CLI's defaults on the corpus's measured Megatron iterations.

For each set in ../shared/corpus/e2e — vTrain single node (727 rows, 2–8 A100), vTrain multi node (55 rows, 64–512
A100), Narayanan 2021 Table 1 (10 rows, 32–3,072 A100 on Selene) — every row is predicted as
`tracekit predict --batch FILE --csv-out OUT` predicts it with no other flag: the software-stack profile from the row's
`framework`, the hardware from `hardware_gpu`, the cluster preset from `gpus_per_node` + `interconnect`
(predictor.batch). Printed per set: MAPE, median and p90 of the absolute percentage error, per parallel shape
(tp, pp, dp) with the signed bias, and the worst rows; beside it the same rows without any stack constants (the
operator models and the collective physics alone).

What is fitted, and where it is scored: the e2e path holds two fitted numbers, the host constants of the
`megatron-deepspeed-2023` stack profile (host_op_us, microbatch_overhead_us), fitted on vTrain single node by
`--fit-stack` (which writes tracekit/data/stacks/megatron-deepspeed-2023.json). They are scored on vTrain multi
node (same stack, other runs) and on Narayanan (the `megatron-lm-2021` profile takes them from its fork, another
stack and era). On vTrain single node itself the figure is 5-fold cross-validated: each fold's rows are predicted
with the constants fitted on the other four folds (labelled "5-fold CV"). The collective physics constants come
from operator-level nccl samples (benchmarks/collective_physics.py), never from these rows.

Peers, in the same run (`--peers`, after `bash benchmarks/peers/setup.sh`): the seed paper's released tool
(estimate-train-time, trained on the same corpus samples) and llm-analysis (an analytical model from PyPI), each in
its own virtualenv, on the same rows with the same facts (benchmarks/peers/README.md says what each can express).
estimate-train-time takes 2–3 s a row, so it runs on every row of the two small sets and on every
`--ett-stride`-th row of the 727. On the Megatron-core sets (`--only megatron-core --peers`) both peers are given
every row, with the facts those rows add (GQA, MoE, MLA, context parallelism, the GPU's datasheet figures, the
precision recipe): llm-analysis predicts each (its compute-only model, MoE and GQA as its config takes them);
estimate-train-time refuses at once what it cannot express (any GPU but A100, MoE, context parallelism, fp8), which
leaves the dense A100 CI rows. Beside each peer's MAPE is tracekit's on the same rows (the set's headline figure:
cross-validated on CI, leave-one-model-out on Bridge).

llm-foundry (MosaicML's MPT runs, Composer + FSDP; `--only llm-foundry`): every row predicted with the `composer`
stack, whose three scales are fitted on these rows — so the figure is leave-one-model-size-out: each MPT size
predicted with the scales fitted on the other sizes (`--fit-composer` refits on every row and writes the profile);
printed per model size × GPU count.

Megatron-core (`--only megatron-core`): Megatron-LM's own CI runs (megatron_ci_golden: 301 runs of small GPT and
MoE models on DGX A100, DGX H100 and GB200, with their exact launch lines) and NVIDIA's Megatron-Bridge performance
tables (megatron_bridge_perf: Llama 3, DeepSeek-V3, Qwen3, GPT-OSS on H100, B200 and GB200). The `megatron-core`
stack's host constants (host_op_us, microbatch_overhead_us, tensor_op_us) and its host CPU scales (one per host
CPU class besides DGX A100's EPYC: DGX H100's Xeon, Grace) are fitted on the CI rows only: the CI figure is 5-fold
cross-validated by test case (the rows of one test case — its runs on several GPUs and containers — in one fold,
predicted with the constants fitted on the other folds); the Bridge rows, a different set never fitted on, are
predicted with the profile's constants (megatron-bridge takes megatron-core's), as `predict --batch` does.
`--fit-core` refits on every CI row and writes tracekit/data/stacks/megatron-core.json. Printed per model family ×
GPU × precision, with the signed bias.

Hybrid models (`--only hybrid`): Megatron-Bridge's Nemotron 3 Nano rows (megatron_bridge_hybrid.csv: 23 Mamba2, 23
MoE and 6 attention layers, on H100, B200 and GB200), predicted as `predict --batch` predicts them and scored
untouched: nothing is fitted on them (the megatron-bridge profile's constants come from the CI and the other Bridge
rows; the Mamba2 kernels are the roofline of their bytes and FLOPs, predictor.layers.ssm.scan_work). Printed: MAPE,
median and p90, per GPU × precision with the signed bias, the predicted share of the Mamba layers, and how slow they
would have to be to close each row's gap alone (the gap over their predicted time, a bound on what the rows could
say about Mamba's real cost against its roofline), beside the bias of the Bridge table's Qwen3-30B-A3B rows on the
same GPUs and precisions (a transformer of the same size class whose MoE layers take the same path: the share of
the gap that is not Mamba's).

Run: .venv/bin/python benchmarks/e2e_accuracy.py [--models DIR] [--fit-stack] [--fit-composer] [--fit-core]
     [--peers] [--only megatron|llm-foundry|megatron-core|hybrid]
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from extractors import jobs as B  # noqa: E402
from predictor.costs.learned.models import ModelSet  # noqa: E402
from predictor.predict import prepare_many  # noqa: E402
from predictor.sweeps.calibration_fit import (  # noqa: E402
    fit_prepared,
    fit_with_hosts,
    held_out_times_s,
    iteration_times_s,
)
from tracekit.core.atomic import atomic_write_json  # noqa: E402
from tracekit.core.calibration import NONE, device_scaled, host_scaled  # noqa: E402
from tracekit.core.hardware import architecture, hardware_spec  # noqa: E402
from tracekit.core.hosts import host_class  # noqa: E402
from tracekit.core.stacks import stack_path, stacks  # noqa: E402

E2E = ROOT.parent / "shared" / "corpus" / "e2e"
SETS = {
    "vtrain single node": ("vtrain_a100_single_node.csv", "≤ 8%"),
    "vtrain multi node": ("vtrain_a100_multi_node.csv", "≤ 10%"),
    "narayanan 2021": ("narayanan2021_table1_a100_selene.csv", "≤ 6%"),
}
FIT_SET = "vtrain single node"
FIT_STACK = "megatron-deepspeed-2023"
FIT_PARAMS = ("host_op_us", "microbatch_overhead_us")
FOLDS = 5
PEER_TIMEOUT_S = 3600


def load(models, name: str):
    """(rows, prepared graphs, measured s) of one corpus set, parsed as `predict --batch` does."""
    _, cells = B.read_rows(E2E / SETS[name][0])
    rows = [B.parse_row(c, i + 2, None, None) for i, c in enumerate(cells)]
    failed = [r for r in rows if r.error]
    rows = [r for r in rows if not r.error]
    prepared = prepare_many([r.config for r in rows], [r.cluster for r in rows], models)
    keep = [i for i, p in enumerate(prepared) if not isinstance(p, Exception)]
    failed += [r for r, p in zip(rows, prepared) if isinstance(p, Exception)]
    rows, prepared = [rows[i] for i in keep], [prepared[i] for i in keep]
    measured = np.array([float(r.cells["iteration_time_s"]) for r in rows])
    return rows, prepared, measured, failed


def times_with_row_stacks(rows, prepared) -> np.ndarray:
    """Iteration times with each row's own stack constants (what `predict --batch` applies)."""
    return np.array([iteration_times_s([p], r.calibration or NONE)[0] for r, p in zip(rows, prepared)])


def stats(predicted: np.ndarray, measured: np.ndarray) -> tuple[float, float, float]:
    err = np.abs(predicted - measured) / measured
    return 100 * err.mean(), 100 * np.median(err), 100 * np.quantile(err, 0.9)


def shapes(rows, predicted: np.ndarray, measured: np.ndarray, worst: int) -> None:
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
              f"{c.global_batch_size} mb {c.micro_batch_size} tp{c.tp} pp{c.pp} dp{c.dp}: measured "
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


def fit_stack(prepared, measured: np.ndarray):
    return fit_prepared(prepared, measured, FIT_PARAMS, rounds=5)[0]


def update_profile(name: str, fields: dict) -> None:
    """Write `fields` into stack profile `name`'s JSON (its other keys kept), reload the profiles and say so."""
    import json

    path = stack_path(name)
    doc = json.loads(path.read_text())
    doc.update(fields)
    atomic_write_json(path, doc)
    stacks.cache_clear()
    print(f"wrote {path}")


def write_stack(cal, measured_rows: int, cv_mape: float) -> None:
    doc: dict = {}
    doc["constants"] = {k: round(getattr(cal, k), 3) for k in FIT_PARAMS}
    doc["fit"] = {
        "data": f"shared corpus e2e/{SETS[FIT_SET][0]} ({measured_rows} rows; vTrain's measured Megatron-DeepSpeed "
                "iterations, one 8×A100 node)",
        "method": "Gauss–Newton on relative error of predicted vs measured iteration time (tracekit.core.calibration)",
        "params": list(FIT_PARAMS),
        f"mape_{FOLDS}fold_cv_on_fit_set": round(cv_mape, 4),
        "scored_on": ["e2e/vtrain_a100_multi_node.csv", "e2e/narayanan2021_table1_a100_selene.csv "
                      "(through megatron-lm-2021)"],
        "by": "benchmarks/e2e_accuracy.py --fit-stack",
    }
    update_profile(FIT_STACK, doc)


# -- llm-foundry: Composer + PyTorch FSDP (MosaicML's MPT benchmarks) ------------------------------------------------
LLMFOUNDRY = "llmfoundry_mpt_fsdp_a100.csv"
LLMFOUNDRY_GOAL = "≤ 10%"
COMPOSER = "composer"
#: The composer stack's constants, fitted on llm-foundry's rows and scored leave-one-model-size-out: the tensor-core
#: kernels' speed beside the samples' (GEMMs beside FSDP's collectives, A100 40 GB parts), MPT's attention kernel
#: (triton flash attention with ALiBi) beside flash-attention 2, and eager memory-bound kernels (unfused LayerNorm,
#: GeLU, dropout).
COMPOSER_PARAMS = ("compute_scale", "attention_scale", "memory_scale")


def fit_composer(prepared, measured: np.ndarray):
    return fit_prepared(prepared, measured, COMPOSER_PARAMS, rounds=6)[0]


def llmfoundry(models, worst: int, refit: bool) -> tuple:
    """Every llm-foundry row predicted as `predict --batch` predicts it (the composer stack's constants), and the
    same constants fitted leave-one-model-size-out: each model size's rows predicted with the constants fitted on the
    other sizes. Prints MAPE, median and p90, and a table per model size × GPU count."""
    _, cells = B.read_rows(E2E / LLMFOUNDRY)
    rows = [B.parse_row(c, i + 2, None, None) for i, c in enumerate(cells)]
    failed = [r for r in rows if r.error]
    good = [r for r in rows if not r.error]
    prepared = prepare_many([r.config for r in good], [r.cluster for r in good], models)
    failed += [r for r, p in zip(good, prepared) if isinstance(p, Exception)]
    keep = [i for i, p in enumerate(prepared) if not isinstance(p, Exception)]
    good, prepared = [good[i] for i in keep], [prepared[i] for i in keep]
    measured = np.array([float(r.cells["iteration_time_s"]) for r in good])
    sizes = [r.cells["model_name"] for r in good]
    names = sorted(set(sizes), key=lambda n: float(re.sub(r"[^0-9.]", "", n)) * (1e-3 if n.lower().endswith("m")
                                                                                    else 1.0))
    fold = np.array([names.index(n) for n in sizes])
    held_out = held_out_times_s(prepared, measured, fold, fit_composer)
    shipped = times_with_row_stacks(good, prepared)
    bare = iteration_times_s(prepared, NONE)
    print(f"\n== llm-foundry ({LLMFOUNDRY}): {len(good)} rows predicted, {len(failed)} not; stacks "
          f"{sorted({r.stack.name for r in good})}, clusters {sorted({r.cluster.name for r in good})}")
    for r in failed:
        print(f"  not predicted: line {r.line}: {r.error}")
    cv = stats(held_out, measured)
    ship = stats(shipped, measured)
    print(f"  composer constants fitted leave-one-model-size-out: MAPE {cv[0]:.2f}% (median {cv[1]:.2f}%, "
          f"p90 {cv[2]:.2f}%); goal {LLMFOUNDRY_GOAL}")
    print(f"  shipped composer constants (fitted on every row): MAPE {ship[0]:.2f}% (median {ship[1]:.2f}%, "
          f"p90 {ship[2]:.2f}%)")
    print(f"  without stack constants: MAPE {stats(bare, measured)[0]:.2f}%")
    compiled_what_if(models, good, shipped, measured)
    groups: dict[tuple[str, int], list[int]] = {}
    for i, r in enumerate(good):
        groups.setdefault((r.cells["model_name"], r.config.world_size), []).append(i)
    print(f"  {'model':<9} {'GPUs':>5} {'rows':>5} {'MAPE %':>8} {'bias %':>8}  (leave-one-model-size-out)")
    for name in names:
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
    if refit:
        write_composer(fit_composer(prepared, measured), len(good), cv[0] / 100, len(names))
    return ("llm-foundry", len(good), len(failed), "composer constants leave-one-model-size-out", *cv,
            stats(bare, measured)[0], LLMFOUNDRY_GOAL, [])


def compiled_what_if(models, good: list, shipped: np.ndarray, measured: np.ndarray) -> None:
    """The same rows as if each had compiled its blocks (`torch_compile`, predictor.layers.compile_fusion; the rows
    state no compile: MosaicML's benchmarks ran eager), with the shipped composer constants: what compile changes."""
    rows = [B.parse_row(r.cells, r.line, None, None, {"torch_compile": True}) for r in good]
    prepared = prepare_many([r.config for r in rows], [r.cluster for r in rows], models)
    times = times_with_row_stacks(rows, prepared)
    change = 100 * (times - shipped) / shipped
    print(f"  as if compiled (torch_compile on every row, shipped constants): MAPE {stats(times, measured)[0]:.2f}%; "
          f"predicted time {np.median(change):+.1f}% median ({change.min():+.1f}% to {change.max():+.1f}%)")


def write_composer(cal, rows: int, cv_mape: float, sizes: int) -> None:
    doc: dict = {}
    doc["constants"] = {k: round(getattr(cal, k), 4) for k in COMPOSER_PARAMS}
    doc["fit"] = {
        "data": f"shared corpus e2e/{LLMFOUNDRY} ({rows} rows; MosaicML's MPT 125M-70B benchmarks, Composer + FSDP "
                "FULL_SHARD on A100 40/80 GB, 8-512 GPUs)",
        "method": "Gauss–Newton on relative error of predicted vs measured iteration time (tracekit.core.calibration)",
        "params": list(COMPOSER_PARAMS),
        f"mape_leave_one_model_size_out_{sizes}_sizes": round(cv_mape, 4),
        "by": "benchmarks/e2e_accuracy.py --fit-composer",
    }
    update_profile(COMPOSER, doc)


# -- Megatron-core: Megatron-LM's CI runs and Megatron-Bridge's performance tables -----------------------------------
CI = "megatron_ci_golden.csv"
CI_GOAL = "≤ 20%"
BRIDGE = "megatron_bridge_perf.csv"
BRIDGE_GOAL = "≤ 12%"
CORE = "megatron-core"
#: The megatron-core stack's host constants (per graph op, per micro-batch call, per parameter tensor a
#: per-parameter pass visits) and the host CPU its runs' scales are relative to (DGX A100's).
CORE_PARAMS = ("host_op_us", "microbatch_overhead_us", "tensor_op_us")
CORE_REFERENCE_HOST = "amd-zen2"


def load_rows(models, file: str):
    """(rows, prepared graphs, measured s, rows not predicted) of a corpus file, parsed as `predict --batch` does."""
    _, cells = B.read_rows(E2E / file)
    rows = [B.parse_row(c, i + 2, None, None) for i, c in enumerate(cells)]
    failed = [r for r in rows if r.error]
    good = [r for r in rows if not r.error]
    prepared = prepare_many([r.config for r in good], [r.cluster for r in good], models)
    failed += [r for r, p in zip(good, prepared) if isinstance(p, Exception)]
    for r, p in zip(good, prepared):
        if isinstance(p, Exception):
            r.error = str(p)
    keep = [i for i, p in enumerate(prepared) if not isinstance(p, Exception)]
    good, prepared = [good[i] for i in keep], [prepared[i] for i in keep]
    return good, prepared, np.array([float(r.cells["iteration_time_s"]) for r in good]), failed


def fit_core(prepared, measured: np.ndarray, hosts: list[str]):
    """(calibration on the reference host, {host class: scale}) fitted on CI rows."""
    cal, scales, _ = fit_with_hosts(prepared, measured, hosts, CORE_PARAMS, CORE_REFERENCE_HOST, rounds=5)
    return cal, scales


def host_of(row) -> str:
    return host_class(row.cluster.hardware) or CORE_REFERENCE_HOST


def test_case(row) -> str:
    """A CI row's test case: the directory of its golden-values file (`row_ref`)."""
    return row.cells["row_ref"].split("/")[0]


def case_folds(rows, folds: int = FOLDS) -> np.ndarray:
    """Fold of each row: its test case's, the cases dealt to `folds` folds in a seeded random order."""
    cases = sorted({test_case(r) for r in rows})
    order = np.random.default_rng(0).permutation(len(cases))
    fold_of = {case: int(order[i]) % folds for i, case in enumerate(cases)}
    return np.array([fold_of[test_case(r)] for r in rows])


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


def _not_predicted(failed) -> None:
    for r in failed:
        print(f"  not predicted: line {r.line}: {r.error}")


def megatron_ci(models, worst: int, refit: bool, peer_stride: int | None = None) -> tuple:
    """The CI rows with the megatron-core constants fitted by test-case 5-fold cross-validation (module docstring);
    with `peer_stride` the peers too, on the same rows (estimate-train-time on every `peer_stride`-th), beside the
    cross-validated figure."""
    rows, prepared, measured, failed = load_rows(models, CI)
    hosts = [host_of(r) for r in rows]
    folds = case_folds(rows)
    held_out = np.empty(len(rows))
    print(f"\n== megatron ci golden ({CI}): {len(rows)} rows predicted, {len(failed)} not; {len(set(folds))} folds "
          f"over {len({test_case(r) for r in rows})} test cases; stacks {sorted({r.stack.name for r in rows})}, "
          f"clusters {sorted({r.cluster.name for r in rows})}, models {sorted({p[0].hardware for p in prepared})}")
    _not_predicted(failed)
    for k in sorted(set(folds)):
        train, test = np.flatnonzero(folds != k), np.flatnonzero(folds == k)
        cal, scales = fit_core([prepared[i] for i in train], measured[train], [hosts[i] for i in train])
        print(f"  fold {k}: {', '.join(f'{p} {getattr(cal, p):.1f}' for p in CORE_PARAMS)}; host scales "
              f"{', '.join(f'{h} {v:.2f}' for h, v in scales.items())}")
        for i in test:
            held_out[i] = iteration_times_s([prepared[i]], host_scaled(cal, scales.get(hosts[i], 1.0)))[0]
    cv = stats(held_out, measured)
    shipped = stats(times_with_row_stacks(rows, prepared), measured)
    bare = stats(iteration_times_s(prepared, NONE), measured)[0]
    label = "megatron-core constants, 5-fold CV by test case"
    print(f"  {label}: MAPE {cv[0]:.2f}% (median {cv[1]:.2f}%, p90 {cv[2]:.2f}%); goal {CI_GOAL}")
    print(f"  shipped megatron-core constants (fitted on every CI row): MAPE {shipped[0]:.2f}%")
    print(f"  without stack constants: MAPE {bare:.2f}%")
    groups_table(rows, held_out, measured, _family_gpu_precision, "family × GPU × precision (CV)", worst)
    if refit:
        cal, scales = fit_core(prepared, measured, hosts)
        write_core(cal, scales, len(rows), len({test_case(r) for r in rows}), cv[0] / 100)
    peers = run_peers(rows, measured, held_out, peer_stride) if peer_stride else []
    print_peers(peers)
    return ("megatron ci golden", len(rows), len(failed), label, *cv, bare, CI_GOAL, peers)


def bridge_model(row) -> str:
    """The model a Bridge row trains (its variants — w/ or w/o MTP, token-drop — are the same model)."""
    return (row.cells.get("model_name") or "?").split(" (")[0]


def arch_of(row) -> str:
    return architecture(row.cluster.hardware) or "?"


def undeviced(row) -> object:
    """A row's stack calibration without the profile's device scale (what the device fit multiplies)."""
    stack = row.stack  # an empty device_scale would take the default stack's: name the row's architecture at 1
    return dataclasses.replace(stack, device_scale={arch_of(row): 1.0}).calibration(row.cluster.hardware)


def fit_devices(prepared, measured: np.ndarray, rows, archs: list[str]) -> dict[str, float]:
    """One tensor-core scale per GPU architecture (`Stack.device_scale`), from the dense models' rows, whose time the
    tensor-core ops dominate (an MoE row's error has other causes: routing, dispatch, host time): for each
    architecture, the scale whose predictions of its dense rows have the least mean absolute relative error
    (golden-section search on [0.5, 3]); an architecture without dense rows keeps 1."""
    out = {}
    for arch in sorted(set(archs)):
        idx = [i for i, a in enumerate(archs) if a == arch and rows[i].config.moe is None]
        if not idx:
            continue
        bases = [undeviced(rows[i]) for i in idx]

        def mape(scale: float, idx=idx, bases=bases) -> float:
            t = np.array([iteration_times_s([prepared[i]], device_scaled(b, scale))[0] for i, b in zip(idx, bases)])
            return float(np.mean(np.abs(t - measured[idx]) / measured[idx]))

        lo, hi = 0.5, 3.0
        golden = (np.sqrt(5) - 1) / 2
        a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
        fa, fb = mape(a), mape(b)
        for _ in range(24):
            if fa < fb:
                hi, b, fb = b, a, fa
                a = hi - golden * (hi - lo)
                fa = mape(a)
            else:
                lo, a, fa = a, b, fb
                b = lo + golden * (hi - lo)
                fb = mape(b)
        out[arch] = round((lo + hi) / 2, 3)
    return out


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


def megatron_bridge(models, worst: int, refit: bool = False, peer_stride: int | None = None) -> tuple:
    """The Megatron-Bridge rows: host constants fitted on CI rows only; the per-architecture device scales of the
    shipped profile, and here leave-one-model-out (each model's rows predicted with scales fitted on the others);
    with `peer_stride` the peers too, beside the leave-one-model-out figure."""
    rows, prepared, measured, failed = load_rows(models, BRIDGE)
    print(f"\n== megatron bridge perf ({BRIDGE}): {len(rows)} rows predicted, {len(failed)} not; stacks "
          f"{sorted({r.stack.name for r in rows})}, clusters {sorted({r.cluster.name for r in rows})}, models "
          f"{sorted({p[0].hardware for p in prepared})}")
    _not_predicted(failed)
    archs = [arch_of(r) for r in rows]
    names = np.array([bridge_model(r) for r in rows])
    held_out = np.empty(len(rows))
    for name in sorted(set(names)):
        train, test = np.flatnonzero(names != name), np.flatnonzero(names == name)
        scales = fit_devices([prepared[i] for i in train], measured[train], [rows[i] for i in train],
                             [archs[i] for i in train])
        print(f"  without {name}: device scales {scales}")
        for i in test:
            held_out[i] = iteration_times_s([prepared[i]], device_scaled(undeviced(rows[i]),
                                                                         scales.get(archs[i], 1.0)))[0]
    figure = stats(held_out, measured)
    shipped = stats(times_with_row_stacks(rows, prepared), measured)
    ci_only = stats(np.array([iteration_times_s([p], undeviced(r))[0] for r, p in zip(rows, prepared)]), measured)
    bare = stats(iteration_times_s(prepared, NONE), measured)[0]
    label = "host constants fitted on CI, device scales leave-one-model-out"
    print(f"  {label}: MAPE {figure[0]:.2f}% (median {figure[1]:.2f}%, p90 {figure[2]:.2f}%); goal {BRIDGE_GOAL}")
    print(f"  shipped profile (device scales fitted on every Bridge row): MAPE {shipped[0]:.2f}%")
    print(f"  host constants fitted on CI only, no device scale: MAPE {ci_only[0]:.2f}%")
    print(f"  without stack constants: MAPE {bare:.2f}%")
    groups_table(rows, held_out, measured, _model_gpu_precision, "model × GPU × precision (leave-one-model-out)",
                 worst)
    container_twins(rows, held_out, measured)
    if refit:
        write_devices(fit_devices(prepared, measured, rows, archs), len(rows), figure[0] / 100)
    peers = run_peers(rows, measured, held_out, peer_stride) if peer_stride else []
    print_peers(peers)
    return ("megatron bridge perf", len(rows), len(failed), label, *figure, bare, BRIDGE_GOAL, peers)


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
    """The hybrid rows as `predict --batch` predicts them (the row's stack, nothing fitted on them)."""
    rows, prepared, measured, failed = load_rows(models, HYBRID)
    print(f"\n== hybrid models ({HYBRID}): {len(rows)} rows predicted, {len(failed)} not; stacks "
          f"{sorted({r.stack.name for r in rows})}, clusters {sorted({r.cluster.name for r in rows})}, models "
          f"{sorted({p[0].hardware for p in prepared})}")
    _not_predicted(failed)
    predicted = times_with_row_stacks(rows, prepared)
    figure = stats(predicted, measured)
    bare = stats(iteration_times_s(prepared, NONE), measured)[0]
    label = "megatron-bridge profile, nothing fitted on these rows"
    print(f"  {label}: MAPE {figure[0]:.2f}% (median {figure[1]:.2f}%, p90 {figure[2]:.2f}%); goal {HYBRID_GOAL}")
    print(f"  without stack constants: MAPE {bare:.2f}%")
    groups_table(rows, predicted, measured, lambda r: (r.cells["hardware_gpu"], r.config.precision),
                 "GPU × precision", worst)
    print(f"  {'row':<36} {'Mamba share %':>13} {'Mamba × to close the gap':>25}")
    for r, p, t, meas in zip(rows, prepared, predicted, measured):
        mamba = block_seconds(p, r.calibration or NONE, "mamba")
        name = f"line {r.line}: {r.cells['hardware_gpu']} {r.config.precision}"
        print(f"  {name:<36} {100 * mamba / t:>13.1f} {(mamba + meas - t) / mamba:>25.2f}")
    control, c_prepared, c_measured, _ = load_rows(models, BRIDGE)
    keep = [i for i, r in enumerate(control) if bridge_model(r).lower().startswith("qwen3_30b")]
    c_predicted = times_with_row_stacks([control[i] for i in keep], [c_prepared[i] for i in keep])
    groups_table([control[i] for i in keep], c_predicted, c_measured[keep],
                 lambda r: (r.cells["hardware_gpu"], r.config.precision),
                 "control: Qwen3-30B-A3B (Bridge table), GPU × precision", 0)
    return ("hybrid (Nano)", len(rows), len(failed), label, *figure, bare, HYBRID_GOAL, [])


def write_devices(scales: dict[str, float], rows: int, lomo_mape: float) -> None:
    doc: dict = {}
    doc["device_scale"] = dict(sorted(scales.items()))
    doc["device_fit"] = {
        "data": f"shared corpus e2e/{BRIDGE} ({rows} rows: Llama 3 8B/70B, DeepSeek-V3, Qwen3-30B-A3B, GPT-OSS-120B on "
                "H100, B200 and GB200), with the host constants fitted on the CI rows",
        "method": "per GPU architecture, the scale of the tensor-core ops (GEMM, bmm, attention) minimising the mean "
                  "absolute relative error of that architecture's dense-model rows (golden-section search)",
        "mape_leave_one_model_out": round(lomo_mape, 4),
        "by": "benchmarks/e2e_accuracy.py --fit-devices",
    }
    update_profile(CORE, doc)


def write_core(cal, scales: dict[str, float], rows: int, cases: int, cv_mape: float) -> None:
    doc: dict = {}
    doc["constants"] = {k: round(getattr(cal, k), 3) for k in CORE_PARAMS}
    doc["host_scale"] = {h: round(v, 4) for h, v in sorted(scales.items())}
    doc["fit"] = {
        "data": f"shared corpus e2e/{CI} ({rows} rows, {cases} test cases; Megatron-LM's CI functional-test runs on "
                "DGX A100, DGX H100 and GB200)",
        "method": "Gauss–Newton on relative error of predicted vs measured iteration time, the constants on DGX "
                  "A100's host CPU and one scale of them per other host CPU (predictor.sweeps.calibration_fit."
                  "fit_with_hosts)",
        "params": list(CORE_PARAMS),
        "reference_host": CORE_REFERENCE_HOST,
        f"mape_{FOLDS}fold_cv_by_test_case": round(cv_mape, 4),
        "scored_on": [f"e2e/{BRIDGE} (through megatron-bridge; never fitted on)"],
        "by": "benchmarks/e2e_accuracy.py --fit-core",
    }
    doc["description"] = ("Megatron-core (2024+) with Transformer Engine: flash/fused attention kernels, TE's fused "
                          "RMSNorm and (Megatron-LM's argument default) fused RoPE, interleaved-schedule P2P "
                          "overlapped (Megatron's default), gradient-reduce, parameter-gather and TP overlap off "
                          "unless the configuration turns them on (Megatron's own defaults). Host "
                          "constants fitted on Megatron-LM's CI runs: host time per operator, per micro-batch call "
                          "and per parameter tensor of the per-parameter passes, scaled per host CPU; tensor-core "
                          "ops scaled per GPU architecture (device_scale, fitted on the Megatron-Bridge rows' dense "
                          "models).")
    update_profile(CORE, doc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="model directory (default: bundled)")
    parser.add_argument("--fit-stack", action="store_true",
                        help=f"refit {FIT_STACK}'s host constants on {FIT_SET} and write its profile first")
    parser.add_argument("--fit-composer", action="store_true",
                        help=f"refit the {COMPOSER} stack's constants on every llm-foundry row and write its profile")
    parser.add_argument("--fit-core", action="store_true",
                        help=f"refit the {CORE} stack's host constants on every CI row and write its profile")
    parser.add_argument("--fit-devices", action="store_true",
                        help=f"refit the {CORE} stack's device scales on every Bridge row and write its profile")
    parser.add_argument("--only", choices=("megatron", "llm-foundry", "megatron-core", "hybrid"), default=None,
                        help="run one part only (default: all)")
    parser.add_argument("--worst", type=int, default=5)
    parser.add_argument("--peers", action="store_true", help="also run the peer predictors on the same rows")
    parser.add_argument("--ett-stride", type=int, default=10,
                        help="estimate-train-time predicts every Nth row of the Megatron sets larger than 100 rows "
                             "(default 10); the Megatron-core sets give it every row (it refuses all but ~133 at once)")
    args = parser.parse_args()
    models = ModelSet.load(args.models)
    print(f"models: {models.path} ({', '.join(models.hardware_ids())})")
    summary = []
    for name, (file, goal) in (SETS.items() if args.only in (None, "megatron") else ()):
        t0 = time.perf_counter()
        rows, prepared, measured, failed = load(models, name)
        seconds = time.perf_counter() - t0
        stacks_used = sorted({r.stack.name for r in rows})
        clusters = sorted({r.cluster.name for r in rows})
        print(f"\n== {name} ({file}): {len(rows)} rows predicted, {len(failed)} not, in {seconds:.1f} s; "
              f"stacks {stacks_used}, clusters {clusters}, models {sorted({p[0].hardware for p in prepared})}")
        bare = iteration_times_s(prepared, NONE)
        label = "defaults"
        if name == FIT_SET:
            fold = np.random.default_rng(0).permutation(len(rows)) % FOLDS
            predicted = held_out_times_s(prepared, measured, fold, fit_stack)
            label = f"defaults, stack constants {FOLDS}-fold CV"
            if args.fit_stack:
                write_stack(fit_stack(prepared, measured), len(rows), stats(predicted, measured)[0] / 100)
        else:
            predicted = times_with_row_stacks(rows, prepared)
        mape, median, p90 = stats(predicted, measured)
        bare_mape = stats(bare, measured)[0]
        print(f"  {label}: MAPE {mape:.2f}% (median {median:.2f}%, p90 {p90:.2f}%); goal {goal}")
        print(f"  without stack constants: MAPE {bare_mape:.2f}%")
        shapes(rows, predicted, measured, args.worst)
        peers = run_peers(rows, measured, predicted, args.ett_stride if len(rows) > 100 else 1) if args.peers else []
        print_peers(peers)
        summary.append((name, len(rows), len(failed), label, mape, median, p90, bare_mape, goal, peers))
    if args.only in (None, "llm-foundry"):
        summary.append(llmfoundry(models, args.worst, args.fit_composer))
    if args.only in (None, "megatron-core"):
        # estimate-train-time refuses every row but the dense A100 ones at once (benchmarks/peers/README.md): it is
        # given every row of both sets
        stride = 1 if args.peers else None
        summary.append(megatron_ci(models, args.worst, args.fit_core, stride))
        summary.append(megatron_bridge(models, args.worst, args.fit_devices, stride))
    if args.only in (None, "hybrid"):
        summary.append(hybrid_models(models, args.worst))
    print(f"\n{'set':<20} {'rows':>5} {'failed':>6} {'MAPE %':>7} {'median %':>8} {'p90 %':>6} "
          f"{'no stack constants %':>20}  goal   (figure)")
    for name, n, bad, label, mape, median, p90, bare, goal, _ in summary:
        print(f"{name:<20} {n:>5} {bad:>6} {mape:>7.2f} {median:>8.2f} {p90:>6.2f} {bare:>20.2f}  {goal:<6} ({label})")
    if args.peers:
        names = next((tuple(p[0] for p in peers) for *_, peers in summary if peers), ())
        print(f"\n{'set':<20} {'tracekit MAPE %':>15} " + " ".join(f"{p + ' MAPE % (rows; tracekit on them)':>44}"
                                                              for p in names))
        for name, n, _, _, mape, *_, peers in summary:
            if not peers:
                continue
            cells = [f"{'—' if m is None else f'{m:.2f}'} ({k}{'' if same is None else f'; {same:.2f}'})"
                     for _, k, m, _, same in peers]
            print(f"{name:<20} {mape:>15.2f} " + " ".join(f"{c:>44}" for c in cells))


if __name__ == "__main__":
    main()
