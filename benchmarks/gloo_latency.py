"""How steady is a small gloo all-reduce on this machine? The CPU loop's (`cpu_e2e.py`) tensor-parallel runs issue
~40 small all-reduces per iteration, so their measured time follows this latency; `tracekit sample` measures it
once, minutes before the runs it predicts.

    .venv/bin/python benchmarks/gloo_latency.py [--seconds 90] [--kib 8]

Two local ranks (torchrun, gloo, 1 thread each) time an all-reduce of `--kib` KiB of fp32, in windows about 2 s
apart: 40 back to back (as `tracekit sample` times collectives) and 40 each after ~1 ms of matrix products on both
ranks (as a tensor-parallel layer issues them). Prints each window's medians, then the spread of those medians over
the run: if windows seconds apart differ by several times, no single sample of the latency predicts a run to 10%.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

WINDOW_CALLS = 40


def worker(seconds: float, kib: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x = torch.randn(kib * 256)
    a = torch.randn(128, 128)
    for _ in range(20):
        dist.all_reduce(x)
    bursts, isolated = [], []
    end = time.time() + seconds
    while True:
        flag = torch.tensor([1.0 if time.time() < end else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # both ranks stop after the same window
        if flag.item() == 0:
            break
        b, i = [], []
        for _ in range(WINDOW_CALLS):
            t = time.perf_counter()
            dist.all_reduce(x)
            b.append(time.perf_counter() - t)
        for _ in range(WINDOW_CALLS):
            for _ in range(20):
                a @ a
            t = time.perf_counter()
            dist.all_reduce(x)
            i.append(time.perf_counter() - t)
        bursts.append(statistics.median(b) * 1e6)
        isolated.append(statistics.median(i) * 1e6)
        if rank == 0:
            print(f"{time.strftime('%H:%M:%S')}  back to back {bursts[-1]:6.0f} µs   "
                  f"after compute {isolated[-1]:6.0f} µs", flush=True)
        time.sleep(1.5)
    if rank == 0:
        for name, values in (("back to back", bursts), ("after compute", isolated)):
            q = statistics.quantiles(values, n=10, method="inclusive")
            print(f"{name:14s} window medians over {len(values)} windows: min {min(values):.0f}, p10 {q[0]:.0f}, "
                  f"median {statistics.median(values):.0f}, p90 {q[-1]:.0f}, max {max(values):.0f} µs "
                  f"(max/min {max(values) / min(values):.1f}x, p90/p10 {q[-1] / q[0]:.1f}x)")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=90, help="how long to measure (default 90)")
    parser.add_argument("--kib", type=int, default=8, help="all-reduce size in KiB (default 8)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.seconds, args.kib)
        return
    import os

    print(f"gloo all-reduce of {args.kib} KiB fp32 over 2 local ranks, {args.seconds:.0f} s; "
          f"load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           __file__, "--worker", "--seconds", str(args.seconds), "--kib", str(args.kib)],
                          env=dict(os.environ, OMP_NUM_THREADS="1"), stderr=subprocess.DEVNULL)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
