"""Time collectives over N local processes with torch.distributed (gloo on CPU, nccl on CUDA).

`run_collectives` starts N copies of this module (`python -m tracekit.sampling.collectives`); each joins the group
and times every case in bursts, as nccl-tests does: after a barrier, BURST operations, time per operation = the
slowest rank's summed operation time / BURST, averaged over repeated bursts. A step pays every operation, so the
mean is its cost: gloo's waits are heavy-tailed (mean ~2× median inside a training step). The whole case list is
timed in up to `rounds` passes; rank 0 prints one JSON line per timed case and pass, which the parent turns into
samples.

On CUDA the operations of a burst run back to back. On CPU each operation is preceded by GAP_US of computation on
the calling thread, as in a training step, where gloo's threads go idle between collectives and must wake up for
each one: back-to-back gloo operations are several times quicker than the same operations inside a step. Message
sizes are bytes per rank: the whole tensor of an all-reduce, the input shard of an all-gather, the output shard of a
reduce-scatter, the message of a send/recv.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterator

from .shapes import Case

_CASE_PREFIX = "TRACEKIT_CASE "
BURST = 10  # operations per timed burst
GAP_US = {"cpu": 500.0, "cuda": 0.0}  # computation before each operation of a burst
#: Latency-bound messages (up to SMALL_BYTES) get SMALL_REPEATS × the repeats: their time is a heavy-tailed wait
#: (gloo: median 0.3 ms, mean 1.4 ms, p90 4 ms for 16 KiB), so their bursts' mean is steadied by more of them, and
#: they are cheap to time.
SMALL_BYTES, SMALL_REPEATS = 256 * 1024, 3


def run_collectives(cases: list[Case], ranks: int, device: str, dtype: str, warmup: int, repeats: int, rounds: int,
                    seconds: float) -> Iterator[tuple[Case, float]]:
    """Yield (case, mean µs of one pass) as the worker group times each case, in up to `rounds` passes over
    `cases`; stops `seconds` after the group is up (its processes' start-up, seconds on a loaded machine, is not
    taken from the time the collectives have)."""
    if ranks < 2:
        raise ValueError("collectives need at least 2 ranks")
    with tempfile.TemporaryDirectory(prefix="tracekit-store-") as meet:  # a file store: no TCP port to race for
        spec = json.dumps({"cases": [[c.primitive, c.feature("bytes")] for c in cases], "device": device,
                           "dtype": dtype, "warmup": warmup, "repeats": repeats, "rounds": rounds,
                           "seconds": seconds, "store": os.path.join(meet, "store")})
        yield from _run_workers(cases, ranks, spec)


def _run_workers(cases: list[Case], ranks: int, spec: str) -> Iterator[tuple[Case, float]]:
    env = dict(os.environ, WORLD_SIZE=str(ranks), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    procs = []
    for rank in range(ranks):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tracekit.sampling.collectives", spec],
            env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
            stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        ))
    rank0 = procs[0].stdout
    assert rank0 is not None  # rank 0's stdout is a pipe
    try:
        for line in rank0:
            if line.startswith(_CASE_PREFIX):
                index, micros = json.loads(line[len(_CASE_PREFIX):])
                yield cases[index], micros
    finally:
        errors = []
        for rank, proc in enumerate(procs):
            try:
                _, err = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if proc.returncode != 0:
                errors.append(f"rank {rank} exited {proc.returncode}: {(err or '').strip().splitlines()[-1:]}")
        if errors:
            raise RuntimeError("collective workers failed: " + "; ".join(errors))


def _operation(primitive: str, nbytes: int, world: int, rank: int, dtype, device) -> Callable[[], object]:
    import torch
    import torch.distributed as dist

    numel = max(1, nbytes // torch.tensor([], dtype=dtype).element_size())
    if primitive == "all_reduce":
        buf = torch.ones(numel, dtype=dtype, device=device)
        return lambda: dist.all_reduce(buf)
    if primitive == "all_gather":
        shard = torch.ones(numel, dtype=dtype, device=device)
        out = torch.empty(numel * world, dtype=dtype, device=device)
        return lambda: dist.all_gather_single(out, shard)
    if primitive == "reduce_scatter":
        full = torch.ones(numel * world, dtype=dtype, device=device)
        out = torch.empty(numel, dtype=dtype, device=device)
        return lambda: dist.reduce_scatter_single(out, full)
    if primitive == "send_recv":  # ranks pair up 0→1, 2→3, ...; odd ranks receive
        buf = torch.ones(numel, dtype=dtype, device=device)
        peer = rank + 1 if rank % 2 == 0 else rank - 1
        if peer >= world:
            return lambda: None
        return (lambda: dist.send(buf, peer)) if rank % 2 == 0 else (lambda: dist.recv(buf, peer))
    raise ValueError(f"no collective recipe for {primitive!r}")


def _busy(micros: float) -> Callable[[], None] | None:
    """A step's computation between collectives: small matrix products on this thread for `micros` µs (None: no
    gap)."""
    import torch

    if micros <= 0:
        return None
    a = torch.randn(64, 64)

    def run() -> None:
        end = time.perf_counter() + micros / 1e6
        while time.perf_counter() < end:
            torch.mm(a, a)

    return run


def _burst(op: Callable[[], object], gap: Callable[[], None] | None, sync: Callable[[], None]) -> float:
    """Seconds of BURST operations: back to back without a gap, else the operations' own time between gaps."""
    if gap is None:
        t0 = time.perf_counter()
        for _ in range(BURST):
            op()
        sync()
        return time.perf_counter() - t0
    spent = 0.0
    for _ in range(BURST):
        gap()
        t0 = time.perf_counter()
        op()
        sync()
        spent += time.perf_counter() - t0
    return spent


def _worker(spec: dict) -> None:
    import torch
    import torch.distributed as dist

    from .compute import DTYPES

    cuda = spec["device"] == "cuda"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{spec['store']}", rank=rank,
                            world_size=world)
    dtype = DTYPES[spec["dtype"]]
    flag = torch.zeros(1, device=device)
    gap = _busy(GAP_US[spec["device"]])
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    deadline = time.time() + spec["seconds"]
    for _ in range(spec["rounds"]):  # a pass cut by the deadline ends the sampling: no later pass re-times less
        for index, (primitive, nbytes) in enumerate(spec["cases"]):
            flag.fill_(1.0 if time.time() > deadline else 0.0)
            dist.broadcast(flag, 0)  # rank 0's clock decides, so every rank stops at the same case
            if flag.item():
                break
            op = _operation(primitive, int(nbytes), world, rank, dtype, device)
            times = []
            repeats = spec["repeats"] * (SMALL_REPEATS if nbytes <= SMALL_BYTES else 1)
            for i in range(spec["warmup"] + repeats):
                dist.barrier()
                spent = _burst(op, gap, sync)
                elapsed = torch.tensor([spent / BURST], dtype=torch.float64, device=device)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if i >= spec["warmup"]:
                    times.append(float(elapsed))
            if rank == 0:
                print(_CASE_PREFIX + json.dumps([index, statistics.fmean(times) * 1e6]), flush=True)
        if flag.item():
            break
    dist.barrier()  # no rank tears down while another still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]))
