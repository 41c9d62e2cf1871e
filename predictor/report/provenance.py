"""How much of a prediction rests on what: its operators' time on an average GPU, split by how each operator was
estimated — a trained model within its sampled range, a trained model past it, models derived from a sibling GPU's,
transfer from other GPUs' models (which ones), the low-precision GEMM speed-up of a bf16 estimate, the roofline, the
link model of the collectives — each part naming its operators as the tables do (the module paths of
`top_operators`: `mlp.linear_fc1`, `ddp.bucket*.all_reduce` for the numbered families), each once.

    operator_names(graph, dur) -> dict              spec → the kind names of its operators with their time (one walk
                                                    of the graph; both functions below take it)
    provenance(graph, est, dur, counts) -> dict     {operator_time_s, parts[{path, out_of_range, what, share, time_s,
                                                    operators, sources}]}, parts largest first, trained models first
    sentence(doc) -> str                            the one line `predict` prints above its answer
    fallbacks(graph, est, dur, counts) -> list      the operators no trained model estimated within its range, one
                                                    entry per kind, with their module names
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from predictor.ir.graph import Graph
from predictor.report.tables import stage_ops

if TYPE_CHECKING:
    from predictor.costs.estimates import Estimates

#: What each estimate path is, as the line says it.
WHAT = {("model", False): "from trained models", ("model", True): "from trained models past their sampled range",
        ("derived", False): "from a sibling GPU's models scaled by their rooflines",
        ("transfer", False): "transferred from other GPUs' models",
        ("lowp", False): "from the bf16 estimate at a low-precision speed-up", ("roofline", False): "from the roofline",
        ("physics", False): "from the collectives' link model"}
#: Names listed per part on the line (the rest counted; `--json` has them all).
LISTED = 3
_NUMBERED = re.compile(r"(?<=bucket)\d+|(?<=chunk)\d+|(?<=newton_schulz)\d+|(?<=\.)\d+(?=\.|$)")


@lru_cache(maxsize=8192)
def kind_name(name: str) -> str:
    """A module path with its instance number made `*` (`ddp.bucket7.all_reduce` → `ddp.bucket*.all_reduce`,
    `self_attention.cp_kv.2` → `self_attention.cp_kv.*`): one name per kind of operator."""
    return _NUMBERED.sub("*", name)


def _part(path: str, out_of_range: bool) -> tuple[str, bool]:
    """The part an estimate belongs to: past the range only matters for a trained model's own answer."""
    return (path, out_of_range) if path == "model" else (path if (path, False) in WHAT else "roofline", False)


def operator_names(graph: Graph, dur: np.ndarray) -> dict[int, dict[str, float]]:
    """Spec → the kind names of its operators (`kind_name`, in the order the stages run them) with their time."""
    names: dict[int, dict[str, float]] = {}
    for stage in range(graph.config.pp):
        for op, n in stage_ops(graph, stage):
            slot = names.setdefault(op.spec, {})
            name = kind_name(op.name)
            slot[name] = slot.get(name, 0.0) + n * float(dur[op.spec])
    return names


def provenance(graph: Graph, est: Estimates, dur: np.ndarray, counts: np.ndarray,
               names: dict[int, dict[str, float]] | None = None) -> dict:
    """The operator time of an average GPU per iteration by how it was estimated (module docstring); `names`:
    `operator_names(graph, dur)` when the caller has it."""
    time_of = counts.mean(axis=0) * dur / 1e6  # seconds per iteration on an average GPU
    names = operator_names(graph, dur) if names is None else names
    parts: dict[tuple[str, bool], dict] = {}
    sources = est.sources or [""] * len(est.path)
    for i, seconds in enumerate(time_of):
        if seconds <= 0 and i not in names:
            continue
        key = _part(est.path[i], bool(est.out_of_range[i]))
        part = parts.setdefault(key, {"time_s": 0.0, "operators": {}, "sources": []})
        part["time_s"] += float(seconds)
        for name, t in names.get(i, {}).items():
            part["operators"][name] = part["operators"].get(name, 0.0) + t
        for source in _gpus(sources[i]) if key[0] == "transfer" else ():
            if source not in part["sources"]:
                part["sources"].append(source)
    total = sum(p["time_s"] for p in parts.values())
    order = sorted(parts, key=lambda k: (k != ("model", False), -parts[k]["time_s"]))
    return {"operator_time_s": total, "parts": [
        {"path": key[0], "out_of_range": key[1], "what": WHAT[key], "share": parts[key]["time_s"] / total if total
         else 0.0, "time_s": parts[key]["time_s"],
         "operators": [n for n, _ in sorted(parts[key]["operators"].items(), key=lambda kv: -kv[1])],
         "sources": parts[key]["sources"]} for key in order]}


def fallbacks(graph: Graph, est: Estimates, dur: np.ndarray, counts: np.ndarray,
              names: dict[int, dict[str, float]] | None = None) -> list[dict]:
    """The operators no trained model estimated within its range: one entry per kind (primitive, pass, variant,
    path, out_of_range), with the kind names of its operators (`operators`) and their time on an average GPU per
    iteration, largest first; `names`: `operator_names(graph, dur)` when the caller has it."""
    time_of = counts.mean(axis=0) * dur / 1e6
    names = operator_names(graph, dur) if names is None else names
    kinds: dict[tuple, dict] = {}
    for i, spec in enumerate(graph.specs):
        if (est.path[i] == "model" and not est.out_of_range[i]) or i not in names:
            continue
        key = (spec["primitive"], spec["pass"], spec["variant"], est.path[i], bool(est.out_of_range[i]))
        entry = kinds.setdefault(key, {"primitive": key[0], "pass": key[1], "variant": key[2], "path": key[3],
                                       "out_of_range": key[4], "operators": [], "time_s": 0.0})
        entry["time_s"] += float(time_of[i])
        entry["operators"] += [n for n in names[i] if n not in entry["operators"]]
    return sorted(kinds.values(), key=lambda f: -f["time_s"])


def _gpus(sources: str) -> list[str]:
    """The GPU ids of a transfer answer's `sources` (`H100-80GB-HBM3 0.62, A100-SXM4-80GB 0.38`)."""
    return [item.strip().rsplit(" ", 1)[0] for item in str(sources).split(",") if item.strip()]


def _percent(share: float) -> str:
    return "<1%" if 0 < share < 0.005 else f"{100 * share:.0f}%"


def sentence(doc: dict) -> str:
    """`estimates: 30% of the operator time from trained models, 45% from trained models past their sampled range
    (mlp.linear_fc1, mlp.linear_fc2, self_attention.core_attention, +4 more), ...`: every part, largest first after
    the trained models' own."""
    out = []
    for i, part in enumerate(doc["parts"]):
        what = part["what"]
        if part["path"] == "transfer" and part["sources"]:
            what = f"transferred from the models of {', '.join(part['sources'])}"
        names = "" if (part["path"], part["out_of_range"]) == ("model", False) else \
            " (" + ", ".join(part["operators"][:LISTED]) + (f", +{len(part['operators']) - LISTED} more"
                                                            if len(part["operators"]) > LISTED else "") + ")"
        out.append(f"{_percent(part['share'])}{' of the operator time' if i == 0 else ''} {what}"
                   f"{names if part['operators'] else ''}")
    return "estimates: " + ", ".join(out)


def rests_on_fallbacks(doc: dict) -> bool:
    """Whether any of the operator time is estimated otherwise than by a trained model within its range."""
    return any((p["path"], p["out_of_range"]) != ("model", False) and p["time_s"] > 0 for p in doc["parts"])
