"""Named calibrations: a few global constants that adapt operator estimates to a software stack / GPU variant the
samples were not taken on (e.g. 40 GB A100s, 2023 Megatron-DeepSpeed). Stored as JSON under
`tracekit/data/calibration/<name>.json` with how they were fitted; never applied unless asked for by name or path.

This module is the data type and its loading only: `predictor.costs.estimates` (scale factors) and
`predictor.schedule.stage_work` (overheads) apply a Calibration and import this module; fitting one, which needs
predictions, is `predictor.sweeps.calibration_fit` (so neither imports the other back).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .data_files import DATA
from .errors import InputError

CALIBRATION_DIR = DATA / "calibration"

#: The constants and what they multiply or add.
CONSTANTS = {
    "compute_scale": "× tensor-core ops (gemm, bmm, attention)",
    "memory_scale": "× memory-bound ops (norm, softmax, activation, elementwise, embedding, cross-entropy, optimizer)",
    "comm_scale": "× collectives and P2P transfers",
    "attention_scale": "× attention kernels, beyond compute_scale (a stack's attention kernel: MPT's triton flash "
                       "attention with ALiBi against the flash-attention 2 the samples ran)",
    "microbatch_overhead_us": "+ per forward or backward call of one micro-batch on one model chunk",
    "host_op_us": "host time per compute op: a layer pass's compute takes ≥ this × its compute ops",
    "op_overhead_us": "+ per compute op: framework time between operators that no device hides (eager CPU runs)",
    "iteration_overhead_us": "+ per iteration",
    "tensor_op_us": "host time per parameter tensor a per-parameter pass visits (predictor.schedule.framework_costs)",
}


@dataclass(frozen=True)
class Calibration:
    name: str = "none"
    compute_scale: float = 1.0
    memory_scale: float = 1.0
    comm_scale: float = 1.0
    attention_scale: float = 1.0
    microbatch_overhead_us: float = 0.0
    host_op_us: float = 0.0
    op_overhead_us: float = 0.0
    iteration_overhead_us: float = 0.0
    tensor_op_us: float = 0.0
    description: str = ""
    fit: dict[str, Any] = field(default_factory=dict)  # how it was obtained (data, rows, error before/after)

    def values(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in CONSTANTS}

    def with_values(self, **values: Any) -> "Calibration":
        data = asdict(self)
        data.update(values)
        return Calibration(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


NONE = Calibration()
#: The constants that are host time, which the host CPU's speed scales (a stack profile's `host_scale`).
HOST_CONSTANTS = ("host_op_us", "op_overhead_us", "microbatch_overhead_us", "iteration_overhead_us", "tensor_op_us")


def device_scaled(cal: Calibration, scale: float) -> Calibration:
    """`cal` with its tensor-core scale times `scale`: what a GPU architecture's tensor-core kernels take in sustained
    training beyond the rates its operator models give (isolated micro-benchmarks, other GPUs' efficiencies)."""
    if scale == 1.0:
        return cal
    return cal.with_values(compute_scale=cal.compute_scale * scale)


def host_scaled(cal: Calibration, scale: float) -> Calibration:
    """`cal` with its host constants (HOST_CONSTANTS) times `scale`: the same stack on a faster or slower host CPU."""
    if scale == 1.0:
        return cal
    return cal.with_values(**{k: getattr(cal, k) * scale for k in HOST_CONSTANTS})


def available() -> list[str]:
    """Names of the calibrations shipped with tracekit."""
    return sorted(p.stem for p in CALIBRATION_DIR.glob("*.json"))


def load_calibration(name_or_path: str | Path | None) -> Calibration:
    """A shipped calibration by name, or a JSON file; None/'none' → no calibration."""
    if name_or_path in (None, "", "none"):
        return NONE
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = CALIBRATION_DIR / f"{name_or_path}.json"
        if not path.exists():
            raise InputError(name_or_path, f"no such calibration (shipped: {', '.join(available()) or 'none'})")
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise InputError(path, f"not valid JSON ({exc})") from exc
    known = {f.name for f in fields(Calibration)}
    unknown = set(data) - known
    if not isinstance(data, dict) or unknown:
        raise InputError(path, f"not a calibration file (unknown keys: {sorted(unknown)})")
    data.setdefault("name", path.stem)
    return Calibration(**data)
