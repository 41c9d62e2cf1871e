"""How `tracekit sample` reads a call's time (tracekit.sampling.clocks, #35): a GPU's kernels by CUDA events queued
behind a spin kernel, host costs and a CPU's operators by the host's clock; each row says which, and the predictor
takes a GPU's rows as kernel times only when they were timed on the device."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from predictor.costs.learned.training import train_models
from predictor.costs.physics.transfer import kernel_timed
from tests.conftest import SAMPLES
from tracekit.core.errors import ModelError
from tracekit.core.samples import DEVICE_CLOCK_SOURCE, HOST_CLOCK_SOURCE
from tracekit.core.store import SampleStore
from tracekit.sampling.clocks import (
    MAX_SPIN_US,
    MIN_SPIN_US,
    DeviceClock,
    WallClock,
    clock_for,
    device_clock_problem,
    implausible,
    next_spin_us,
    spin_cycles,
)
from tracekit.sampling.compute import Timer
from tracekit.sampling.run import sample

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def test_kernels_on_a_gpu_are_timed_on_the_device_and_host_costs_on_the_host():
    """Building a GPU's clock touches no GPU (its spin rate is measured at its first call), so this runs anywhere."""
    assert isinstance(clock_for(CUDA), DeviceClock) and clock_for(CUDA).source_path == DEVICE_CLOCK_SOURCE
    assert isinstance(clock_for(CUDA, on_host=True), WallClock)
    assert isinstance(clock_for(CPU), WallClock) and clock_for(CPU).source_path == HOST_CLOCK_SOURCE
    timer = Timer(CUDA, 2, 5)
    assert timer.clock.source_path == DEVICE_CLOCK_SOURCE and not timer.first_touch
    host = timer.host(15, False)
    assert host.clock.source_path == HOST_CLOCK_SOURCE and host.device == CUDA
    assert (host.warmup, host.repeats) == (2, 15)


def test_the_spin_outlasts_the_hosts_queuing_within_its_bounds():
    assert next_spin_us(0.0) == MIN_SPIN_US and next_spin_us(10.0) == MAX_SPIN_US
    spins = [next_spin_us(us / 1e6) for us in (1, 10, 30, 100, 400, 2_000, 20_000)]
    assert spins == sorted(spins)
    for us, spin in zip((1, 10, 30, 100, 400, 2_000, 20_000), spins):
        assert spin >= min(2 * us, MAX_SPIN_US) and MIN_SPIN_US <= spin <= MAX_SPIN_US
    assert spin_cycles(100.0, 1_980.0) == 198_000 and spin_cycles(0.0, 1_980.0) == 1


def test_the_hosts_clock_holds_the_whole_call():
    seconds, out = WallClock(CPU).time(lambda: (time.sleep(0.02), 7)[1])
    assert out == 7 and 0.02 <= seconds < 2.0


def test_a_cpus_rows_are_host_timed_and_only_device_timed_gpu_rows_count_as_kernel_times():
    run = sample("cpu", ["gemm", "framework"], budget_s=4, store=None, warmup=1, repeats=1, rounds=1)
    assert {row["primitive"] for row in run.rows} == {"gemm", "framework"}
    assert {row["source_path"] for row in run.rows} == {HOST_CLOCK_SOURCE}
    # what a trained model's metadata lists as its rows' sources decides whether the transfer may draw on it
    assert kernel_timed(SimpleNamespace(meta={"sources": [DEVICE_CLOCK_SOURCE]}))
    assert not kernel_timed(SimpleNamespace(meta={"sources": [HOST_CLOCK_SOURCE]}))


def test_a_gpus_kernels_timed_by_both_clocks_are_refused_in_one_line(tmp_path):
    """The corpus's H200 rows (the host's clock) beside the same rows as a device-timed harvest would store them:
    training refuses to mix the two for one GPU, naming it and both sources, and writes nothing."""
    frame = SampleStore(SAMPLES / "h200-tracekit-sample" / "store").read()
    frame = frame[frame["primitive"].isin(["norm", "activation"])]
    mixed = pd.concat([frame, frame.assign(source_path=DEVICE_CLOCK_SOURCE, source="device-harvest")])
    out = tmp_path / "models"
    with pytest.raises(ModelError) as refused:
        train_models(mixed, out)
    message = str(refused.value)
    assert "H200-141GB" in message and HOST_CLOCK_SOURCE in message and DEVICE_CLOCK_SOURCE in message
    assert "\n" not in message and not out.exists()
    assert train_models(frame.assign(source_path=DEVICE_CLOCK_SOURCE), out)  # one clock trains


def test_a_device_clock_that_cannot_run_or_times_implausibly_is_named_not_used():
    """On a machine without CUDA (this torch has no `_sleep`, no events) the check names why in one line instead of
    raising; a device time of zero, or above the host's time around the same GEMM, is implausible."""
    problem = device_clock_problem(CUDA)
    if torch.cuda.is_available():  # a working GPU's clock passes its check
        assert problem is None, problem
    else:
        assert problem and "\n" not in problem
    assert implausible(0.0, 1e-4) and implausible(2e-4, 1e-4) and "µs" in implausible(2e-4, 1e-4)
    assert implausible(9e-5, 1e-4) is None and implausible(1.04e-4, 1e-4) is None


def test_a_cpu_run_says_its_kernels_were_timed_by_the_hosts_clock():
    run = sample("cpu", ["norm"], budget_s=2, store=None, warmup=1, repeats=1, rounds=1)
    assert run.kernel_clock == "host" and run.clock_problem is None
    collectives = sample("cpu", ["all_reduce"], budget_s=2, ranks=2, store=None, warmup=1, repeats=1, rounds=1)
    assert collectives.kernel_clock is None
