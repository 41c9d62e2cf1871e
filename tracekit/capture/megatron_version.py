"""Which Megatron-core a launch command runs, read from its source tree, and so where its traces land.

Megatron-core ≤ 0.16 writes its PyTorch-profiler traces through `tensorboard_trace_handler(--tensorboard-dir)`; from
0.17 on it writes `<--tensorboard-dir>/../torch_profile/rank-N.json.gz` and records shapes only with
`--pytorch-profiler-collect-shapes`, a flag the older releases' argparse refuses. So the layout is picked from the
version before the launch (`tracekit.capture.megatron_flags.LAYOUTS`).

The version is `megatron/core/package_info.py` (MAJOR, MINOR, PATCH) of the first Megatron tree found beside the
launched script or up to three folders above it (`pretrain_gpt.py` sits at the root of a Megatron-LM checkout), in
the launch's working directory, or on its `PYTHONPATH`; else the `megatron-core` distribution installed where
tracekit runs. Nothing is imported: reading the file starts no Megatron code.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from .manifest import split_launch

PACKAGE_INFO = Path("megatron") / "core" / "package_info.py"
#: The first Megatron-core release writing `torch_profile/rank-N.json.gz`.
TORCH_PROFILE_SINCE = (0, 17)
_PART = re.compile(r"^(MAJOR|MINOR|PATCH)\s*=\s*(\d+)", re.M)
_SCRIPT_PARENTS = 3


@dataclass(frozen=True)
class MegatronVersion:
    """A Megatron-core version and where it was read."""

    version: str  # "0.20.0"
    where: str  # the package_info.py read, or "installed megatron-core distribution"

    @property
    def release(self) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", self.version)[:3])

    @property
    def layout(self) -> str:
        """The trace layout this version writes."""
        return "torch_profile" if self.release[:2] >= TORCH_PROFILE_SINCE else "tensorboard"


def read_package_info(path: Path) -> str | None:
    """`MAJOR.MINOR.PATCH` of a Megatron `package_info.py`, None when the file lacks them or cannot be read."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    parts = dict(_PART.findall(text))
    if "MAJOR" not in parts or "MINOR" not in parts:
        return None
    return f"{int(parts['MAJOR'])}.{int(parts['MINOR'])}.{int(parts.get('PATCH', 0))}"


def candidate_roots(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> list[Path]:
    """Folders that may hold the launch's `megatron/` package, in the order they are tried."""
    paths = (os.environ if env is None else env).get("PYTHONPATH", "")
    cwd = cwd or Path.cwd()
    launcher, _ = split_launch(argv)
    roots: list[Path] = []
    scripts = [w for w in launcher if w.endswith(".py") and not w.startswith("-")]
    if scripts:
        folder = (cwd / scripts[-1]).resolve().parent
        roots += [folder, *list(folder.parents)[:_SCRIPT_PARENTS]]
    roots.append(cwd.resolve())
    roots += [(cwd / p).resolve() for p in paths.split(os.pathsep) if p]
    return list(dict.fromkeys(roots))


def megatron_version(argv: list[str], env: dict[str, str] | None = None,
                     cwd: Path | None = None) -> MegatronVersion | None:
    """The Megatron-core version the launch command runs (see the module docstring), None when none is found."""
    for root in candidate_roots(argv, env, cwd):
        info = root / PACKAGE_INFO
        if info.is_file():
            version = read_package_info(info)
            if version:
                return MegatronVersion(version, str(info))
    try:
        return MegatronVersion(metadata.version("megatron-core"), "installed megatron-core distribution")
    except metadata.PackageNotFoundError:
        return None
