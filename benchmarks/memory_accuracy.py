"""Memory per GPU as `tracekit predict` gives it, against GPU memory measured on real runs.

Megatron-LM's CI runs (../shared/corpus/e2e/megatron_ci_golden.csv, 301 runs on DGX A100, DGX H100 and GB200) log
`mem-allocated-bytes` and `mem-max-allocated-bytes`: PyTorch's caching-allocator counters (`allocated_bytes.all`
current and peak) on the job's last rank — the last pipeline stage — at each logged step
(megatron/training/training.py, `--log-memory-to-tensorboard`). Current allocation at the log point, after the
optimizer step, is what stays between iterations (weights, gradients, optimizer state); the peak adds the
activations and the transient tensors of forward, loss and backward; both hold the GEMM libraries' workspaces
(predictor.memory.workspaces). For each run the last stage's figures
(`predictor.memory.stages.stage_memory`) are scored against them: MAPE, median, p90 and signed bias, per model family,
precision, recompute and model size, and the worst runs. Nothing is fitted on these rows: the memory model is the
frameworks' facts (module docstring of predictor/memory/stages.py).

Every other corpus set is a run that ran, so each fits on its GPU: the rows predicted to need more than the GPU's
memory are counted and listed (a physical bound, not a measurement of the peak).

    .venv/bin/python benchmarks/memory_accuracy.py            # ~20 s
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from extractors.jobs.rows import parse_row  # noqa: E402
from extractors.jobs.table import read_rows  # noqa: E402
from predictor.memory.stages import config_memory, stage_memory  # noqa: E402
from tracekit.core.hardware import hardware_spec  # noqa: E402

GB = 1e9
CI = "megatron_ci_golden.csv"


def _stats(errors: list[float]) -> str:
    a = sorted(abs(e) for e in errors)
    p90 = a[min(len(a) - 1, int(0.9 * len(a)))]
    return (f"MAPE {100 * statistics.mean(a):5.1f}%  median {100 * statistics.median(a):5.1f}%  "
            f"p90 {100 * p90:5.1f}%  bias {100 * statistics.mean(errors):+6.1f}%")


def ci_rows(corpus: Path) -> list[dict]:
    """Each CI run's measured and predicted memory of its last pipeline stage (GB)."""
    _, rows = read_rows(corpus / "e2e" / CI)
    out = []
    for line, cells in enumerate(rows, start=2):
        row = parse_row(cells, line, None, None)
        if row.config is None:
            raise SystemExit(f"{CI}:{line}: {row.error}")
        c = row.config
        last = stage_memory(c, row.cluster.hardware if row.cluster else None)[-1]
        static = last["weights"] + last["gradients"] + last["optimizer_state"] + last["workspaces"]
        out.append({
            "run": cells["row_ref"].split("/")[0], "gpu": cells["hardware_gpu"],
            "family": "MoE" if c.moe is not None else "dense",
            "precision": cells["precision"].split(" ")[0],
            "recompute": cells["activation_recompute"].split(" ")[0],
            "size": "hidden ≥ 1024" if c.hidden_size >= 1024 else "hidden < 1024",
            "static": static, "static_measured": float(cells["mem_allocated_bytes"]) / GB,
            "peak": last["total"], "peak_measured": float(cells["mem_max_allocated_bytes"]) / GB,
        })
    return out


def report_ci(rows: list[dict], worst: int) -> None:
    print(f"Megatron-LM CI runs, last pipeline stage, {len(rows)} runs "
          "(predicted vs PyTorch's allocator counters on the last rank)")
    static = [(r["static"] - r["static_measured"]) / r["static_measured"] for r in rows]
    peak = [(r["peak"] - r["peak_measured"]) / r["peak_measured"] for r in rows]
    print(f"  {'between steps (weights, grads, optimizer, workspaces)':52s} {_stats(static)}")
    print(f"  {'peak':52s} {_stats(peak)}")
    for key in ("family", "precision", "recompute", "size"):
        groups: dict[str, list[float]] = defaultdict(list)
        for r, e in zip(rows, peak):
            groups[r[key]].append(e)
        for name, errors in sorted(groups.items()):
            print(f"  {'peak, ' + key + ' ' + name:44s} n={len(errors):3d}  {_stats(errors)}")
    print(f"  worst {worst} peaks:")
    ranked = sorted(zip(rows, peak), key=lambda pair: -abs(pair[1]))
    for r, e in ranked[:worst]:
        print(f"    {r['run'][:64]:64s} {r['gpu'][:14]:14s} predicted {r['peak']:6.2f} GB, measured "
              f"{r['peak_measured']:6.2f} GB ({100 * e:+.0f}%)")


def report_fits(corpus: Path) -> None:
    print("\nRuns that ran, so fit on their GPU: rows predicted to need more than the GPU's memory")
    for path in sorted((corpus / "e2e").glob("*.csv")):
        _, rows = read_rows(path)
        predicted, over = 0, []
        for line, cells in enumerate(rows, start=2):
            row = parse_row(cells, line, None, None)
            if row.config is None or row.cluster is None:
                continue
            predicted += 1
            memory, _ = config_memory(row.config, row.cluster.hardware)
            spec = hardware_spec(row.cluster.hardware)
            if spec is not None and memory["total"] > spec.memory_gb:
                name = cells.get("model_name") or cells.get("row_ref", "")
                over.append(f"{name[:28]} ({cells.get('precision', '')[:10]}) {memory['total']:.1f} of "
                            f"{spec.memory_gb:g} GB")
        print(f"  {path.name:40s} {len(over):3d} of {predicted}")
        for text in over:
            print(f"    {text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpus")
    parser.add_argument("--worst", type=int, default=8, help="worst CI runs to list (default 8)")
    args = parser.parse_args()
    report_ci(ci_rows(args.corpus), args.worst)
    report_fits(args.corpus)


if __name__ == "__main__":
    main()
