"""Transfer across hardware: estimates for a GPU that has a datasheet entry but no models, from the models of others.

Contract: `transfer(models, frame, rows) -> (duration_us, sources, out_of_range, done)` for the rows `rows` of an
operator frame (hardware, primitive, pass, dtype, variant + shape features) that no model of their own hardware and
no sibling device answered. A row qualifies when its hardware is in the datasheet table (`tracekit.core.hardware`),
its primitive is a compute primitive (collectives depend on the cluster's links, not on the GPU: the link model
answers them) and the roofline can size its work on both devices.

Method (no constant is fitted here: what is learned is the source GPUs' own models, trained on their samples
only, so an estimate for a GPU never uses that GPU's kernels). For each source GPU S with a model for the row's
primitive and pass, the model predicts the row as if it ran on S: t_S. Its fixed part f = min(KERNEL_OVERHEAD_US,
t_S / 2) (launch and latency, which do not scale with the device's peaks) is kept; the rest is an efficiency
relative to S's roofline and is applied to the target's:

    t_T = f + (t_S − f) · work_T / work_S · q_S / q_T · a_S / a_T

`work` is the roofline time without overhead on each device, max(FLOPs / peak, bytes / bandwidth) — so a row
compute-bound on one device and memory-bound on the other scales with the right rate on each — and `q` is the wave
efficiency tiles / (⌈tiles / SMs⌉ · SMs) for tensor-core primitives (GEMM, bmm, attention) where the row is
compute-bound on that device (1 elsewhere): a 132-tile GEMM fills one wave on 132 SMs and 1.22 waves on 108. `a` is
what the device's GEMMs achieve of its datasheet peak at large shapes, measured
(`predictor.costs.physics.achieved_rates`: `tracekit/data/gemm_rates.json`, from the corpus's matmul tables and
samples), for GEMM and bmm rows compute-bound on both devices (1 elsewhere, or where either is unknown): B200 reaches
60% of its dense peak in XLA's table where GH200's samples reach 81% of theirs, so a GEMM transferred from GH200 to B200
takes 1.36× its datasheet-scaled time. A GPU never measured takes its family's measured parts' (GB200 B200's), not its
die's: H200 SXM reached 68.5% where GH200 reached 81%.
Memory-bound primitives (norms, softmax, activations, element-wise) scale with the bandwidth alone, except
issue-bound rows between parts of one die: a row that is memory-bound but ran slower on the source than its
achievable HBM rate (t_S − f > work_S, the roofline's derated bandwidth) is limited by the bytes its SMs keep in
flight (occupancy, latency), not by the HBM; on another part of the same die (same SM, same per-SM concurrency:
GH200 → H100, which differ in HBM bandwidth only) that limit scales with SMs × clock, so

    t_T = f + max(work_T, (t_S − f) · (SMs_S · clock_S) / (SMs_T · clock_T))

(the HBM still bounds it from below). Across dies (A100 → H100, GH200 → B200) the per-SM concurrency differs and is
in no datasheet, so those rows keep the bandwidth scaling. Measured (`benchmarks/operator_accuracy.py --transfer`):
PyTorch's softmax forward over 82,960 rows of 5,185 bf16 on H100 is 2,171 µs, 0.79 TB/s for its 2 HBM passes, 24%
of the 3.35 TB/s peak; GH200's seed samples of the same width run at 40% of its 4 TB/s, the same ~1.6 TB/s on the
same SMs; bandwidth scaling took it 20% over, this rule 4% (the leave-one-GPU-out figures between A100 and GH200,
two dies, are unchanged by construction).

Sources are the GPUs of the target's vendor with a model for the row when there are any (NVIDIA and AMD parts run
other kernels from other libraries; rows none of them answers, e.g. outside their tables, take every GPU's), else
every GPU with one, weighted by their similarity to the target in
datasheet features (log of dense fp16 peak, HBM bandwidth, SM/CU count, L2 size and clock): weight ∝ 1 / (d + 0.05),
d the root mean square of the log ratios; the estimate is the weighted geometric mean. `sources` names them, most
similar first, e.g. "GH200-120GB 0.78, A100-SXM4-80GB 0.22". `out_of_range` is True when any source model left its
trained range.

A source model must have learned kernel times, which the transfer scales by the rooflines: models trained on the first
harvest's `tracekit sample` rows of a GPU alone are not sources (`WALL_CLOCK_SOURCES`). That sampler timed each
operator by the host's clock around a synchronize, so every row holds the launch and the synchronize with the kernel:
in the H200 set of issue #35 no row is under 35 µs, no GEMM under 53 µs (1024×1024×128: 104 µs, its roofline 6 µs); as
a source it took the median error of the transfer on the corpus's H100 GEMM kernels from 2.7% to 74%
(`benchmarks/operator_accuracy.py --transfer`). `tracekit sample` now times a GPU's kernels on the device
(`tracekit.sampling.clocks`, rows `tracekit-sample-device`), and those models are sources. Such a GPU's own
predictions use its models (path `model`).

Where the transfer is used is itself measured on source GPUs only: `tracekit/data/transfer.json` holds, per
primitive, the leave-one-GPU-out median errors of transfer and roofline on the seed paper's samples (A100's models
scoring GH200's samples and back), written by `make profiles` (tools/transfer_selection.py). A primitive takes the
transfer path when the geometric mean over both directions of (transfer error / roofline error) is below 1; the
others (and primitives never measured) keep the roofline.
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import cast

import numpy as np
import pandas as pd

from predictor.costs.features import compute_work
from predictor.costs.physics.achieved_rates import ratio
from predictor.costs.physics.roofline import KERNEL_OVERHEAD_US, TENSOR_CORE_PRIMITIVES, compute_seconds, hardware_rates
from tracekit.core.data_files import DATA
from tracekit.core.errors import ModelError
from tracekit.core.hardware import HardwareSpec, hardware_spec
from tracekit.core.samples import COLLECTIVE_PRIMITIVES, HOST_CLOCK_SOURCE

SELECTION = DATA / "transfer.json"
#: Sample sources (`source_path`) whose rows on a GPU are wall-clock times of the host around a synchronize, not
#: kernel times (the first harvest's; `tracekit sample` now times a GPU's kernels by CUDA events,
#: `DEVICE_CLOCK_SOURCE`).
WALL_CLOCK_SOURCES = frozenset({HOST_CLOCK_SOURCE})
#: Datasheet features compared to pick sources (HardwareSpec attribute names).
SIMILARITY_FEATURES = ("peak_tflops_fp16", "mem_bw_gbs", "sms", "l2_mb", "clock_mhz")
DISTANCE_FLOOR = 0.05
#: Primitives whose compute-bound rows scale by the GPUs' measured GEMM rates
#: (`predictor.costs.physics.achieved_rates`).
ACHIEVED_PRIMITIVES = ("gemm", "bmm")


@lru_cache(maxsize=1)
def selected_primitives() -> frozenset[str]:
    """Primitives whose leave-one-GPU-out errors favour transfer over the roofline (see module docstring)."""
    try:
        table = json.loads(SELECTION.read_text())["primitives"]
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"{SELECTION}: unreadable transfer selection ({exc})") from exc
    return frozenset(p for p, entry in table.items() if entry.get("use"))


def kernel_timed(model) -> bool:
    """Whether a trained model learned kernel times: not when every row it was trained on is a wall-clock sample."""
    sources = set(model.meta.get("sources") or ())
    return not sources or not sources <= WALL_CLOCK_SOURCES


def transfer_candidates(models, primitive: str, pass_: str) -> list[str]:
    """The hardware ids whose model for the primitive and pass may serve as a transfer source (kernel-timed)."""
    out = []
    for hardware in models.hardware_ids():
        model = models.resolve(hardware, primitive, pass_)
        if model is not None and kernel_timed(model):
            out.append(hardware)
    return out


def choose(leave_one_out: dict[str, dict[str, float]]) -> bool:
    """Use transfer for a primitive when the geometric mean of transfer/roofline error over the directions is < 1."""
    ratios = [v["transfer"] / v["roofline"] for v in leave_one_out.values() if v["roofline"] > 0]
    return bool(ratios) and float(np.exp(np.mean(np.log(ratios)))) < 1.0


def similarity(target: HardwareSpec, source: HardwareSpec) -> float:
    """Root mean square of the log ratios of the datasheet features (0: identical on paper)."""
    logs = [np.log(getattr(target, f) / getattr(source, f)) for f in SIMILARITY_FEATURES
            if getattr(target, f) > 0 and getattr(source, f) > 0]
    return float(np.sqrt(np.mean(np.square(logs)))) if logs else np.inf


def vendor(spec: HardwareSpec) -> str:
    """`amd` for a CDNA part (die gfx…), `nvidia` otherwise."""
    return "amd" if spec.die.startswith("gfx") else "nvidia"


def source_weights(target: str, candidates: list[str], same_vendor: bool = True) -> list[tuple[str, float]]:
    """(source, weight) for the candidate GPUs with a datasheet entry, most similar first; weights sum to 1. With
    `same_vendor`, only candidates of the target's vendor count when there are any (other kernels and libraries: on
    the H100 kernels of the corpus traces, MI355X's GEMM models among the sources took the transfer from 2.7% to 3.3%
    median error)."""
    spec = hardware_spec(target)
    if spec is None:
        return []
    specs = {hw: hardware_spec(hw) for hw in candidates}
    others = [(hw, o) for hw, o in specs.items() if o is not None and hw != target and o.name != spec.name]
    same = [(hw, o) for hw, o in others if vendor(o) == vendor(spec)] if same_vendor else []
    scored = []
    for hw, other in same or others:
        scored.append((hw, 1.0 / (similarity(spec, other) + DISTANCE_FLOOR)))
    total = sum(w for _, w in scored)
    return sorted(((hw, w / total) for hw, w in scored), key=lambda x: -x[1])


def work_us(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Roofline time of a compute row without the launch overhead (µs; NaN where the roofline cannot size it) and
    whether the row is compute-bound on its hardware."""
    t_compute, t_memory, known = compute_seconds(frame)
    return np.where(known, np.maximum(t_compute, t_memory) * 1e6, np.nan), t_compute >= t_memory


def wave_efficiency(frame: pd.DataFrame, compute_bound: np.ndarray) -> np.ndarray:
    """tiles / (⌈tiles / SMs⌉ · SMs) for compute-bound tensor-core rows, 1 elsewhere."""
    _, _, tiles = compute_work(frame)
    sms = hardware_rates(frame["hardware"].astype("string").fillna(""))["sms"]
    prim = frame["primitive"].astype("string").fillna("").to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        q = tiles / (np.ceil(tiles / sms) * sms)
    use = np.isin(prim, TENSOR_CORE_PRIMITIVES) & compute_bound & np.isfinite(q) & (q > 0)
    return np.where(use, q, 1.0)


def transfer(models, frame: pd.DataFrame, rows: np.ndarray, primitives: frozenset[str] | None = None):
    """Transfer estimates for `frame.iloc[rows]` (see module docstring) of the `primitives` given (default: the
    selected ones). Returns arrays over `rows`: duration (µs, NaN where not answered), sources (str), out_of_range
    (bool) and done (bool)."""
    n = len(rows)
    duration = np.full(n, np.nan)
    sources = np.full(n, "", dtype=object)
    oor = np.ones(n, dtype=bool)
    done = np.zeros(n, dtype=bool)
    if not n:
        return duration, sources, oor, done
    sub = frame.iloc[rows].reset_index(drop=True)
    prim = sub["primitive"].astype(str).to_numpy()
    wanted = selected_primitives() if primitives is None else primitives
    eligible = (np.isin(prim, list(wanted)) & ~np.isin(prim, COLLECTIVE_PRIMITIVES)
                & ~sub["hardware"].astype(str).str.startswith("cpu-").to_numpy())
    target_work, target_bound = work_us(sub)
    eligible &= np.isfinite(target_work) & (target_work > 0)
    target_q = wave_efficiency(sub, target_bound)
    keys = sub[["hardware", "primitive", "pass"]].astype(str)
    # pandas-stubs types a group key as Hashable; grouped by three columns, it is (hardware, primitive, pass)
    groups = cast("dict[tuple[str, str, str], pd.Index]",
                  keys[eligible].groupby(["hardware", "primitive", "pass"]).groups)
    for (hw, primitive, pass_), index in groups.items():
        pos = np.asarray(index)
        candidates = transfer_candidates(models, primitive, pass_)
        vendors = source_weights(hw, candidates)
        every = source_weights(hw, candidates, same_vendor=False)
        for weights in (vendors, every) if every != vendors else (vendors,):
            pos = pos[~done[pos]]  # rows no source of the target's vendor answered: every GPU's models
            if not len(pos) or not weights:
                continue
            _weighted(models, sub.iloc[pos], pos, weights, (target_work, target_q, target_bound), duration, sources,
                      oor, done)
    return duration, sources, oor, done


def _weighted(models, part: pd.DataFrame, pos: np.ndarray, weights: list[tuple[str, float]],
              target: tuple[np.ndarray, np.ndarray, np.ndarray], duration: np.ndarray, sources: np.ndarray,
              oor: np.ndarray, done: np.ndarray) -> None:
    """The weighted geometric mean of the sources' scaled estimates for the rows `pos` (in place); `target` is the
    target rows' (work, wave efficiency, compute-bound)."""
    target_work, target_q, target_bound = target
    left_out: frozenset[str] = getattr(models, "left_out", frozenset())
    log_sum = np.zeros(len(pos))
    weight_sum = np.zeros(len(pos))
    any_oor = np.zeros(len(pos), dtype=bool)
    used: list[str] = []
    for source, weight in weights:
        moved = part.assign(hardware=source)
        t_s, s_oor, ok = models.direct_estimates(moved)
        w_s, s_bound = work_us(moved)
        ok &= np.isfinite(t_s) & (t_s > 0) & np.isfinite(w_s) & (w_s > 0)
        if not ok.any():
            continue
        fixed = np.minimum(KERNEL_OVERHEAD_US, t_s / 2.0)
        scale = target_work[pos] / w_s * wave_efficiency(moved, s_bound) / target_q[pos]
        scale = scale * achieved(part, source, s_bound & target_bound[pos], left_out)
        t_t = fixed + (t_s - fixed) * scale
        ratio = issue_ratio(source, part)
        issue = issue_bound(part, t_s - fixed, w_s, s_bound) & np.isfinite(ratio)
        t_t = np.where(issue, fixed + np.maximum(target_work[pos], (t_s - fixed) * ratio), t_t)
        log_sum[ok] += weight * np.log(t_t[ok])
        weight_sum[ok] += weight
        any_oor[ok] |= s_oor[ok]
        used.append(f"{source} {weight:.2f}")
    hit = weight_sum > 0
    duration[pos[hit]] = np.exp(log_sum[hit] / weight_sum[hit])
    sources[pos[hit]] = ", ".join(used)
    oor[pos[hit]] = any_oor[hit]
    done[pos[hit]] = True



def achieved(part: pd.DataFrame, source: str, compute_bound: np.ndarray, left_out: frozenset[str]) -> np.ndarray:
    """a_S / a_T (`predictor.costs.physics.achieved_rates.ratio`) for GEMM and bmm rows compute-bound on both GPUs, 1
    elsewhere."""
    out = np.ones(len(part))
    gemm = np.isin(part["primitive"].astype(str).to_numpy(), ACHIEVED_PRIMITIVES) & compute_bound
    hardware = part["hardware"].astype(str).to_numpy()
    for hw in set(hardware[gemm]):
        out[gemm & (hardware == hw)] = ratio(source, str(hw), left_out)
    return out


def issue_bound(part: pd.DataFrame, variable_us: np.ndarray, work: np.ndarray, compute_bound: np.ndarray) -> np.ndarray:
    """Rows of a primitive other than GEMM, bmm and attention, memory-bound on the source, whose variable time there
    (µs) is longer than its roofline work (the derated HBM rate): bound by the bytes in flight, not by the HBM."""
    prim = part["primitive"].astype(str).to_numpy()
    return ~np.isin(prim, TENSOR_CORE_PRIMITIVES) & ~compute_bound & (variable_us > work)


def issue_ratio(source: str, part: pd.DataFrame) -> np.ndarray:
    """(SMs × clock) of the source / of each row's target GPU where both are parts of one die; NaN elsewhere
    (another SM: the bandwidth scaling applies)."""
    src = hardware_spec(source)
    out = np.ones(len(part))
    hardware = part["hardware"].astype(str).to_numpy()
    for hw in set(hardware):
        spec = hardware_spec(str(hw))
        if src is not None and spec is not None and src.die and spec.die == src.die and spec.sms > 0 \
                and spec.clock_mhz > 0 and src.sms > 0 and src.clock_mhz > 0:
            out[hardware == hw] = (src.sms * src.clock_mhz) / (spec.sms * spec.clock_mhz)
        else:
            out[hardware == hw] = np.nan
    return out
