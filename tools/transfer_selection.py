"""Which primitives take the transfer path (`tracekit/data/transfer.json`), measured on source GPUs only.

Leave-one-GPU-out on the seed paper's compute samples (estimate-train-time: A100-SXM4-80GB on Perlmutter, GH200 on
Vista): the bundled models without one of the two GPUs score that GPU's samples through the transfer path (from the
other GPU's models) and through the plain roofline; per primitive and direction, the median absolute percentage
error of each. A primitive takes the transfer path when the geometric mean over both directions of transfer /
roofline error is below 1 (`predictor.costs.physics.transfer.choose`). Written by `make profiles`
(tools/fit_profiles.py); `benchmarks/operator_accuracy.py --transfer` prints the same figures beside the corpus traces'
kernels.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from extractors import ett
from predictor.costs.learned.model_keys import deduplicate
from predictor.costs.learned.regressor import faster_than_peak
from predictor.costs.physics.roofline import estimate_us
from predictor.costs.physics.transfer import choose
from tracekit.core.samples import COLLECTIVE_PRIMITIVES, COMPUTE_PRIMITIVES

#: The two GPUs of the seed samples, each left out in turn.
GPUS = ("GH200-120GB", "A100-SXM4-80GB")


def seed_rows(root: str | Path) -> pd.DataFrame:
    """The seed paper's compute samples (collectives depend on the links, not the GPU: not transferred), without
    the rows training sets aside as impossible (`predictor.costs.learned.regressor.faster_than_peak`; a set mostly
    beyond the peak, whole): an estimate is not scored against a time no part can reach."""
    samples = pd.concat([ett.read_file(p) for p in ett.list_files(root)], ignore_index=True)
    samples = deduplicate(samples)
    samples = samples[~samples["primitive"].isin(COLLECTIVE_PRIMITIVES)].reset_index(drop=True)
    keep = np.ones(len(samples), dtype=bool)
    for primitive, index in samples.groupby(samples["hardware"] + "|" + samples["primitive"] + "|"
                                            + samples["pass"]).indices.items():
        beyond = faster_than_peak(samples.iloc[index], str(primitive).split("|")[1])
        keep[index[beyond] if beyond.sum() * 2 <= len(index) else index] = False
    return samples[keep].reset_index(drop=True)


def leave_one_out(models, seed: pd.DataFrame) -> dict[str, dict[str, dict[str, float]]]:
    """primitive → {"SOURCE -> TARGET": {transfer, roofline, rows}}: median APE of the transfer path (on every
    compute primitive) and of the roofline on TARGET's samples, with TARGET's models left out."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for target in GPUS:
        source = next(g for g in GPUS if g != target)
        rows = seed[seed["hardware"] == target].reset_index(drop=True)
        held = models.without(target)
        every = held.predict(rows, transfer_primitives=frozenset(COMPUTE_PRIMITIVES))
        if (every["path"] == "model").any():
            raise AssertionError(f"{target} has models of its own: not a transfer measurement")
        true = rows["duration_us"].to_numpy()
        ape = pd.DataFrame({"primitive": rows["primitive"],
                            "transfer": np.abs(every["duration_us"].to_numpy() - true) / true,
                            "roofline": np.abs(estimate_us(rows) - true) / true})
        for primitive, part in ape.groupby("primitive"):
            out.setdefault(str(primitive), {})[f"{source} -> {target}"] = {
                "transfer": round(float(part["transfer"].median()), 4),
                "roofline": round(float(part["roofline"].median()), 4), "rows": int(len(part))}
    return out


def selection(models, root: str | Path) -> dict:
    """The document `tracekit/data/transfer.json` holds."""
    table = leave_one_out(models, seed_rows(root))
    return {"format": "tracekit-transfer-selection/1", "by": "make profiles (tools/fit_profiles.py)",
            "rule": "transfer where the geometric mean over both directions of transfer/roofline median error < 1",
            "primitives": {p: {"leave_one_out": dict(sorted(v.items())), "use": choose(v)}
                           for p, v in sorted(table.items())}}
