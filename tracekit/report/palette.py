"""The colours of the diff page (`tracekit.report.html`): event categories, the two sides, the breakdown's parts."""
from __future__ import annotations

COLORS = {
    "computation": "#4e79a7", "communication": "#e15759", "memory": "#59a14f", "other": "#9c9c9c",
    "real": "#4e79a7", "predicted": "#f28e2b",
    # the breakdown's parts: each its own hue (the bubble was a grey beside other's grey)
    "compute": "#4e79a7", "exposed_communication": "#e15759", "pipeline_bubble": "#edc948", "optimizer": "#59a14f",
}
