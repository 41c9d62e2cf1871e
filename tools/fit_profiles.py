"""Regenerate every shipped fitted number from the corpus: `make profiles` (this script, no arguments).

One stage per fitted file, in this order (a later stage predicts with what an earlier one wrote):

- gemm-rates → tracekit/data/gemm_rates.json: what each GPU's GEMMs achieve, from the corpus's matmul tables and
  samples (tools/fit_gemm_rates.py; hardware facts, no end-to-end row);
- kernel-paths → tracekit/data/kernel_paths.json: the A100 GEMM kernels of kineto/hta (benchmarks/fit_kernel_paths.py);
- transfer → tracekit/data/transfer.json: the seed paper's A100 and GH200 samples, leave-one-GPU-out
  (tools/transfer_selection.py);
- sustained-gemm → tracekit/data/sustained_gemm.json: the A100's sustained GEMM ceiling, e2e/vtrain_a100_multi_node.csv
  (tools/fit_sustained_gemm.py), and Hopper's over it, e2e/megatron_bridge_perf.csv's dense H100 rows
  (tools/fit_hopper_ceiling.py; hardware facts, which the stack stages below predict with);
- megatron-deepspeed-2023 → tracekit/data/stacks/megatron-deepspeed-2023.json: e2e/vtrain_a100_single_node.csv;
- megatron-core → tracekit/data/stacks/megatron-core.json (host constants, host CPU scales): e2e/megatron_ci_golden.csv;
- megatron-bridge → tracekit/data/stacks/megatron-bridge.json (device_scale, its own): e2e/megatron_bridge_perf.csv;
- composer → tracekit/data/stacks/composer.json: e2e/llmfoundry_mpt_fsdp_a100.csv.

(tools/stack_fits.py says how each stack constant is fitted and held out.) Each stage runs in a fresh Python process,
so that nothing an earlier stage loaded (cached profiles, estimates, models) stands in for what it wrote. Every fit
is deterministic: run twice on the same tree, the command writes the same bytes. Then every fitted file gets the
fingerprint of the code, data and corpus files the stages read, and `tracekit/data/fitted.json` the digest of each
input and each file written (tools/profile_fingerprint.py); the suite fails when the tree no longer matches it.

Usage: .venv/bin/python tools/fit_profiles.py [--check] [--corpus DIR]
(`--check`: compare the tree with the manifest only, as the suite does; exit 1 with the reasons when it differs.)
Takes about 4 minutes of CPU (3 min 40 s on a 2-core machine, up to 9.5 min while other jobs load it); each
stage prints its time.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools import profile_fingerprint as fp  # noqa: E402
from tracekit.core.atomic import atomic_write_json  # noqa: E402

#: stage → the files it writes.
STAGES = {
    "gemm-rates": ("tracekit/data/gemm_rates.json",),
    "kernel-paths": ("tracekit/data/kernel_paths.json",),
    "transfer": ("tracekit/data/transfer.json",),
    "sustained-gemm": ("tracekit/data/sustained_gemm.json",),
    "megatron-deepspeed-2023": ("tracekit/data/stacks/megatron-deepspeed-2023.json",),
    "megatron-core": ("tracekit/data/stacks/megatron-core.json",),
    "megatron-bridge": ("tracekit/data/stacks/megatron-bridge.json",),
    "composer": ("tracekit/data/stacks/composer.json",),
}


def update_profile(name: str, fields: dict) -> Path:
    """Write `fields` into stack profile `name`'s JSON, its other keys kept."""
    from tracekit.core.stacks import stack_path

    path = stack_path(name)
    doc = json.loads(path.read_text())
    doc.update(fields)
    atomic_write_json(path, doc)
    return path


def run_stage(name: str) -> tuple[list[str], list[str]]:
    """Fit and write one stage; returns (what to print, the corpus files it read, relative to the corpus)."""
    corpus = fp.corpus_root()
    if name == "gemm-rates":
        from tools.fit_gemm_rates import fit as fit_rates

        doc, lines, read = fit_rates(corpus)
        atomic_write_json(ROOT / STAGES[name][0], doc)
        return lines, read
    if name == "kernel-paths":
        from benchmarks.fit_kernel_paths import TRACES, fit

        doc, lines = fit(corpus)
        atomic_write_json(ROOT / STAGES[name][0], doc)
        return lines, [f"kineto/hta/{t}" for t in TRACES]
    from predictor.costs.learned.models import ModelSet

    models = ModelSet.load()
    if name == "sustained-gemm":
        from tools.fit_sustained_gemm import fit as fit_ceiling

        doc, lines, read = fit_ceiling(models)
        atomic_write_json(ROOT / STAGES[name][0], doc)
        return lines, read
    if name == "transfer":
        from extractors import ett
        from tools.transfer_selection import selection

        root = corpus / "operator-samples" / "estimate-train-time"
        doc = selection(models, root)
        atomic_write_json(ROOT / STAGES[name][0], doc)
        used = sorted(p for p, e in doc["primitives"].items() if e["use"])
        return [f"transfer path for: {', '.join(used)}"], [Path(p).relative_to(corpus).as_posix()
                                                             for p in ett.list_files(root)]
    from tools import stack_fits as sf

    file, fields_of = sf.FITS[name]
    data = sf.load_set(models, file)
    fields = fields_of(data)
    update_profile(name, fields)
    shown = {k: v for k, v in fields.items() if k not in ("fit", "device_fit")}
    held = (fields.get("fit") or fields.get("device_fit") or {}).get("held_out", {})
    return [f"{shown}; held out ({held.get('how')}): MAPE {100 * held.get('mape', float('nan')):.2f}%"], \
        [f"e2e/{file}"]


def stage_main(name: str, report: str) -> None:
    """One stage in this process: fit, write, and report the repository modules it imported and the corpus files it
    read (JSON at `report`)."""
    start = time.perf_counter()
    lines, corpus = run_stage(name)
    files = [Path(f).resolve() for m in list(sys.modules.values()) if (f := getattr(m, "__file__", None))]
    modules = sorted({f.relative_to(ROOT).as_posix() for f in files
                      if f.is_relative_to(ROOT) and ".venv" not in f.relative_to(ROOT).parts})
    Path(report).write_text(json.dumps({"lines": lines, "corpus": corpus, "modules": modules,
                                        "seconds": time.perf_counter() - start}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare the tree with tracekit/data/fitted.json")
    parser.add_argument("--corpus", help="the corpus folder (default: $TRACEKIT_CORPUS, else ../shared/corpus)")
    parser.add_argument("--stage", choices=list(STAGES), help=argparse.SUPPRESS)
    parser.add_argument("--report", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.corpus:
        os.environ["TRACEKIT_CORPUS"] = str(Path(args.corpus).resolve())
    if args.check:
        found = fp.problems()
        print("\n".join(found) if found else f"the fitted files are what `{fp.COMMAND}` makes from this tree")
        sys.exit(1 if found else 0)
    if args.stage:
        stage_main(args.stage, args.report)
        return
    if not (fp.corpus_root() / "e2e").is_dir():
        parser.error(f"{fp.corpus_root()}: not the corpus (no e2e/ folder; set TRACEKIT_CORPUS or --corpus)")
    start = time.perf_counter()
    code: set[str] = set()
    corpus: set[str] = set()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    with tempfile.TemporaryDirectory() as tmp:
        for name in STAGES:
            report = Path(tmp) / f"{name}.json"
            done = subprocess.run([sys.executable, __file__, "--stage", name, "--report", str(report)], env=env,
                                  cwd=ROOT)
            if done.returncode:
                sys.exit(f"make profiles: stage {name} failed (exit {done.returncode}); the files of the stages "
                         "before it are rewritten, the manifest is not: run it again once fixed")
            got = json.loads(report.read_text())
            code.update(got["modules"])
            corpus.update(got["corpus"])
            print(f"{name} ({got['seconds']:.0f} s): " + "\n  ".join(got["lines"]), flush=True)
    code = (code | {Path(__file__).relative_to(ROOT).as_posix()}) - {fp.CHECKER}  # the checker changes no number
    inputs = fp.digests(sorted(code), fp.data_inputs(), sorted(corpus))
    doc = fp.manifest(inputs)
    outputs = sorted({p for files in STAGES.values() for p in files})
    assert set(outputs) == set(fp.OUTPUTS), "tools/profile_fingerprint.OUTPUTS must list what the stages write"
    for path in outputs:
        fitted = json.loads((ROOT / path).read_text())
        fitted["fingerprint"] = doc["fingerprint"]
        atomic_write_json(ROOT / path, fitted)
    doc["outputs"] = {p: fp.file_digest(ROOT / p) for p in outputs}
    atomic_write_json(fp.MANIFEST, doc)
    print(f"wrote {', '.join(outputs)} and {fp.MANIFEST.relative_to(ROOT)} (fingerprint {doc['fingerprint']}) in "
          f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
