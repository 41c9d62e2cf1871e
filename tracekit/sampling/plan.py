"""The order `tracekit sample` times its cases in, and what a budget buys.

Every case has a kind (tracekit.sampling.shapes.Case.kind: primitive, variant family, dtype). The plan first takes
one case of every kind (the first round, primitives in turn, so that a budget cut short still leaves each primitive
some kinds; a kind with a one-off set-up, the fused SwiGLU's compile, last), then the rest in a time-fair order:
next comes the primitive that has used the least estimated time so far, and within it the kind that has, and from
that kind its next case (each kind's cases keep their spread order: a budget that runs out leaves a spread of
sizes). So every kind is covered once before any gets a second shape, and after that every primitive has the same
share of the time, split evenly between its kinds: cheap kinds get many shapes and costly ones fewer, and no
primitive is starved by another's many kinds (22 of GEMMs) or large shapes. One-off set-ups do not count against a
share.

The estimate of a case's wall time on a device (`estimate_s`) is what the budget arithmetic rests on:

    case_s + runs · (t_fwd + t_bwd + 2 · t_spin) + t_inputs

with t the kernel time at the device's datasheet rates (a share of the dense bf16/fp8 peak, of the memory bandwidth,
and a launch floor per kernel: `Speed`), runs the warm-up and timed calls, t_spin the spin a GPU's device clock queues
each timed call behind (tracekit.sampling.clocks: twice the host's time to queue a call, taken at the first
harvest's shortest sample, 35 µs), t_inputs the time to fill the inputs, and
`case_s` the wall time per case beyond its timed kernels that a real run shows. On a GPU `case_s` is fitted from the
H200 run of `tracekit sample` in the corpus (`operator-samples/h200-tracekit-sample/`: `fitted_case_s`): its wall
time less every row's measured duration times its calls, over its case timings, an upper bound (it includes the
process's CUDA start). On a CPU the figures are rough ones for the order only (no budget arithmetic is promised there).
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from tracekit.core.hardware import hardware_spec

from .clocks import SPIN_MARGIN
from .shapes import Case

#: Wall seconds per case timing beyond its kernels on a GPU: `fitted_case_s` of the corpus's H200 run, rounded up
#: to the millisecond (tests recompute it).
GPU_CASE_S = 0.032
#: A timed call's host round trip on a GPU: the first harvest's shortest sample (operator-samples/h200-tracekit-sample/,
#: 35 µs, tests check it), which sizes the device clock's spin.
HOST_CALL_S = 35e-6
#: One-off set-up of a kind on its first case (s): the fused SwiGLU's two torch.compile compilations on a GPU (an
#: assumption: Inductor's first compile in a process, seconds to tens of seconds).
FIRST_USE_S = {("cuda", "swiglu"): 30.0}
#: Element moves per `numel` over forward and backward (a plain read and write forward and a read of the gradient
#: and the input and a write backward: 2 + 3 = 5 otherwise) and kernel calls per case (forward + backward) of the
#: recipes whose chains run several kernels, by recipe (or variant). The CPU's framework samples time a whole
#: reference layer and each of its operators alone (`reference_layer`), or stacks of 1 and 3 layers plain and under
#: FSDP2 with three times the repeats (`fsdp2_unit`): thousands of operator calls.
CHAINS = {"swiglu_unfused": (10.0, 8), "squared_relu": (10.0, 6), "rmsnorm_unfused": (16.0, 14),
          "rope": (24.0, 20), "fillmask": (12.0, 6), "router_topk": (12.0, 12), "moe_permute": (6.0, 6),
          "moe_unpermute": (10.0, 10), "reference_layer": (60.0, 2000), "fsdp2_unit": (240.0, 8000)}


@dataclass(frozen=True)
class Speed:
    """What a device's sampled kernels reach at best: FLOP/s of bf16 and fp8 GEMMs, bytes/s, a floor per kernel
    call, `case_s` per case and `spin_s` per timed call (module docstring)."""

    flops: float
    fp8_flops: float
    bandwidth: float
    launch_s: float
    case_s: float
    spin_s: float = 0.0


def speed(device: str, hardware: str | None = None) -> Speed:
    """A GPU's (H200's where the part is not in the datasheet table): half its dense bf16 and fp8 peaks (measured
    GEMMs reach 52-80% of the bf16 peak and at most 72% of the fp8 one on an H200: operator-samples/h200-matmul/) and a
    quarter of its memory bandwidth (the H200's sampled norms, residual adds and losses move their bytes at a quarter
    to a third of it), a 10 µs floor per kernel, the device clock's spin per timed call; rough figures for one CPU
    core."""
    if device == "cuda":
        spec = hardware_spec(hardware or "") or hardware_spec("H200-141GB")
        assert spec is not None
        return Speed(0.5e12 * spec.peak_tflops_fp16, 0.5e12 * (spec.peak_tflops_fp8 or spec.peak_tflops_fp16),
                     0.25e9 * spec.mem_bw_gbs, 10e-6, GPU_CASE_S, SPIN_MARGIN * HOST_CALL_S)
    return Speed(10e9, 10e9, 4e9, 20e-6, 0.005)


def work(case: Case, dtype_bytes: float) -> tuple[float, float, int]:
    """(FLOPs, bytes moved, kernels) of one case's forward and backward together (an optimizer: one step)."""
    f = dict(case.features)
    recipe = str(case.get("recipe") or case.variant)
    kind = case.primitive
    if kind in ("gemm", "bmm"):
        b, m, n, k = f.get("batch", 1.0), f["m"], f["n"], f["k"]
        size = 1.0 if case.dtype else dtype_bytes
        return 3 * 2 * b * m * n * k, 3 * size * b * (m * k + k * n + m * n), 3
    if kind == "attention":  # backward 2.5× the forward's work; flash kernels run at about half a GEMM's rate
        flops = 4 * f["batch"] * f["heads"] * f["seq"] * f["seq_kv"] * f["head_dim"] * (0.5 if f.get("causal") else 1)
        return 2 * 3.5 * flops, 3.5 * 4 * dtype_bytes * f["batch"] * f["heads"] * f["seq"] * f["head_dim"], 3
    if kind == "optimizer":  # fp32 main parameter, gradient and two moments read, three written, the copy back
        return 12 * f["params"], 40 * f["params"], 4 * _tensors(f)
    moves, kernels = CHAINS.get(recipe, (5.0, 2))
    numel = f.get("numel", f.get("rows", 0) * f.get("width", 1))
    return 8 * numel, moves * dtype_bytes * numel, kernels


def _tensors(features: dict[str, float]) -> int:
    return 12 * int(features.get("layers", 1)) + 1  # a stage's tensors (tracekit.sampling.shapes.stage_shapes)


def estimate_s(case: Case, rate: Speed, dtype_bytes: float, runs: int) -> float:
    """Estimated wall seconds of one timing of `case` (module docstring)."""
    flops, moved, kernels = work(case, dtype_bytes)
    peak = rate.fp8_flops if case.dtype else rate.flops
    kernel = max(flops / peak, moved / rate.bandwidth) + kernels * rate.launch_s
    inputs = moved / 3 / rate.bandwidth * 4  # inputs filled with random numbers: a few passes over them
    return rate.case_s + runs * (kernel + 2 * rate.spin_s) + inputs


def first_use_s(case: Case, device: str) -> float:
    return FIRST_USE_S.get((device, str(case.get("recipe"))), 0.0)


Kind = tuple[str, str, str]


def order(cases: list[Case], rate: Speed, dtype_bytes: float, runs: int, device: str) -> list[Case]:
    """The cases in the plan's order (module docstring): the first round, then time-fair by primitive and kind."""
    queues: dict[Kind, deque[Case]] = {}
    for case in cases:
        queues.setdefault(case.kind, deque()).append(case)
    by_primitive: dict[str, list[Kind]] = {}
    for kind in queues:
        by_primitive.setdefault(kind[0], []).append(kind)
    turns = [k for row in itertools.zip_longest(*by_primitive.values()) for k in row if k is not None]
    first = sorted(turns, key=lambda k: first_use_s(queues[k][0], device) > 0)  # set-ups last (a stable sort)
    out = [queues[kind].popleft() for kind in first]
    spent: dict[Kind, float] = {c.kind: estimate_s(c, rate, dtype_bytes, runs) for c in out}
    used = {p: sum(spent[k] for k in kinds) for p, kinds in by_primitive.items()}
    heaps = {p: [(spent[k], i, k) for i, k in enumerate(kinds) if queues[k]] for p, kinds in by_primitive.items()}
    for heap in heaps.values():
        heapq.heapify(heap)
    top = [(used[p], i, p) for i, p in enumerate(by_primitive) if heaps[p]]
    heapq.heapify(top)
    while top:
        total, i, primitive = heapq.heappop(top)
        kind_spent, j, kind = heapq.heappop(heaps[primitive])
        case = queues[kind].popleft()
        out.append(case)
        cost = estimate_s(case, rate, dtype_bytes, runs)
        if queues[kind]:
            heapq.heappush(heaps[primitive], (kind_spent + cost, j, kind))
        if heaps[primitive]:
            heapq.heappush(top, (total + cost, i, primitive))
    return out


def timeline(cases: list[Case], rate: Speed, dtype_bytes: float, runs: int, device: str) -> list[float]:
    """The estimated time each case of an ordered list starts at, its kind's set-up included."""
    starts, now, seen = [], 0.0, set()
    for case in cases:
        if case.kind not in seen:
            seen.add(case.kind)
            now += first_use_s(case, device)
        starts.append(now)
        now += estimate_s(case, rate, dtype_bytes, runs)
    return starts


def compute_share(budget_s: float, compute: int, collectives: int) -> float:
    """The compute primitives' share of a budget: by their number against the collectives' (all without them)."""
    return budget_s * compute / (compute + collectives) if collectives else budget_s


def fitted_case_s(store: Path, summary: dict, runs: int = 7) -> float:
    """Wall seconds per case timing beyond its kernels in one `tracekit sample` run: (its seconds − Σ rows' duration ·
    runs · rounds) / (cases · rounds), a case being a forward/backward pair or an optimizer step, from the run's store
    and its `--json` summary."""
    from tracekit.core.store import SampleStore

    frame = SampleStore(store).read()
    frame = frame[frame["source"] == summary["source"]]
    rounds = int(SampleStore(store).sources()[summary["source"]]["rounds"])
    kernels = float(frame["duration_us"].sum()) * 1e-6 * runs * rounds
    steps = int((frame["pass"] == "optimizer").sum())
    cases = steps + (len(frame) - steps) / 2
    return (float(summary["seconds"]) - kernels) / (cases * rounds)


def ceil_ms(seconds: float) -> float:
    return math.ceil(seconds * 1000) / 1000
