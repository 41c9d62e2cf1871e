"""The collective algorithm model (predictor.collectives) against every measured collective table in the corpus.

Scores the α–β model over each table's cluster preset — vTrain's nccl-tests all-reduce tables of one 8×A100
NVSwitch node (as `dgx-a100`), the seed paper's NCCL samples on Perlmutter (4×A100 NVLink mesh per node, Slingshot) and
Vista (1 GH200 per node, NDR400) — beside the learned models of the bundled set on the same rows (which were
trained on these very samples, so their figure is in-sample). Prints MAPE, median and signed bias per table.

The efficiencies of `predictor.collectives.EFFICIENCY` come from these tables (one number per fabric: vTrain's
NVSwitch tables, Perlmutter's intra-node all-reduce, Vista's network all-reduce); everything else is datasheet link
rates. The Perlmutter inter-node and all-gather samples run 5–20× below those links (the seed paper's runs; see
the table): the physics does not reproduce them, and predictions for Perlmutter use the learned models where
those were sampled (`tracekit train --cluster A100-SXM4-80GB=perlmutter`).

Run: .venv/bin/python benchmarks/collective_physics.py
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from predictor.collectives import collective_us  # noqa: E402
from predictor.models import ModelSet  # noqa: E402
from tracekit.core.cluster import preset  # noqa: E402

SAMPLES = ROOT.parent / "shared" / "corpus" / "operator-samples"
KINDS = {"allreduce": "all_reduce", "allgather": "all_gather", "p2p": "send_recv"}


def tables():
    """(label, cluster, frame with the sample schema + measured duration_us) for every table."""
    for n in range(2, 9):
        t = pd.read_csv(SAMPLES / "vtrain-allreduce" / "a100" / f"AR_GPU{n}_1M_1024M_LUT.csv")
        yield (f"vTrain nccl-tests all_reduce 1x{n}", preset("dgx-a100", "A100-SXM4-40GB"), pd.DataFrame({
            "hardware": "A100-SXM4-40GB", "primitive": "all_reduce", "pass": "comm", "dtype": "fp32",
            "bytes": t["size(B)"], "numel": t["count"], "group_size": float(n), "ranks_per_node": float(n),
            "nodes": 1.0, "duration_us": t.iloc[:, 3] / 1e3}))
    for path in sorted(SAMPLES.glob("estimate-train-time/*/nccl/*_fp16_*_*.csv")):
        m = re.search(r"_(allreduce|allgather|p2p)(?:_large)?_fp16_(\d+)_(\d+)\.csv$", path.name)
        if not m:
            continue
        kind, nodes, per_node = KINDS[m.group(1)], int(m.group(2)), int(m.group(3))
        t = pd.read_csv(path)
        gh200 = "GH200" in path.name
        hardware = "GH200-120GB" if gh200 else "A100-SXM4-80GB"
        group = 2 if kind == "send_recv" else nodes * per_node
        yield (f"{'Vista' if gh200 else 'Perlmutter'} {path.stem.split('_', 1)[1]}",
               preset("vista" if gh200 else "perlmutter"), pd.DataFrame({
                   "hardware": hardware, "primitive": kind, "pass": "comm", "dtype": "fp16",
                   "bytes": t["shape"] * 2, "numel": t["shape"], "group_size": float(group),
                   "ranks_per_node": float(2 if kind == "send_recv" and nodes == 1 else 1 if kind == "send_recv"
                                           else per_node), "nodes": float(nodes), "duration_us": t["dur(us)"]}))


def main() -> None:
    models = ModelSet.load()
    print(f"{'table':<52} {'rows':>5} {'physics MAPE':>12} {'median':>7} {'bias':>7} {'learned MAPE':>12}")
    for label, cluster, frame in tables():
        measured = frame["duration_us"].to_numpy()
        physics, _ = collective_us(frame, cluster)
        learned = models.predict(frame.drop(columns="duration_us"))["duration_us"].to_numpy()
        rel = physics / measured - 1
        lrn = np.abs(learned / measured - 1)
        print(f"{label:<52} {len(frame):>5} {100 * np.abs(rel).mean():>11.1f}% {100 * np.median(np.abs(rel)):>6.1f}% "
              f"{100 * rel.mean():>+6.1f}% {100 * lrn.mean():>11.1f}%")


if __name__ == "__main__":
    main()
