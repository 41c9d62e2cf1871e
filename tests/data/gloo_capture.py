"""Capture a tiny 2-rank CPU run (gloo) with torch.profiler: matmuls, all_reduces and a send/recv pair per step,
one trace per rank.

Usage: python gloo_capture.py OUT_DIR   (writes OUT_DIR/rank{0,1}.pt.trace.json)

The ranks meet through a file store (no TCP port to race for) and pass a barrier before tearing down, so neither
rank leaves while the other still talks to it.
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, schedule

STEPS = 3  # active profiler steps


def cpu_model() -> str:
    """The CPU as tracekit's capture records it: its hardware id without `cpu-`."""
    from tracekit.core.hardware import cpu_hardware_id

    return cpu_hardware_id().removeprefix("cpu-")


def run(rank: int, world: int, out: str, store: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    a, b = torch.randn(64, 128), torch.randn(128, 32)
    grad = torch.randn(1000)
    path = os.path.join(out, f"rank{rank}.pt.trace.json")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=STEPS),
                 on_trace_ready=lambda prof: prof.export_chrome_trace(path)) as prof:
        prof.add_metadata("cpu_model", cpu_model())
        for _ in range(STEPS + 1):
            c = torch.mm(a, b)
            dist.all_reduce(grad)
            dist.all_reduce(c)
            if rank == 0:
                dist.send(c, 1)
            else:
                dist.recv(c, 0)
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as meet:
        mp.spawn(run, args=(2, sys.argv[1], os.path.join(meet, "store")), nprocs=2)
