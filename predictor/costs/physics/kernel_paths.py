"""Kernel paths an unaligned shape forces on NVIDIA GPUs, and what they cost (issue #24, item 5).

The tables and samples the models learn from hold aligned shapes only (every XLA grid dimension is a multiple of
256, every seed-paper dimension a multiple of 8). A shape whose rows are not a whole number of 16-byte vectors
runs other kernels, which no model has seen:

- GEMM / bmm in half precision with an odd k or n (the leading dimensions of A, B or C): a row of 2-byte elements
  that is not a whole number of 4 bytes cannot be copied asynchronously at all (cp.async moves 4, 8 or 16 bytes;
  TMA needs 16), so cuBLAS falls back to `align1` kernels (on Hopper the sm75 `s1688` kernels), which move every
  element of A, B and C through the SM one scalar load or store at a time. (An even k or n that is not a multiple
  of 8 still runs the sm80 cp.async kernels, `align2`/`align4`: on the H100 traces these are within the models'
  error, e.g. BERT's 30522-wide head at 41 µs, and keep their estimate.) Their time
  is the element traffic of a 128×128-tiled GEMM, b·(m·k·⌈n/128⌉ + n·k·⌈m/128⌉ + m·n), at a rate per SM per
  clock that does not depend on the tensor cores: `scalar_gemm_elements_per_sm_clock` in
  `tracekit/data/kernel_paths.json`, measured on the A100 `align1` GEMM kernels of the corpus's HTA traces (another
  GPU's traces: no H100 kernel is used) by `make profiles` (benchmarks/fit_kernel_paths.py). On those kernels the
  element traffic explains the time with a 21% median spread where the FLOP rate spreads 34%.
  The rate transfers to another NVIDIA GPU by its SM's FP32 lanes (`fp32_lanes_per_sm`: the datasheet's FP32
  vector peak / (2 FLOPs · SMs · clock), 64 on GA100 and 128 on GH100 as the A100 and H100 architecture
  whitepapers state, "2x faster clock-for-clock performance per SM"), so a Hopper SM moves twice the elements per
  clock of an Ampere SM. (The kernels are `tensorop` kernels: their MMAs run on the tensor cores, but at 169
  FLOPs per SM per clock on the fit kernels, 8% of the A100's 2048, they are bound by the scalar data movement
  through the SM, not by the MMAs; the whitepaper doubles the per-SM rate clock-for-clock for both.)
  The clock is the one the part runs tensor-core kernels at (`tensor_clock_hz`): the datasheet quotes the dense
  fp16 tensor peak at it, so it is peak / (SMs · dense FLOPs per SM per clock of the whitepaper: 2048 on GA100,
  4096 on GH100). On A100 it is the table's 1,410 MHz; on H100 SXM 989.4 TFLOP/s / (132 · 4096) = 1,830 MHz, below
  the 1,980 MHz the FP32 peak is quoted at (H100 PCIe: 1,620 against 1,755). The fit uses the same clock.
- PyTorch's softmax forward over rows wider than 1024 keeps a row in shared memory only when its width is a
  multiple of the 16-byte vector; otherwise it reads the row from global memory three times (max, sum, write) and
  writes it once: 4 global passes instead of 2, so the aligned estimate's variable part doubles.

`apply(frame, duration)` raises the estimates of such rows in place (never lowers one: an unaligned shape is never
predicted faster than the aligned one). AMD parts and CPUs are left as they are (other libraries, other rules).

GPU-side floor. Every roofline estimate carries `roofline.KERNEL_OVERHEAD_US` (5 µs: one kernel launch, host side
included). A kernel's duration in a trace is GPU-side only: the shortest compute kernel of the corpus's A100 traces
(HTA, another GPU's traces) lasts `gpu_kernel_floor_us` (2 µs), written by `make profiles`.
`gpu_side(frame, duration, path)` takes the host part (5 µs − floor) off the roofline answers of NVIDIA GPUs, never
below the floor, except for tensor-core primitives (GEMM, bmm, attention): a tiled GEMM kernel's own fixed time is
about the 5 µs (the shortest GEMM kernel of the same A100 traces lasts 4 µs; XLA's H100, B200 and MI300X grids'
fastest GEMMs, 256³, 4.5–5.2 µs; a 4 µs GEMM floor put the B200 grid, scored from the set without B200, at 20%
instead of 11%), and the scalar GEMM path keeps it too. Model and transfer answers keep theirs: the regressor
learns time / roofline from measured kernels, so its answers carry the fixed cost its GPU measured (taking 3 µs off
the H100 transfer answers too made GEMM 13% and norm 31% off instead of 3% and 11%). The host cost of a launch
stays where the schedule charges it: `stage_work`'s per-op host time.
"""
from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import pandas as pd

from predictor.costs.features import dtype_bytes, numeric_column
from predictor.costs.physics.roofline import KERNEL_OVERHEAD_US, TENSOR_CORE_PRIMITIVES
from predictor.costs.physics.transfer import vendor
from tracekit.core.data_files import DATA
from tracekit.core.errors import ModelError
from tracekit.core.hardware import hardware_spec
from tracekit.core.samples import COLLECTIVE_PRIMITIVES

CONSTANTS = DATA / "kernel_paths.json"
#: Bytes of one vectorised load (LDG.128, TMA): a softmax row that is not a multiple stays out of shared memory.
VECTOR_BYTES = 16
#: The smallest asynchronous copy (cp.async): a GEMM leading dimension that is not a multiple takes the scalar path.
ASYNC_COPY_BYTES = 4
#: The tile whose element traffic the scalar GEMM path is charged with (the fit assumes the same).
TILE = 128
#: PyTorch's softmax forward takes the per-row warp kernel up to this width, the block kernel above it.
WARP_SOFTMAX_MAX_WIDTH = 1024
#: Global passes of the block softmax without (3 reads + 1 write) and with (1 read + 1 write) the row in shared memory.
SOFTMAX_PASSES = (4, 2)
SOFTMAX_VARIANTS = ("aten::_softmax", "aten::softmax", "softmax")
#: Dense fp16 tensor-core FLOPs per SM per clock, from the architecture whitepapers: GV100 8 tensor cores × 64 FMA,
#: GA100 4 × 256 FMA, GH100 4 × 512 FMA ("2x the MMA rates of the A100 SM on equivalent data types").
DENSE_FP16_FLOPS_PER_SM_CLOCK = {"GV100": 1024, "GA100": 2048, "GH100": 4096}
HALF = ("fp16", "bf16", "float16", "bfloat16")


@lru_cache(maxsize=1)
def constants() -> dict:
    """The fitted constants (`tracekit/data/kernel_paths.json`)."""
    try:
        data = json.loads(CONSTANTS.read_text())
        float(data["scalar_gemm_elements_per_sm_clock"])
        float(data["gpu_kernel_floor_us"])
        str(data["fit"]["hardware"][0])
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise ModelError(f"{CONSTANTS}: unreadable kernel-path constants ({exc})") from exc
    return data


def _nvidia(hardware: np.ndarray) -> np.ndarray:
    """Per row: an NVIDIA GPU of the datasheet table (with its SM count and clock)."""
    out = np.zeros(len(hardware), dtype=bool)
    for hw in set(hardware):
        spec = hardware_spec(str(hw)) if not str(hw).startswith("cpu-") else None
        if spec is not None and vendor(spec) == "nvidia" and spec.sms > 0 and spec.clock_mhz > 0:
            out[hardware == hw] = True
    return out


def tensor_clock_hz(hardware: str) -> float:
    """The clock (Hz) a tensor-core kernel runs at: the one the datasheet's dense fp16 tensor peak is quoted at,
    peak / (SMs · dense fp16 FLOPs per SM per clock of the die's whitepaper), never above the table's clock (which
    is the FP32 figure's); the table's clock where the die's per-SM tensor rate is not listed; NaN where unknown."""
    spec = hardware_spec(hardware)
    if spec is None or spec.sms <= 0 or spec.clock_mhz <= 0:
        return float("nan")
    per_sm = DENSE_FP16_FLOPS_PER_SM_CLOCK.get(spec.die)
    clock = spec.clock_mhz * 1e6
    if per_sm is None or spec.peak_tflops_fp16 <= 0:
        return clock
    return min(clock, spec.peak_tflops_fp16 * 1e12 / (spec.sms * per_sm))


def _sm_clock(hardware: np.ndarray) -> np.ndarray:
    """SMs × tensor clock (Hz) per row, NaN where unknown."""
    out = np.full(len(hardware), np.nan)
    for hw in set(hardware):
        spec = hardware_spec(str(hw))
        if spec is not None:
            out[hardware == hw] = spec.sms * tensor_clock_hz(str(hw))
    return out


def fp32_lanes_per_sm(hardware: str) -> float:
    """FP32 lanes of one SM (FMAs per SM per clock) from the datasheet table: FP32 vector peak / (2 · SMs · clock);
    NaN where unknown."""
    spec = hardware_spec(hardware)
    if spec is None or spec.sms <= 0 or spec.clock_mhz <= 0 or spec.peak_tflops_fp32 <= 0:
        return float("nan")
    return spec.peak_tflops_fp32 * 1e12 / (2.0 * spec.sms * spec.clock_mhz * 1e6)


def scalar_rate(hardware: str) -> float:
    """Elements per SM per clock of the scalar GEMM path on `hardware`: the fitted rate times the ratio of its SM's
    FP32 lanes to the fit GPU's."""
    data = constants()
    fit_hw = str(data["fit"]["hardware"][0])
    return float(data["scalar_gemm_elements_per_sm_clock"]) * fp32_lanes_per_sm(hardware) / fp32_lanes_per_sm(fit_hw)


def gpu_floor_us() -> float:
    """The GPU-side duration of the shortest compute kernel (µs)."""
    return float(constants()["gpu_kernel_floor_us"])


def misaligned(elements: np.ndarray, size: np.ndarray, unit: int = VECTOR_BYTES) -> np.ndarray:
    """A dimension whose rows are not a whole number of `unit` bytes (False where unknown)."""
    with np.errstate(invalid="ignore"):
        return np.isfinite(elements) & (np.mod(elements * size, unit) != 0)


def scalar_gemm_elements(m: np.ndarray, n: np.ndarray, k: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """Elements a 128×128-tiled GEMM moves through the SMs: A once per column of tiles, B once per row of tiles, C
    once."""
    b = np.where(np.isfinite(batch) & (batch > 0), batch, 1.0)
    return b * (m * k * np.ceil(n / TILE) + n * k * np.ceil(m / TILE) + m * n)


def unaligned_gemm(frame: pd.DataFrame) -> np.ndarray:
    """Half-precision GEMM/bmm rows on NVIDIA GPUs whose k or n rows are not a whole number of 4 bytes (odd)."""
    prim = frame["primitive"].astype("string").fillna("").to_numpy()
    dtype = frame["dtype"].astype("string").fillna("").str.lower().to_numpy() if "dtype" in frame.columns \
        else np.full(len(frame), "")
    size = dtype_bytes(frame["dtype"] if "dtype" in frame.columns else None, len(frame))
    rows = np.isin(prim, ("gemm", "bmm")) & np.isin(dtype, HALF)
    m, n, k = numeric_column(frame, "m"), numeric_column(frame, "n"), numeric_column(frame, "k")
    rows &= (m > 1) & (n > 1)  # a matrix-vector product runs a GEMV kernel, not a tiled GEMM
    rows &= misaligned(k, size, ASYNC_COPY_BYTES) | misaligned(n, size, ASYNC_COPY_BYTES)
    if rows.any():
        rows &= _nvidia(frame["hardware"].astype(str).to_numpy())
    return rows


def scalar_gemm_us(frame: pd.DataFrame) -> np.ndarray:
    """Time (µs) of each row on the scalar (`align1`) GEMM path: a GEMM kernel's fixed time + element traffic at
    the GPU's rate per SM per clock (`scalar_rate`; NaN where the shape or the GPU is unknown)."""
    hardware = frame["hardware"].astype(str).to_numpy()
    rate = np.full(len(frame), np.nan)
    for hw in set(hardware):
        rate[hardware == hw] = scalar_rate(str(hw))
    elements = scalar_gemm_elements(*(numeric_column(frame, name) for name in ("m", "n", "k", "batch")))
    return KERNEL_OVERHEAD_US + elements / (rate * _sm_clock(hardware)) * 1e6


def unaligned_softmax(frame: pd.DataFrame) -> np.ndarray:
    """PyTorch softmax forward rows on NVIDIA GPUs wider than the warp kernel's limit whose width is not a multiple
    of the 16-byte vector (no shared-memory copy of the row)."""
    prim = frame["primitive"].astype("string").fillna("").to_numpy()
    pass_ = frame["pass"].astype("string").fillna("").to_numpy()
    variant = frame["variant"].astype("string").fillna("softmax").to_numpy() if "variant" in frame.columns \
        else np.full(len(frame), "softmax")
    width = numeric_column(frame, "width")
    size = dtype_bytes(frame["dtype"] if "dtype" in frame.columns else None, len(frame))
    rows = (prim == "softmax") & (pass_ == "fwd") & np.isin(variant, SOFTMAX_VARIANTS)
    rows &= (width > WARP_SOFTMAX_MAX_WIDTH) & misaligned(width, size)
    if rows.any():
        rows &= _nvidia(frame["hardware"].astype(str).to_numpy())
    return rows


def apply(frame: pd.DataFrame, duration: np.ndarray) -> np.ndarray:
    """Raise the aligned estimates `duration` (µs, per row of `frame`) of unaligned rows to their kernel path's
    time, in place; returns which rows changed."""
    changed = np.zeros(len(frame), dtype=bool)
    gemm = np.flatnonzero(unaligned_gemm(frame))
    if len(gemm):
        scalar = scalar_gemm_us(frame.iloc[gemm])
        raise_ = np.isfinite(scalar) & (scalar > duration[gemm])
        duration[gemm[raise_]] = scalar[raise_]
        changed[gemm[raise_]] = True
    soft = np.flatnonzero(unaligned_softmax(frame) & np.isfinite(duration))
    if len(soft):
        fixed = np.minimum(gpu_floor_us(), duration[soft] / 2.0)
        duration[soft] = fixed + (duration[soft] - fixed) * SOFTMAX_PASSES[0] / SOFTMAX_PASSES[1]
        changed[soft] = True
    return changed


def gpu_side(frame: pd.DataFrame, duration: np.ndarray, path: np.ndarray) -> np.ndarray:
    """Take the host part of the launch term (`KERNEL_OVERHEAD_US` − floor) off the roofline answers (µs, in place)
    of NVIDIA GPUs' compute rows other than GEMM, bmm and attention, never below the GPU-side floor; returns which
    rows changed."""
    floor = gpu_floor_us()
    prim = frame["primitive"].astype("string").fillna("").to_numpy()
    rows = (path.astype(str) == "roofline") & ~np.isin(prim, (*COLLECTIVE_PRIMITIVES, *TENSOR_CORE_PRIMITIVES))
    rows &= np.isfinite(duration)
    if rows.any():
        rows &= _nvidia(frame["hardware"].astype(str).to_numpy())
    duration[rows] = np.maximum(floor, duration[rows] - (KERNEL_OVERHEAD_US - floor))
    return rows
