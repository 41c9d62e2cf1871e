"""FSDP's collectives matched to their units. PyTorch FSDP2 (`fully_shard`) wraps its work in record_function
ranges that name the unit's module: `FSDP::all_gather (layers.0)`, `FSDP::post_backward_reduce (layers.0)`,
`FSDP::backward_prefetch for layers.0`; the root unit's ranges carry no name (`FSDP::all_gather`) or an empty one
(`FSDP::post_backward_rs_wait ()`). The all-gather or reduce-scatter a unit issues nests in its range; its `layer`
is then the unit (`layers.0`, `root`) rather than the range's label."""
from __future__ import annotations

import re

_RANGE = re.compile(r"^FSDP::\w+(?: \((?P<fqn>[^)]*)\)| for (?P<prefetched>\S+))?$")
ROOT = "root"


def fsdp_unit(label: str | None) -> str | None:
    """The FSDP unit an FSDP2 range names (`root` for the root module), or None when `label` is no FSDP range."""
    if not label:
        return None
    match = _RANGE.match(label)
    if match is None:
        return None
    return match.group("fqn") or match.group("prefetched") or ROOT


def unit_or_label(label: str | None) -> str | None:
    """What the `layer` column holds for an operator under `label`: its FSDP unit when the label is an FSDP range,
    else the label itself."""
    unit = fsdp_unit(label)
    return unit if unit is not None else label
