"""Where a CPU training step's time goes, without the profiler: the reference trainer's forward, backward and
optimizer step timed where they run, with the collectives inside each timed apart, against what `tracekit predict`
puts in each.

    .venv/bin/python benchmarks/step_phases.py [--ranks 2] [--iters 60] [-- TRAINER ARGS]

Local ranks run the reference trainer (default: the CPU loop's configuration 6, FSDP2 over 2 ranks, hidden 128, 4
layers) with `GPTStage.forward`, `torch.autograd.backward` and `Adam.step` wrapped in timers, and every collective
the step issues (`all_gather_single`, `reduce_scatter_single`, `all_reduce`, `barrier`: torch FSDP2's and the
trainer's; all synchronous on gloo) timed where it is called. Rank 0 prints, per iteration: each phase's time, the
collectives' time inside it and the rest (its computation, hooks and host work); then per collective: calls per
iteration, median and mean µs (a step pays the mean). With --models, `tracekit predict` of the same job is printed
beside it (its compute, exposed communication, optimizer and other).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import trainer_ranks  # noqa: E402

CONFIG_6 = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "8", "--seq-length", "64",
            "--micro-batch-size", "2", "--global-batch-size", "8", "--use-torch-fsdp2", "--vocab-size", "1000",
            "--log-interval", "1"]
COLLECTIVES = ("all_gather_single", "reduce_scatter_single", "all_reduce", "barrier")
PHASES = ("forward", "backward", "optimizer", "between")


def worker(trainer_args: list[str]) -> None:
    import torch
    import torch.distributed as dist

    from tracekit.reference import model
    from tracekit.reference.train import train

    phase = ["between"]
    wall: dict[str, float] = collections.defaultdict(float)
    comm: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, list[float]] = collections.defaultdict(list)

    def timed_collective(name: str):
        call = getattr(dist, name)

        def run(*args, **kwargs):
            start = time.perf_counter()
            work = call(*args, **kwargs)
            if kwargs.get("async_op") and work is not None:
                work.wait()
            spent = time.perf_counter() - start
            comm[phase[0]] += spent
            calls[name].append(spent * 1e6)
            return work
        setattr(dist, name, run)

    def timed_phase(owner, attr: str, label: str) -> None:
        call = getattr(owner, attr)

        def run(*args, **kwargs):
            outer, phase[0] = phase[0], label
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                wall[label] += time.perf_counter() - start
                phase[0] = outer
        setattr(owner, attr, run)

    for name in COLLECTIVES:
        timed_collective(name)
    timed_phase(model.GPTStage, "forward", "forward")
    timed_phase(torch.autograd, "backward", "backward")
    timed_phase(torch.optim.Adam, "step", "optimizer")
    train(trainer_args)
    if os.environ.get("RANK", "0") != "0":
        return
    iters = int(trainer_args[trainer_args.index("--train-iters") + 1])
    report = {"phases": {p: {"wall_ms": wall[p] / iters * 1e3, "collectives_ms": comm[p] / iters * 1e3}
                         for p in PHASES},
              "collectives": {}}
    for name, times in calls.items():
        kept = times[len(times) // 5:]  # the first fifth (start-up) left out
        report["collectives"][name] = {"per_iteration": len(times) / iters, "median_us": statistics.median(kept),
                                       "mean_us": statistics.fmean(kept)}
    print("STEP_PHASES " + json.dumps(report), flush=True)


def predicted(trainer_args: list[str], ranks: int, models: str) -> dict:
    """`tracekit predict` of the trainer's job, from the arguments block its log starts with (as `tracekit capture`
    reads a run's configuration)."""
    from tracekit.core.hardware import cpu_hardware_id
    from tracekit.reference.arguments import arguments_block, parse_args

    with tempfile.TemporaryDirectory(prefix="tracekit-step-phases-") as folder:
        log = Path(folder) / "train.log"
        log.write_text(arguments_block(parse_args(trainer_args, ranks, False)) + "\n")
        done = subprocess.run([sys.executable, "-c", "from tracekit.cli import main; main()", "predict", str(log),
                               "--hardware", cpu_hardware_id(), "--gpus-per-node", str(ranks), "--models", models,
                               "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"tracekit predict failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2, help="local ranks (default 2)")
    parser.add_argument("--iters", type=int, default=60, help="training iterations (default 60)")
    parser.add_argument("--models", help="a model set to predict the same job with (tracekit train --models-out)")
    args, trainer = trainer_ranks.parse(parser)
    if args.worker:
        worker(trainer)
        return
    trainer = (trainer or CONFIG_6) + ["--train-iters", str(args.iters)]
    start = time.perf_counter()
    done = trainer_ranks.run(__file__, args.ranks, trainer)
    line = next((x for x in done.stdout.splitlines() if x.startswith("STEP_PHASES ")), None)
    if done.returncode != 0 or line is None:
        sys.exit(f"the trainer failed (exit {done.returncode}): {done.stdout[-1000:]}")
    report = json.loads(line[len("STEP_PHASES "):])
    print(f"per iteration (ms; {args.iters} iterations in {time.perf_counter() - start:.0f} s with start-up):")
    print(f"{'phase':10s} {'time':>8s} {'in collectives':>15s} {'the rest':>9s}")
    for name, p in report["phases"].items():
        if name == "between":  # outside the three phases: the root's first gather, the loss report, the barrier
            print(f"{name:10s} {'':>8s} {p['collectives_ms']:15.2f}")
        else:
            rest = p["wall_ms"] - p["collectives_ms"]
            print(f"{name:10s} {p['wall_ms']:8.2f} {p['collectives_ms']:15.2f} {rest:9.2f}")
    print(f"{'collective':22s} {'per iteration':>13s} {'median µs':>10s} {'mean µs':>8s} {'ms per iteration':>17s}")
    for name, c in report["collectives"].items():
        print(f"{name:22s} {c['per_iteration']:13.1f} {c['median_us']:10.0f} {c['mean_us']:8.0f} "
              f"{c['per_iteration'] * c['mean_us'] / 1e3:17.2f}")
    if args.models:
        prediction = predicted(trainer, args.ranks, args.models)
        parts = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in prediction["breakdown"].items())
        print(f"tracekit predict: {prediction['iteration_time_s'] * 1e3:.1f} ms per iteration ({parts} ms)")


if __name__ == "__main__":
    main()
