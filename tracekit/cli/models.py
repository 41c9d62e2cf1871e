"""`tracekit models`: list installed operator models and the data they were trained on."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from .app import app
from .output import console, print_json, user_errors

#: Source files named per hardware in the table view.
SHOWN_FILES = 4
#: Import formats of collective samples (a file name can be both a GEMM and a collective table's).
COLLECTIVE_KINDS = ("import:xla-collectives", "import:nccl-tests")


@app.command(
    "models",
    help=(
        "List the operator models in a model directory (default: the bundled models shipped with tracekit): "
        "hardware, primitive, pass, variant group, samples, cross-validated error, outliers set aside, and the "
        "data they were trained on; then the GPUs of the datasheet table without models, whose compute operators "
        "take the `transfer` path, with their source GPUs and weights.\n\n"
        "Example: tracekit models --models .tracekit/models --json"
    ),
)
def models(
    path: Optional[Path] = typer.Option(None, "--models", help="Model directory (default: the bundled models)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of a table."),
) -> None:
    from predictor import ModelSet, selected_primitives, source_weights
    from tracekit.core.hardware import SPECS

    from .train import model_row, print_models

    with user_errors():
        model_set = ModelSet.load(path)
        primitives = sorted(selected_primitives())
    compute = [hw for hw in model_set.hardware_ids() if model_set.resolve(hw, "gemm", "fwd") is not None]
    transfer: list[dict[str, Any]] = [{"hardware": hw, "primitives": primitives,
                 "sources": [{"hardware": s, "weight": round(w, 3)} for s, w in source_weights(hw, compute)]}
                for hw in SPECS if hw not in model_set.hardware_ids() and compute
                and model_set.sibling(hw, "gemm", "fwd") is None]
    index = model_set.index
    provenance = index.get("provenance", {})
    origins = sample_origins(model_set)
    if as_json:
        print_json({"path": str(model_set.path), "created": index.get("created"), "provenance": provenance,
                    "updates": index.get("updates", []), "samples_from": origins,
                    "models": [{**model_row(m), "variants": m.get("variants", []), "sources": m.get("sources", []),
                                "ranges": m.get("ranges", {}), "train_hash": m.get("train_hash")}
                               for m in model_set.summaries()],
                    "framework": index.get("framework", []), "clusters": index.get("clusters", {}),
                    "transfer": transfer})
        return
    console.print(f"[bold]{model_set.path}[/bold] · created {index.get('created', '?')} · "
                  f"{len(model_set.models)} models · hardware {', '.join(model_set.hardware_ids())}")
    data = list(provenance.get("data") or []) + [d for u in index.get("updates", [])
                                                  for d in u.get("provenance", {}).get("data", [])]
    for entry in data:
        console.print(f"  data: {entry}", markup=False)
    for hardware, files in origins.items():
        shown = "; ".join(_described(f) for f in files[:SHOWN_FILES])
        more = f"; ... ({len(files)} files, --json lists them)" if len(files) > SHOWN_FILES else ""
        console.print(f"samples of {hardware}: {shown}{more}", markup=False)
    print_models(model_set.summaries(), f"{provenance.get('samples', '?')} samples from "
                 f"{len(provenance.get('sources', []))} source files")
    for hardware, cluster in sorted(index.get("clusters", {}).items()):
        console.print(f"collectives of {hardware} sampled on cluster {cluster}: learned models answer there, in the "
                      "topologies sampled; elsewhere the collective algorithm model does", markup=False)
    for entry in transfer:
        console.print(f"{entry['hardware']}: no models; {', '.join(entry['primitives'])} take the transfer path from "
                      + ", ".join(f"{s['hardware']} {s['weight']:.2f}" for s in entry["sources"])
                      + "; other primitives the roofline", markup=False)
    for entry in index.get("framework", []):
        if "per_unit_us" in entry:  # torch FSDP2's hooks (predictor.parallel.fsdp)
            console.print(f"torch FSDP2's hooks per unit on {entry['hardware']}, {entry['pass']}: "
                          f"{entry['per_unit_us']:.1f} µs (median of {entry['samples']} sampled layers)", markup=False)
            continue
        console.print(f"framework time per compute operator on {entry['hardware']}, {entry['pass']}: "
                      f"{entry['per_op_us']:.1f} µs (median of {entry['samples']} sampled layers)", markup=False)


def sample_origins(model_set) -> dict[str, list[dict]]:
    """Per hardware id, the source files its models were trained on (the models' `sources`), with what the training's
    provenance recorded about each (import format, repository and commit, rows refused, what it cannot tell)."""
    index = model_set.index
    recorded: dict[str, list[dict]] = {}  # file name → what each training recorded about files of that name
    for prov in [index.get("provenance", {})] + [u.get("provenance", {}) for u in index.get("updates", [])]:
        for entry in prov.get("sources", []):
            if entry.get("path"):
                recorded.setdefault(entry["path"], []).append(entry)
    out: dict[str, list[dict]] = {}
    for meta in model_set.summaries():
        files = out.setdefault(meta["hardware"], [])
        comm = meta["pass"] == "comm"
        for name in meta.get("sources", []):
            entries = recorded.get(name, [{}])
            # two files may share a name (XLA's GEMM and collective tables of H100): the one of the model's kind
            entry = next((e for e in entries if (e.get("kind", "") in COLLECTIVE_KINDS) == comm), entries[0])
            described = {"path": name, **{k: v for k, v in entry.items()
                                          if k in ("kind", "origin", "refused_rows", "unknown")}}
            if described not in files:
                files.append(described)
    return {hw: sorted(files, key=lambda f: (f["path"], f.get("kind", ""))) for hw, files in sorted(out.items())}


def _described(entry: dict) -> str:
    """`h100_sm90.csv (import:xla-gemm, tensorflow/tensorflow/...@372d578bb861, 87 rows refused)`."""
    parts = [entry["kind"]] if entry.get("kind") else []
    parts += [origin.rsplit("@", 1)[0] + "@" + origin.rsplit("@", 1)[1][:12] if "@" in origin else origin
              for origin in entry.get("origin", [])]
    if entry.get("refused_rows"):
        parts.append(f"{entry['refused_rows']} rows refused")
    if entry.get("unknown"):
        parts.append("not stated: " + ", ".join(entry["unknown"]))
    return entry["path"] + (f" ({', '.join(parts)})" if parts else "")
