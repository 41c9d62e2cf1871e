"""Does an operator take inside a training step what it takes when sampled? The CPU loop (`cpu_e2e.py`) predicts
every configuration low; this times the reference trainer's forward linears where they run.

    .venv/bin/python benchmarks/step_linears.py [--iters 30] [-- TRAINER ARGS]

Two local ranks run the reference trainer (default: the CPU loop's configuration 2, TP=2, hidden 128, no profiler)
with `F.linear` of `tracekit.reference.parallel` wrapped in a timer. After training, rank 0 times each linear shape
again in a loop on the very tensors of its last step: writing over the previous call's freed output, and as
`tracekit sample` times a forward on a CPU (each output kept, into memory just returned to the system: first-touch
pages, as a step's forward activations); and looped on fresh random tensors. Then it times one linear hot and after
its core slept 1 and 5 ms (a TP step idles both cores in every gloo wait). Prints, per shape: median µs in the step
(the first fifth of the calls left out), looped, as sampled, looped on fresh tensors, and the ratios step / looped
and step / as sampled.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import trainer_ranks  # noqa: E402

CONFIG_2 = ["--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "8", "--seq-length", "64",
            "--micro-batch-size", "1", "--global-batch-size", "4", "--tensor-model-parallel-size", "2",
            "--vocab-size", "1000", "--log-interval", "1"]
LOOPED = 300


def _median_us(call, repeats: int = LOOPED, before=None) -> float:
    for _ in range(10):
        call()
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _sampled_us(linear, x, w, b) -> float:
    """Median forward µs of `linear(x, w, b)` as `tracekit sample` times a forward on a CPU (its Timer)."""
    import torch

    from tracekit.sampling.compute import Timer

    x, w = (t.detach().clone().requires_grad_() for t in (x, w))
    b = None if b is None else b.detach().clone().requires_grad_()
    leaves = [t for t in (x, w, b) if t is not None]
    return Timer(torch.device("cpu"), 10, LOOPED // 3).fwd_bwd(leaves, lambda: linear(x, w, b))[0]


def worker(trainer_args: list[str]) -> None:
    import torch
    import torch.nn.functional as F

    import tracekit.reference.parallel as parallel
    from tracekit.reference.train import train

    linear = F.linear
    in_step: dict[tuple, list[float]] = {}
    last: dict[tuple, tuple] = {}

    def timed(x, w, b=None):
        start = time.perf_counter()
        y = linear(x, w, b)
        key = (tuple(x.shape), tuple(w.shape), b is not None)
        in_step.setdefault(key, []).append((time.perf_counter() - start) * 1e6)
        last[key] = (x.detach().clone(), w.detach().clone(), None if b is None else b.detach().clone())
        return y

    parallel.F.linear = timed  # the trainer's module calls F.linear through this name
    train(trainer_args)
    if os.environ.get("RANK") != "0":
        return
    print(f"{'input, weight, bias':34s} {'in step':>8s} {'looped':>8s} {'sampled':>8s} {'fresh':>8s}  step/looped"
          "  step/sampled")
    for key, times in in_step.items():
        x, w, b = last[key]
        fresh = (torch.randn_like(x), torch.randn_like(w) * 0.02, None if b is None else torch.randn_like(b))
        step = statistics.median(times[len(times) // 5:])
        looped = _median_us(lambda: linear(x, w, b))
        sampled = _sampled_us(linear, x, w, b)
        again = _median_us(lambda: linear(*fresh))
        print(f"{str(key):34s} {step:8.1f} {looped:8.1f} {sampled:8.1f} {again:8.1f}  {step / looped:11.2f}"
              f"  {step / sampled:12.2f}")
    x, w, b = next(iter(last.values()))
    hot = _median_us(lambda: linear(x, w, b), 100)
    slept = {ms: _median_us(lambda: linear(x, w, b), 100, lambda ms=ms: time.sleep(ms / 1000)) for ms in (1, 5)}
    print(f"first shape looped: hot {hot:.1f} µs, after 1 ms asleep {slept[1]:.1f} µs, after 5 ms {slept[5]:.1f} µs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=30, help="training iterations (default 30)")
    args, trainer = trainer_ranks.parse(parser)
    if args.worker:
        worker(trainer)
        return
    done = trainer_ranks.run(__file__, 2, (trainer or CONFIG_2) + ["--train-iters", str(args.iters)])
    lines = done.stdout.splitlines()
    table = next((i for i, line in enumerate(lines) if line.startswith("input, weight, bias")), len(lines))
    print("\n".join(lines[table:]) or done.stdout[-2000:])
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
