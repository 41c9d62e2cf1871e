"""Megatron's profiling flags for a step range, in both trace layouts Megatron has used.

- core ≤ 0.16 (`tensorboard`): torch.profiler.tensorboard_trace_handler(--tensorboard-dir) writes
  `{host}_{pid}.{ns}.pt.trace.json` per profiled rank, always with shapes.
- core ≥ 0.17 (`torch_profile`): `<--tensorboard-dir>/../torch_profile/rank-{r}.json.gz`; shapes only with
  `--pytorch-profiler-collect-shapes`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tracekit.core.errors import ConfigError

LAYOUTS = ("tensorboard", "torch_profile")
TENSORBOARD_SUBDIR = "tensorboard"


@dataclass(frozen=True)
class StepRange:
    """Profile Megatron steps [start, end): `--profile-step-start start --profile-step-end end`."""

    start: int
    end: int

    @property
    def active(self) -> int:
        return self.end - self.start

    @classmethod
    def parse(cls, text: str) -> "StepRange":
        match = re.fullmatch(r"\s*(\d+)\s*[-:]\s*(\d+)\s*", str(text))
        if not match:
            raise ConfigError(f"steps must look like START-END (e.g. 10-13), not {text!r}")
        start, end = int(match.group(1)), int(match.group(2))
        if end <= start:
            raise ConfigError(f"steps {text!r}: END must be greater than START")
        return cls(start, end)

    def __str__(self) -> str:
        return f"{self.start}-{self.end}"


def parse_ranks(text: str, world_size: int | None = None) -> list[int]:
    """`all` (needs the world size) or a comma list `0,1,4`."""
    text = str(text).strip().lower()
    if text == "all":
        if not world_size:
            raise ConfigError("--ranks all needs the world size: give --world-size N, or the ranks (--ranks 0,1,...)")
        return list(range(world_size))
    try:
        ranks = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ConfigError(f"ranks must be 'all' or a comma list of rank numbers, not {text!r}") from None
    if not ranks or ranks[0] < 0:
        raise ConfigError(f"ranks must be 'all' or a comma list of non-negative rank numbers, not {text!r}")
    if world_size and ranks[-1] >= world_size:
        raise ConfigError(f"rank {ranks[-1]} does not exist in a world of {world_size} ranks")
    return ranks


def profiling_flags(out_dir: str | Path, steps: StepRange, ranks: list[int], layout: str = "tensorboard",
                    shapes: bool = True) -> list[str]:
    """The Megatron arguments that profile `steps` on `ranks`, with traces landing under `out_dir`."""
    if layout not in LAYOUTS:
        raise ConfigError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    if steps.active < 3:
        raise ConfigError(f"profile at least 3 steps (the last one is often cut); {steps} has {steps.active}")
    flags = [
        "--profile", "--use-pytorch-profiler",
        "--profile-step-start", str(steps.start), "--profile-step-end", str(steps.end),
        "--profile-ranks", *[str(r) for r in ranks],
        "--tensorboard-dir", str(Path(out_dir) / TENSORBOARD_SUBDIR),
    ]
    if layout == "torch_profile" and shapes:
        flags.append("--pytorch-profiler-collect-shapes")
    return flags


def expected_trace_globs(layout: str) -> list[str]:
    """Where the traces of each layout land, relative to the capture directory."""
    if layout == "torch_profile":
        return ["torch_profile/rank-*.json.gz"]
    return [f"{TENSORBOARD_SUBDIR}/*.pt.trace.json", f"{TENSORBOARD_SUBDIR}/*.pt.trace.json.gz"]
