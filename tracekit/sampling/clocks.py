"""How `tracekit sample` reads one call's time, and what its rows say of it (`source_path`).

- `WallClock` (a CPU; host costs on any device): the host's clock around the call, with the device synchronised on
  both sides. On a CPU the kernels run on the calling thread, so that is their time. Rows: `tracekit-sample`.
- `DeviceClock` (CUDA, every kernel primitive): two CUDA events around the call on the current stream, recorded
  behind a spin kernel (`torch.cuda._sleep`) that keeps the GPU busy while the host queues the call. The GPU then
  runs the call's kernels back to back, as a training step's stream runs them while its host is ahead of it, and the
  events hold neither the launch, nor the synchronize, nor the host's gaps between the kernels of a backward. The
  first harvest (issue #35) timed a GPU by the host's clock: on its H200 no sample was under 35 µs and a 1024×1024×128
  GEMM took 104 µs against a 6 µs roofline, so short operators carried the host's round trip and every model trained
  on them needed the `floor_us` rule. Rows: `tracekit-sample-device`, which the predictor takes as kernel times
  (`predictor.costs.physics.transfer.kernel_timed`).

The spin has to outlast the host's queuing of the call: it lasts `SPIN_MARGIN` times the host time the previous call
of the same kind (a forward, a backward, a step) took to return (`spin_us`), at least `MIN_SPIN_US` and at most
`MAX_SPIN_US` (a call that waits on the GPU itself, e.g. a MoE permute reading its split sizes, returns only after the
spin and its kernels; its spin grows to the cap and is wasted, not wrong: after such a wait the kernels' gaps are the
run's own). It is sized in cycles at the rate the GPU spins at, measured once per device at the first clock's first
call (`spin_rate`). A warm-up call sizes the spin of the timed ones.

Before a GPU's kernels are timed, `device_clock_problem` checks the device clock against the host's on one GEMM: its
time must be above zero and at most the host's clock around the same call (which holds the kernel and more). A clock
that fails, or that this torch cannot run, is reported in one line and the run times its kernels by the host's clock,
as the first harvest did: a GPU's minutes are too scarce to spend on samples nobody can trust.
"""
from __future__ import annotations

import functools
import statistics
import time
from typing import Callable, TypeVar

import torch

from tracekit.core.samples import DEVICE_CLOCK_SOURCE, HOST_CLOCK_SOURCE

SPIN_MARGIN = 2.0
MIN_SPIN_US = 50.0
MAX_SPIN_US = 5_000.0
#: The spin before the first call a clock times (no host time seen yet).
FIRST_SPIN_US = 1_000.0
#: Cycles spun to measure the spin rate (a few ms on a GPU at 1–2 GHz), three times.
CALIBRATION_CYCLES = 5_000_000

T = TypeVar("T")


class WallClock:
    """The host's clock around a call, the device synchronised before and after (module docstring)."""

    source_path = HOST_CLOCK_SOURCE

    def __init__(self, device: torch.device):
        self.device = device

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time(self, call: Callable[[], T], kind: str = "") -> tuple[float, T]:
        """(seconds, result) of one call."""
        self.sync()
        t0 = time.perf_counter()
        out = call()
        self.sync()
        return time.perf_counter() - t0, out


class DeviceClock:
    """CUDA events around a call queued behind a spin kernel (module docstring)."""

    source_path = DEVICE_CLOCK_SOURCE

    def __init__(self, device: torch.device):
        self.device = device
        self.spin_us: dict[str, float] = {}  # by the kind of call (a forward, a backward, a step)

    def time(self, call: Callable[[], T], kind: str = "") -> tuple[float, T]:
        """(seconds on the device, result) of one call; `kind` names the calls whose host time sizes its spin."""
        cycles = spin_cycles(self.spin_us.get(kind, FIRST_SPIN_US), spin_rate(self.device))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(self.device)
        torch.cuda._sleep(cycles)
        start.record()
        t0 = time.perf_counter()
        out = call()
        queued = time.perf_counter() - t0
        end.record()
        end.synchronize()
        self.spin_us[kind] = next_spin_us(queued)
        return start.elapsed_time(end) / 1e3, out


@functools.cache
def spin_rate(device: torch.device) -> float:
    """The GPU's spin rate in cycles per µs, measured once per device and process (the clock check's and the run's
    clocks share it)."""
    rates = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        torch.cuda._sleep(CALIBRATION_CYCLES)
        end.record()
        end.synchronize()
        rates.append(CALIBRATION_CYCLES / (start.elapsed_time(end) * 1e3))
    return statistics.median(rates)


def next_spin_us(queued_s: float) -> float:
    """The spin before the next call, from the host seconds this one took to return (module docstring)."""
    return min(MAX_SPIN_US, max(MIN_SPIN_US, SPIN_MARGIN * queued_s * 1e6))


def spin_cycles(spin_us: float, cycles_per_us: float) -> int:
    return max(1, int(spin_us * cycles_per_us))


#: The check's GEMM (bf16, square) and its timings per clock.
CHECK_EDGE = 2048
CHECK_TIMINGS = 5
#: How far above the host's time the device's may come out in the check (the two medians are of separate calls).
CHECK_SLACK = 1.05


def device_clock_problem(device: torch.device) -> str | None:
    """None when the device clock times the check's GEMM plausibly on `device`, else why not (module docstring)."""
    try:
        x = torch.randn(CHECK_EDGE, CHECK_EDGE, device=device, dtype=torch.bfloat16)
        on_device, on_host = DeviceClock(device), WallClock(device)
        device_s, host_s = [], []
        for _ in range(CHECK_TIMINGS + 1):  # the first of each is a warm-up
            device_s.append(on_device.time(lambda: x @ x, "check")[0])
            host_s.append(on_host.time(lambda: x @ x, "check")[0])
    except (RuntimeError, AssertionError, AttributeError) as exc:  # no CUDA, no `_sleep` in this torch, a failed call
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
    return implausible(statistics.median(device_s[1:]), statistics.median(host_s[1:]))


def implausible(device_s: float, host_s: float) -> str | None:
    """Why a device time of the check's GEMM cannot be right against the host's time of it, or None."""
    if device_s <= 0 or device_s > CHECK_SLACK * host_s:
        return (f"the device clock timed a {CHECK_EDGE}³ bf16 GEMM at {device_s * 1e6:.1f} µs against the host's "
                f"{host_s * 1e6:.1f} µs around it")
    return None


def clock_for(device: torch.device, on_host: bool = False) -> WallClock | DeviceClock:
    """The clock of kernel times on `device` (CUDA: `DeviceClock`), or the host's (`on_host`, and on a CPU)."""
    if device.type == "cuda" and not on_host:
        return DeviceClock(device)
    return WallClock(device)
