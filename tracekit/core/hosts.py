"""The host CPU of each GPU's usual node (`tracekit/data/host_cpus.json`: DGX A100's EPYC, DGX H100's and B200's Xeons,
Grace): the class a stack profile's host-time scale is given per (`tracekit.core.stacks`), and the host memory
bandwidth a node's GPUs share when they copy to the host at once (`predictor.schedule.activation_offload`)."""
from __future__ import annotations

import json
import re
from functools import lru_cache

from .data_files import DATA


@lru_cache(maxsize=1)
def _host_table() -> tuple[dict[str, str], list[tuple[str, str]], list[tuple[str, float]]]:
    doc = json.loads((DATA / "host_cpus.json").read_text())
    return (doc["classes"], [(row["match"], row["host"]) for row in doc["hardware"]],
            [(row["match"], float(row["gbs_per_gpu"])) for row in doc.get("memory", [])])


def host_cpus() -> dict[str, str]:
    """Host CPU class → what it is (with its source)."""
    return dict(_host_table()[0])


def host_class(hardware: str) -> str | None:
    """The host CPU class of a hardware id's usual node (`tracekit/data/host_cpus.json`), None when not known."""
    for pattern, host in _host_table()[1]:
        if re.search(pattern, hardware):
            return host
    return None


def host_memory_gbs(hardware: str) -> float | None:
    """Host memory bandwidth per GPU of the hardware's usual node when every GPU copies at once
    (`tracekit/data/host_cpus.json`); None when not known."""
    for pattern, gbs in _host_table()[2]:
        if re.search(pattern, hardware):
            return gbs
    return None
