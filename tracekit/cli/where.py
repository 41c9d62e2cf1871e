"""Where a job runs, one rule for every command: `--cluster` (a preset or a YAML/JSON file), else the usual node of
`--hardware` (`tracekit.core.cluster.default_cluster`, the rule `predict --batch` and `validate --published` apply
to a row that names no system), and what was assumed, said the same way by predict, search and validate."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from .output import err_console


def cluster_of(hardware: Optional[str], gpus_per_node: Optional[int], cluster: Optional[str]):
    """(Cluster, note): the cluster named by --cluster (a preset name or a YAML/JSON file), else the usual node of
    --hardware (the note says what was assumed; '' when nothing was), else (None, '')."""
    from tracekit.core.cluster import default_cluster, load_cluster, preset
    from tracekit.core.hardware import normalize_hardware

    hw = normalize_hardware(hardware) if hardware else None
    if cluster is not None:
        path = Path(cluster)
        if path.suffix.lower() in (".yaml", ".yml", ".json") or path.exists():
            return load_cluster(path, hw, gpus_per_node), ""
        return preset(cluster, hw, gpus_per_node), ""
    if hw is None:
        return None, ""
    return default_cluster(hw, gpus_per_node)


def say_assumed(note: str, quiet: bool = False) -> None:
    """The cluster assumption, before any result, on stderr: `note: cluster dgx-a100 assumed (...)`. With --json
    (`quiet`) the document carries it instead (`warnings`)."""
    if note and not quiet:
        err_console.print(f"note: {note}", markup=False, soft_wrap=True)


def complete_hardware(incomplete: str) -> list[str]:
    """Shell completion of --hardware: the datasheet's hardware ids."""
    from tracekit.core.hardware import SPECS

    return [hw for hw in SPECS if hw.lower().startswith(incomplete.lower())]


def complete_cluster(incomplete: str) -> list[str]:
    """Shell completion of --cluster: the presets (a file name completes as the shell does)."""
    from tracekit.core.cluster import PRESETS

    return [name for name in PRESETS if name.startswith(incomplete.lower())]
