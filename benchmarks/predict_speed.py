"""Prediction speed of tracekit beside the seed paper's released tool (estimate-train-time), which needs about 56 s
per configuration on this machine because it refits its regressors on every call.

Measures, in one run:
- in-process latency of `predict()` per configuration once the models are loaded (goal ≤ 50 ms), with every
  operator estimate asked from the models (new shapes) and with estimates cached from earlier calls (a sweep);
- `predict_many` throughput on every row of the shared e2e CSV, cache cleared first (goal ≥ 500 configurations/s),
  and the whole
  `tracekit predict --batch` command on that file (process start, CSV in and out included);
- the cold `tracekit predict` command for one configuration (goal < 2 s).

Run: .venv/bin/python benchmarks/predict_speed.py [--models DIR] [--repeat N]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from extractors import jobs as B  # noqa: E402
from predictor.costs.estimates import clear_estimate_cache  # noqa: E402
from predictor.costs.learned.models import ModelSet  # noqa: E402
from predictor.predict import predict, predict_many  # noqa: E402

E2E = ROOT.parent / "shared" / "corpus" / "e2e" / "vtrain_a100_single_node.csv"
PAPER_TOOL_S = 56.0
ARGS = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --micro-batch-size 4 "
        "--global-batch-size 64 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --fp16")


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    tracekit = str(Path(sys.executable).with_name("tracekit"))

    models = ModelSet.load(args.models)
    _, cells = B.read_rows(E2E)
    rows = [B.parse_row(c, i + 2, None, None, {"attention": "unfused"}) for i, c in enumerate(cells)]
    rows = [r for r in rows if r.error is None]
    configs, clusters = [r.config for r in rows], [r.cluster for r in rows]

    predict(configs[0], clusters[0], models)  # warm-up (loads each booster once)
    sample = list(range(0, len(configs), max(1, len(configs) // 50)))
    cold, warm = [], []
    for i in sample:  # cold: every operator estimate asked from the models; warm: a sweep's repeated shapes cached
        clear_estimate_cache()
        cold.append(timed(lambda: predict(configs[i], clusters[i], models), 1)[0])
        warm.append(timed(lambda: predict(configs[i], clusters[i], models), 1)[0])

    def batch() -> None:
        clear_estimate_cache()
        predict_many(configs, clusters, models)

    many = timed(batch, args.repeat)
    batch_rate = len(configs) / min(many)

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.csv"
        cmd = [tracekit, "predict", "--batch", str(E2E), "--csv-out", str(out), "--set", "attention=unfused"]
        if args.models:
            cmd += ["--models", args.models]
        cli_batch = min(timed(lambda: subprocess.run(cmd, check=True, capture_output=True), args.repeat))
    cold_cmd = [tracekit, "predict", "--megatron-args", ARGS, "--hardware", "A100-SXM4-80GB", "--gpus-per-node", "4",
                "--json"] + (["--models", args.models] if args.models else [])
    command = timed(lambda: subprocess.run(cold_cmd, check=True, capture_output=True), args.repeat)
    help_s = min(timed(lambda: subprocess.run([tracekit, "--help"], check=True, capture_output=True), args.repeat))

    print(f"models: {models.path} ({len(models.models)} regressors); e2e rows: {len(configs)}")
    print(f"{'measure':<46} {'tracekit':>12} {'goal':>10} {'paper tool':>11} {'speed-up':>10}")
    lines = [
        ("in-process predict(), new shapes (median)", statistics.median(cold), "≤ 50 ms", PAPER_TOOL_S),
        ("in-process predict(), estimates cached (median)", statistics.median(warm), "≤ 50 ms", PAPER_TOOL_S),
        ("predict_many, per config (all rows)", 1 / batch_rate, "≤ 2 ms", PAPER_TOOL_S),
        ("`tracekit predict --batch` command, per config", cli_batch / len(configs), "", PAPER_TOOL_S),
        ("cold `tracekit predict` command (one config)", min(command), "< 2 s", PAPER_TOOL_S),
    ]
    for label, seconds, goal, paper in lines:
        print(f"{label:<46} {seconds * 1e3:>10.2f}ms {goal:>10} {paper:>10.0f}s {paper / seconds:>9.0f}×")
    print(f"predict_many throughput: {batch_rate:,.0f} configs/s (goal ≥ 500); `tracekit --help`: {help_s:.2f} s; "
          f"cold command runs: {', '.join(f'{c:.2f}' for c in command)} s")


if __name__ == "__main__":
    main()
