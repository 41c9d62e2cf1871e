"""`tracekit models`: list installed operator models and the data they were trained on."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .app import app
from .output import console, print_json, user_errors


@app.command(
    "models",
    help=(
        "List the operator models in a model directory (default: the bundled models shipped with tracekit): "
        "hardware, primitive, pass, variant group, samples, cross-validated error, outliers set aside, and the "
        "data they were trained on.\n\n"
        "Example: tracekit models --models .tracekit/models --json"
    ),
)
def models(
    path: Optional[Path] = typer.Option(None, "--models", help="Model directory (default: the bundled models)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of a table."),
) -> None:
    from predictor.models import ModelSet

    from .train import model_row, print_models

    with user_errors():
        model_set = ModelSet.load(path)
    index = model_set.index
    provenance = index.get("provenance", {})
    if as_json:
        print_json({"path": str(model_set.path), "created": index.get("created"), "provenance": provenance,
                    "models": [{**model_row(m), "variants": m.get("variants", []), "sources": m.get("sources", []),
                                "ranges": m.get("ranges", {}), "train_hash": m.get("train_hash")}
                               for m in model_set.summaries()],
                    "framework": index.get("framework", []), "clusters": index.get("clusters", {})})
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
    for entry in index.get("framework", []):
        console.print(f"framework time per compute operator on {entry['hardware']}, {entry['pass']}: "
                      f"{entry['per_op_us']:.1f} µs (median of {entry['samples']} sampled layers)", markup=False)
