"""`tracekit sample`'s engine: time the chosen primitives on the local device within a budget and store the samples
under this device's hardware id."""
from __future__ import annotations

import itertools
import json
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from tracekit.core.errors import ConfigError
from tracekit.core.hardware import cpu_hardware_id, normalize_hardware
from tracekit.core.hashing import bytes_digest
from tracekit.core.samples import HOST_CLOCK_SOURCE
from tracekit.core.store import SampleStore

from .model_cases import model_cases
from .plan import compute_share, order, speed
from .shapes import (
    COLLECTIVES,
    COMPUTE,
    SSM,
    SUPPORTED,
    Case,
    collective_cases,
    compute_cases,
    fsdp_copy_cases,
    points,
)
from .ssm import ssm_cases

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: Passes over the shape list (the median over passes is the sample).
ROUNDS = 3


@dataclass
class SampleRun:
    hardware: str
    device: str
    dtype: str
    source: str | None = None
    rows: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    stopped_by_budget: bool = False
    #: "primitive/variant[/dtype]" → why those cases were not timed here (a kernel this torch or device lacks)
    skipped: dict[str, str] = field(default_factory=dict)
    #: How the kernels were timed (tracekit.sampling.clocks): "cuda-events", or "host" (a CPU; a GPU whose device
    #: clock failed its check, `clock_problem` saying why); None when no compute primitive was timed.
    kernel_clock: str | None = None
    clock_problem: str | None = None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in self.rows:
            out[row["primitive"]] = out.get(row["primitive"], 0) + 1
        return out


def parse_primitives(text: str | None) -> list[str]:
    if not text:
        return list(SUPPORTED)
    wanted = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in SUPPORTED]
    if unknown:
        raise ConfigError(f"cannot sample {', '.join(unknown)}; supported: {', '.join(SUPPORTED)}")
    return wanted


def sample(device: str = "cpu", primitives: list[str] | None = None, budget_s: float = 60.0, ranks: int = 2,
           store: SampleStore | None = None, dtype: str | None = None, threads: int | None = 1,
           warmup: int = 2, repeats: int = 5, rounds: int = ROUNDS,
           progress: Callable[[float], None] | None = None,
           timed: Callable[[str, float], None] | None = None) -> SampleRun:
    """Time `primitives` (compute and/or collectives) for about `budget_s` seconds; add the samples to `store`.

    Every shape is timed in up to `rounds` separate passes over the whole shape list (each pass: warm-up, then
    the median of `repeats`, or for a collective the mean of its bursts), and its sample is the median over the
    passes: a slow spell of the machine then spoils one pass of a few shapes, not the sample. The budget ends the
    passes: the first covers as many shapes as it allows. `progress(fraction)` is called as the budget is used,
    `timed(primitive, fraction)` each time a shape of `primitive` has been timed.
    Compute primitives run in this process with `threads` torch threads (1 matches torchrun's OMP_NUM_THREADS=1
    per rank), under one one-rank process group; collectives over `ranks` local processes.
    """
    import torch

    from .clocks import DeviceClock, device_clock_problem
    from .collectives import run_collectives
    from .compute import DTYPES, Timer, one_rank_group
    from .recipes import time_any, unsupported
    from .ssm import time_ssm_case

    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device must be cpu or cuda, not {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available here")
    dtype = dtype or ("bf16" if device == "cuda" else "fp32")
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    if budget_s <= 0:
        raise ConfigError("the budget must be a positive number of seconds")
    if rounds < 1:
        raise ConfigError("rounds must be at least 1")
    chosen = set(primitives or SUPPORTED)
    if device == "cuda" and "framework" in chosen:  # a GPU's host runs ahead of the kernels it queues
        if primitives and "framework" in primitives:
            raise ConfigError("the framework overhead is sampled on --device cpu only (on a GPU the host queues "
                              "kernels ahead and its time between operators is hidden)")
        chosen.discard("framework")
    compute = chosen & set(COMPUTE + SSM)
    collectives = chosen & set(COLLECTIVES)
    if collectives and ranks < 2:
        raise ConfigError("collectives need --processes of at least 2")
    if threads and device == "cpu":
        torch.set_num_threads(threads)
    hardware = normalize_hardware(torch.cuda.get_device_name()) if device == "cuda" else cpu_hardware_id()
    result = SampleRun(hardware, device, dtype)
    start = time.time()
    deadline = start + budget_s
    compute_deadline = start + compute_share(budget_s, len(compute), len(collectives))

    def report(primitive: str) -> None:
        fraction = min(1.0, (time.time() - start) / budget_s)
        if progress:
            progress(fraction)
        if timed:
            timed(primitive, fraction)

    if compute:
        dev = torch.device("cuda" if device == "cuda" else "cpu")
        result.clock_problem = device_clock_problem(dev) if device == "cuda" else None
        timer = Timer(dev, warmup, repeats, on_host=result.clock_problem is not None)
        result.kernel_clock = "cuda-events" if isinstance(timer.clock, DeviceClock) else "host"
        cases = planned_cases(device, compute, dtype, warmup + repeats, hardware)
        timings: dict[Case, dict[str, list[float]]] = {}
        with one_rank_group():
            runnable = []
            for case in cases:  # each kernel this torch or device lacks is named once, at a tiny shape
                reason = unsupported(case, timer.device, dtype)
                if reason:
                    result.skipped.setdefault(kind_name(case), reason)
                else:
                    runnable.append(case)
            for case in runnable * rounds:  # pass after pass; the deadline may cut the first one short
                if time.time() >= compute_deadline:
                    break
                timing = time_ssm_case if case.primitive in SSM else time_any
                try:
                    passes_us = timing(case, dtype, timer)
                except torch.OutOfMemoryError:  # one shape too large for this GPU: named, the rest go on
                    torch.cuda.empty_cache()
                    result.skipped.setdefault(f"{kind_name(case)} {_shape(case)}", "out of memory on this device")
                    continue
                for pass_, micros in passes_us.items():
                    timings.setdefault(case, {}).setdefault(pass_, []).append(micros)
                report(case.primitive)
        result.stopped_by_budget = len(timings) < len(runnable)
        for case, passes in timings.items():  # host costs (framework) are on the host's clock, kernels on the timer's
            source_path = HOST_CLOCK_SOURCE if case.primitive == "framework" else timer.clock.source_path
            for pass_, values in passes.items():
                result.rows.append(_row(hardware, case, pass_, dtype, statistics.median(values), source_path))
    if collectives:
        cases = collective_cases(device, collectives, ranks)
        comm: dict[Case, list[float]] = {}
        # the collectives keep their share of the budget when the compute shape that straddled its deadline ran over
        seconds = max(deadline - time.time(), budget_s * len(collectives) / len(chosen))
        for case, micros in run_collectives(cases, ranks, device, dtype, warmup, repeats, rounds, seconds):
            comm.setdefault(case, []).append(micros)
            report(case.primitive)
        for case, values in comm.items():
            row = _row(hardware, case, "comm", dtype, statistics.median(values), HOST_CLOCK_SOURCE)
            row["numel"] = case.feature("bytes") / DTYPE_BYTES[dtype]
            result.rows.append(row)
        result.stopped_by_budget = result.stopped_by_budget or len(comm) < len(cases)
    result.seconds = time.time() - start
    if result.rows:
        payload = json.dumps(result.rows, sort_keys=True).encode()
        result.source = "sample-" + bytes_digest(payload)
        for row in result.rows:
            row["source"] = result.source
        if store is not None:
            store.add(result.source, result.rows, {
                "kind": "sample", "path": HOST_CLOCK_SOURCE, "hardware": hardware, "device": device, "dtype": dtype,
                "kernel_clock": result.kernel_clock,  # tracekit.sampling.clocks
                "ranks": ranks if collectives else None, "rounds": rounds,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            })
    return result


def planned_cases(device: str, compute: set[str], dtype: str, runs: int, hardware: str | None = None) -> list[Case]:
    """Every compute case of `device` among `compute` in the plan's order (tracekit.sampling.plan): FSDP2's copies,
    the GPT grid's layer operators (tracekit.sampling.shapes) and the catalogue's (tracekit.sampling.model_cases),
    the last two alternating so that a kind both give (a linear's GEMM) takes shapes from each."""
    copies = fsdp_copy_cases(device) if "elementwise" in compute else []
    grid = list(dict.fromkeys(case for point in points(device) for case in compute_cases(point, compute)))
    catalog = model_cases(device, compute)
    merged = copies + [c for pair in itertools.zip_longest(grid, catalog) for c in pair if c is not None]
    merged += ssm_cases(device, compute)  # the hybrid models' mixers (tracekit.sampling.ssm)
    return order(list(dict.fromkeys(merged)), speed(device, hardware), DTYPE_BYTES[dtype], runs, device)


def kind_name(case: Case) -> str:
    """`primitive/variant[/dtype]` of a case's kind (tracekit.sampling.shapes.Case.kind)."""
    return "/".join(part for part in case.kind if part)


def _shape(case: Case) -> str:
    return " ".join(f"{k}={v:g}" for k, v in case.features)


def _row(hardware: str, case: Case, pass_: str, dtype: str, micros: float, source_path: str) -> dict:
    recipe = case.get("recipe")
    return {"hardware": hardware, "primitive": case.primitive, "pass": pass_, "dtype": case.dtype or dtype,
            "variant": case.variant, **case.features_for(pass_), "duration_us": float(micros),
            "kernel": f"tracekit.sample:{case.variant}" + (f" ({recipe})" if recipe else ""),
            "source_path": source_path}
