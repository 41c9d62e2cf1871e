"""The capture manifest: what ran, on what, with which configuration, how long its iterations took, where its
traces are, and whether it succeeded. Saved as `manifest.json` beside the traces and the log."""
from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from extractors.jobs.megatron import ARGS_BEGIN, config_from_log, parse_iteration_times_ms, parse_megatron_argv
from tracekit.core.atomic import atomic_write_json
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError, InputError
from tracekit.core.hardware import cpu_hardware_id, normalize_hardware
from tracekit.core.redact import redact, redact_argv

from .megatron_flags import StepRange

MANIFEST_NAME = "manifest.json"
#: Megatron's log line: `iteration       5/      10 | ... | elapsed time per iteration (ms): 12.3 | ...`
ITERATION_NUMBER = re.compile(r"iteration\s+(\d+)/\s*\d+\s*\|[^\n]*?elapsed time per iteration \(ms\)")
LOG_NAME = "train.log"
_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


@dataclass
class Manifest:
    status: str  # "ok" | "failed"
    exit_code: int
    command: list[str]
    mode: str  # "megatron" (its profiling flags) | "hook" (import hook around optimizer steps)
    layout: str | None  # megatron mode: where the traces were found, "tensorboard" (core ≤ 0.16) | "torch_profile"
    steps: str
    configuration: dict | None
    configuration_source: str | None  # "log" (arguments block) | "argv" | None
    configuration_error: str | None
    world_size: int | None
    topology: dict
    software: dict
    gpu_model: str | None
    hardware: str
    iteration_times_ms: list[float]
    traces: list[str]  # relative to the capture directory
    log: str = LOG_NAME
    started_at: str = ""
    wall_s: float = 0.0
    ingest: dict | None = None
    notes: list[str] = field(default_factory=list)
    iterations: list[int] = field(default_factory=list)  # log iteration number of each iteration_times_ms value
    profiled_iterations: list[int] = field(default_factory=list)  # their times include the profiler (warm-up,
    # recorded steps, trace export): on CPU runs that inflates them noticeably
    layout_source: str | None = None  # megatron mode: which layout was asked for, why, and where traces were found

    def unprofiled_iteration_times_ms(self) -> list[float]:
        """Iteration times of the log lines whose iterations ran without the profiler."""
        skip = set(self.profiled_iterations)
        if len(self.iterations) != len(self.iteration_times_ms):
            return []
        return [t for i, t in zip(self.iterations, self.iteration_times_ms) if i not in skip]

    def to_dict(self) -> dict[str, Any]:
        data = redact(asdict(self))
        data["command"] = redact_argv(self.command)
        return data

    def write(self, out_dir: str | Path) -> Path:
        path = Path(out_dir) / MANIFEST_NAME
        atomic_write_json(path, self.to_dict())
        return path

    @classmethod
    def load(cls, out_dir: str | Path) -> "Manifest":
        path = Path(out_dir) / MANIFEST_NAME
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise InputError(path, f"not a readable capture manifest ({exc})") from exc
        return cls(**data)

    def config(self) -> TrainingConfig | None:
        """The run's TrainingConfig, or None when it could not be parsed."""
        if not self.configuration:
            return None
        return TrainingConfig.from_mapping(dict(self.configuration))  # to_dict's form: sections and `extra` read back


# -- pieces of the manifest ----------------------------------------------------------------------------------------
def split_launch(argv: list[str]) -> tuple[list[str], list[str]]:
    """(launcher words up to and including the script or `-m module`, the script's own arguments)."""
    for i, word in enumerate(argv):
        if word == "-m" and i + 1 < len(argv) and not any(argv[i + 1].endswith(name) for name in _LAUNCHERS):
            return argv[: i + 2], argv[i + 2:]
        if word.endswith(".py") and not word.startswith("-"):
            return argv[: i + 1], argv[i + 1:]
    return argv, []


def launcher_world(argv: list[str]) -> tuple[int | None, int]:
    """(ranks per node, nodes) from torchrun's flags; (1, 1) for a plain `python script.py`; None when unknown."""
    launcher, _ = split_launch(argv)
    if not any(any(w.endswith(name) for name in _LAUNCHERS) for w in launcher):
        plain = launcher and Path(launcher[0]).name.startswith("python")
        return (1 if plain else None), 1

    def flag(*names: str) -> str | None:
        for i, word in enumerate(launcher):
            for name in names:
                if word == name and i + 1 < len(launcher):
                    return launcher[i + 1]
                if word.startswith(name + "="):
                    return word.split("=", 1)[1]
        return None

    per_node = flag("--nproc-per-node", "--nproc_per_node")
    nodes = flag("--nnodes")
    per_node_count = int(per_node) if per_node and per_node.isdigit() else (1 if per_node is None else None)
    node_count = int(nodes) if nodes and nodes.isdigit() else 1
    return per_node_count, node_count


def configuration(log_text: str, argv: list[str], world_size: int | None
                  ) -> tuple[TrainingConfig | None, str | None, str | None]:
    """The run's configuration: the log's arguments block first (it has Megatron's derived values), else the
    Megatron flags in argv. Returns (config, source, error)."""
    errors = []
    if ARGS_BEGIN.search(log_text):
        try:
            return config_from_log(log_text, LOG_NAME), "log", None
        except (ConfigError, InputError) as exc:
            errors.append(str(exc))
    _, script_args = split_launch(argv)
    if "--num-layers" in script_args:
        try:
            mapping = parse_megatron_argv(script_args)
            if world_size:
                mapping.setdefault("world_size", world_size)
            return TrainingConfig.from_mapping(mapping), "argv", None
        except ConfigError as exc:
            errors.append(str(exc))
    return None, None, "; ".join(errors) or "no Megatron arguments in the log or the command line"


def software_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for dist in ("tracekit", "torch", "megatron-core", "transformer-engine"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return versions


def gpu_model() -> str | None:
    """First GPU's name from nvidia-smi (no torch import, no CUDA context), or None."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return names[0] if names else None


def build(out_dir: Path, argv: list[str], exit_code: int, mode: str, layout: str | None, step_range: StepRange,
          traces: list[Path], started_at: str, wall_s: float) -> Manifest:
    """Assemble the manifest of a finished (or failed) launch from its log and argv."""
    log_path = out_dir / LOG_NAME
    log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
    per_node, nodes = launcher_world(argv)
    world = per_node * nodes if per_node else None
    config, source, error = configuration(log_text, argv, world)
    if config is not None and world is None:
        world = config.world_size
    gpu = gpu_model()
    topology = {"nodes": nodes, "ranks_per_node": per_node or (world // nodes if world else None)}
    if config is not None:
        topology.update(tp=config.tp, pp=config.pp, cp=config.cp, dp=config.dp)
    return Manifest(
        status="ok" if exit_code == 0 else "failed",
        exit_code=exit_code,
        command=list(argv),
        mode=mode,
        layout=layout,
        steps=str(step_range),
        configuration=config.to_dict() if config else None,
        configuration_source=source,
        configuration_error=error,
        world_size=world,
        topology=topology,
        software=software_versions(),
        gpu_model=gpu,
        hardware=normalize_hardware(gpu) if gpu else cpu_hardware_id(),
        iteration_times_ms=parse_iteration_times_ms(log_text),
        iterations=[int(n) for n in ITERATION_NUMBER.findall(log_text)],
        profiled_iterations=list(range(max(step_range.start - 1, 1), step_range.end + 1)),
        traces=sorted(str(p.relative_to(out_dir)) for p in traces),
        started_at=started_at,
        wall_s=round(wall_s, 3),
    )
