"""Whether a prediction is one some run could achieve: the model FLOP rate it implies, against the GPU's peak and
against the best utilisation ever published for that GPU and precision.

Public API:

    check(config, hardware, tflops_per_gpu, fallbacks, iteration_s) -> list[str]   (warnings; raises
        PlausibilityError)
    best_published(hardware, dtype) -> Published | None
    PUBLISHED: list[Published]   (tracekit/data/published_mfu.json)

Two rules, applied to every Prediction as `predictor.predict` makes it:

- model FLOP/s per GPU above the GPU's dense tensor-core peak for the GEMM dtype
  (`HardwareSpec.peak_tflops(config.gemm_dtype)`) is impossible: the estimate is wrong, a bug in the model.
  `PlausibilityError` names the rate, the peak and the parts of the estimate behind it.
- above the best model FLOP utilisation (MFU) published for that GPU and precision (a small table with a source per
  entry) a warning names the parts of the estimate that are extrapolated (fallback paths: other GPUs' models,
  rooflines, models past their sampled range, the link model of collectives) with their share of the iteration.
  A GPU without an entry of its own takes its die's (an H200 the H100's), else the best of any GPU at that
  precision.

Model FLOPs are `predictor.architecture.flops`'s count (attention scores in full, no recompute), the same count the
published figures use or a slightly smaller one.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from tracekit.core.config import TrainingConfig
from tracekit.core.data_files import DATA
from tracekit.core.errors import InputError, PlausibilityError
from tracekit.core.hardware import PEAK_KIND, hardware_spec

TABLE = DATA / "published_mfu.json"


@dataclass(frozen=True)
class Published:
    """One published utilisation: the GPU, the peak kind (fp16, fp8, fp4, fp32), MFU (fraction), the run, a short
    citation for messages and the full source."""

    hardware: str
    precision: str
    mfu: float
    tflops_per_gpu: float
    model: str
    cite: str
    source: str


def load_table(path: Path = TABLE) -> list[Published]:
    """The published-MFU table; InputError naming the file when it is unreadable."""
    try:
        entries = json.loads(path.read_text())["entries"]
        return [Published(e["hardware"], e["precision"], float(e["mfu"]), float(e["tflops_per_gpu"]), e["model"],
                          e["cite"], e["source"]) for e in entries]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(path, f"unreadable published-MFU table ({exc})") from exc


PUBLISHED: list[Published] = load_table()


@lru_cache(maxsize=256)
def best_published(hardware: str, dtype: str) -> Published | None:
    """The best published MFU for `hardware` at the peak kind of GEMM dtype `dtype`: the GPU's own entries, else
    those of GPUs on the same die, else any GPU's; None when the table has none for that precision."""
    kind = PEAK_KIND.get(dtype, "fp16")
    same_kind = [p for p in PUBLISHED if p.precision == kind]
    spec = hardware_spec(hardware)
    die = spec.die if spec is not None else ""

    def die_of(entry: Published) -> str:
        other = hardware_spec(entry.hardware)
        return other.die if other is not None else ""

    for pool in ([p for p in same_kind if p.hardware == hardware],
                 [p for p in same_kind if die and die_of(p) == die], same_kind):
        if pool:
            return max(pool, key=lambda p: p.mfu)
    return None


#: What each estimate path means, for a sentence.
PATHS = {"transfer": "from other GPUs' models", "roofline": "from the roofline alone",
         "derived": "from a sibling GPU's models scaled by their rooflines", "physics": "from the link model",
         "model": "by models past their sampled range",
         "lowp": "from the bf16 estimate at a learned low-precision GEMM speed-up"}


def extrapolated(fallbacks: Sequence[dict], iteration_s: float) -> str:
    """`58% of the iteration from other GPUs' models (mlp.linear_fc1, mlp.linear_fc2, self_attention.linear_qkv,
    ...), 23% from the link model (ddp.bucket*.all_reduce, p2p.send_recv)`: the fallback paths by their share of an
    average GPU's iteration, largest first, naming the operators as the tables do; '' when every operator had a
    trained model within its range."""
    shares: dict[str, float] = {}
    names: dict[str, list[str]] = {}
    for f in fallbacks:
        path = f["path"] if f["path"] in PATHS else "model"
        shares[path] = shares.get(path, 0.0) + f["time_s"]
        for name in f.get("operators") or [f["variant"]]:
            if name not in names.setdefault(path, []):
                names[path].append(name)
    parts: list[str] = []
    for path in sorted(shares, key=lambda p: -shares[p]):
        share = shares[path] / max(iteration_s, 1e-12)
        listed = ", ".join(names[path][:3]) + (", ..." if len(names[path]) > 3 else "")
        parts.append(f"{100 * share:.0f}%{' of the iteration' if not parts else ''} {PATHS[path]} ({listed})")
    return ", ".join(parts)


def check(config: TrainingConfig, hardware: str, tflops_per_gpu: float, fallbacks: Sequence[dict],
          iteration_s: float) -> list[str]:
    """The plausibility of a prediction on `hardware` (the GPU the job runs on, not the one whose models answered):
    PlausibilityError above the dense peak for the GEMM dtype, a warning above the best published MFU, else []."""
    spec = hardware_spec(hardware)
    dtype = config.gemm_dtype
    peak = spec.peak_tflops(dtype) if spec is not None else 0.0
    if not peak:
        return []
    if tflops_per_gpu > peak:
        parts = extrapolated(fallbacks, iteration_s)
        raise PlausibilityError(
            f"predicted {tflops_per_gpu:.0f} model TFLOP/s per GPU on {hardware}, above its dense {dtype} peak of "
            f"{peak:g}: no run can do that, the estimate is wrong (a bug in tracekit's model, please report it); "
            + (f"estimated {parts}" if parts else "every operator from a trained model within its range"))
    best = best_published(hardware, dtype)
    mfu = tflops_per_gpu / peak
    if best is None or mfu <= best.mfu:
        return []
    where = hardware if best.hardware == hardware else f"{best.hardware} (none published for {hardware})"
    parts = extrapolated(fallbacks, iteration_s)
    return [f"predicted MFU {100 * mfu:.0f}% ({dtype}) is above the best published on {where}, "
            f"{100 * best.mfu:.0f}% ({best.cite}); "
            + (f"extrapolated: {parts}" if parts else
               "every operator had a trained model within its range: check it against a measurement")]
