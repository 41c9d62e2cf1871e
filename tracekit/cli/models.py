"""`tracekit models`: list installed operator models and the data they were trained on."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from .app import app
from .output import console, print_json, user_errors


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
    if as_json:
        print_json({"path": str(model_set.path), "created": index.get("created"), "provenance": provenance,
                    "models": [{**model_row(m), "variants": m.get("variants", []), "sources": m.get("sources", []),
                                "ranges": m.get("ranges", {}), "train_hash": m.get("train_hash")}
                               for m in model_set.summaries()],
                    "framework": index.get("framework", []), "clusters": index.get("clusters", {}),
                    "transfer": transfer})
        return
    console.print(f"[bold]{model_set.path}[/bold] · created {index.get('created', '?')} · "
                  f"{len(model_set.models)} models · hardware {', '.join(model_set.hardware_ids())}")
    data = provenance.get("data") or []
    for entry in data:
        console.print(f"  data: {entry}", markup=False)
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
        console.print(f"framework time per compute operator on {entry['hardware']}, {entry['pass']}: "
                      f"{entry['per_op_us']:.1f} µs (median of {entry['samples']} sampled layers)", markup=False)
