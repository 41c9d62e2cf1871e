"""Train a model set: one XGBoost regressor per (hardware, primitive, pass, group) of a sample frame, written to a
model directory atomically (the old set stays intact until the new one is complete), or into an existing set,
replacing only the models of the hardware trained now (`update`). The directory's layout is
`predictor.costs.learned.models`' docstring; how samples are grouped is `predictor.costs.learned.model_keys`."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterable, cast

import pandas as pd

from predictor.costs.learned.model_keys import (
    deduplicate,
    groups_of,
    mean_of_repeats,
    model_id,
    shapeless_rows,
    training_sets,
)
from predictor.costs.learned.models import FORMAT, INDEX, ModelSet
from predictor.costs.learned.regressor import FitResult, fit
from predictor.costs.physics.lowp_gemm import learn
from predictor.costs.physics.roofline import rates
from tracekit.core.atomic import atomic_write_json, umask_mode
from tracekit.core.errors import ModelError
from tracekit.core.samples import (
    COLLECTIVE_PRIMITIVES,
    DEVICE_CLOCK_SOURCE,
    FSDP2_UNIT,
    HOST_CLOCK_SOURCE,
    HOST_PRIMITIVES,
)


def train_models(samples: pd.DataFrame, out: str | os.PathLike, provenance: dict | None = None,
                 folds: int = 5, threads: int = 1, on_model: Callable[[dict], None] | None = None,
                 update: bool = False, extrapolate: bool = True) -> list[dict]:
    """Train one model per (hardware, primitive, pass, group) and write the set to `out` atomically (the old set
    stays intact until the new one is complete). Returns the per-model summaries written to the index; rows
    without shape features are set aside and counted under `skipped` in the index. `other` samples are not used.

    `update`: `out` is an existing set whose models of the hardware in `samples` are replaced and whose other models
    are kept as they are (files copied byte for byte, their index entries too); the new training's provenance is
    added to the index's `updates`. Besides the models, the index keeps the low-precision GEMM speed-ups learned from
    the samples (`predictor.costs.physics.lowp_gemm.learn`, under `lowp_speedup`).

    `extrapolate=False`: the models answer only rows inside their trained ranges (metadata `extrapolates: false`),
    for samples of a fixed grid of shapes (published tables): outside it the transfer and roofline paths answer."""
    framework = framework_overheads(samples)
    samples = samples[~samples["primitive"].isin(HOST_PRIMITIVES)]
    one_clock(samples)
    samples = mean_of_repeats(deduplicate(samples[(samples["duration_us"] > 0) & (samples["primitive"] != "other")]))
    if samples.empty:
        raise ModelError("no classified samples to train on")
    shapeless = shapeless_rows(samples)
    counts = samples[shapeless].groupby(["hardware", "primitive", "pass"]).size()
    skipped: list[dict] = [
        {"hardware": hardware, "primitive": primitive, "pass": pass_, "group": None, "rows": int(rows),
         "reason": "rows without shape features (e.g. CPU autograd nodes) cannot be placed by shape"}
        # pandas-stubs types a group key as Hashable; grouped by three columns, it is (hardware, primitive, pass)
        for (hardware, primitive, pass_), rows in cast("Iterable[tuple[tuple[str, str, str], int]]", counts.items())
    ]
    samples = samples[~shapeless]
    if samples.empty:
        raise ModelError(f"none of the {int(shapeless.sum())} classified samples carries shape features")
    samples = samples.assign(group=groups_of(samples))
    out = Path(out)
    kept = _kept(out, set(samples["hardware"])) if update else None
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    summaries: list[dict] = []
    try:
        for (hardware, primitive, pass_, group), index in training_sets(samples):
            frame = samples.loc[index]
            result = fit(frame, primitive, folds=folds, threads=threads)
            if result.booster is None:  # every row set aside: say so in the index
                skipped.append({"hardware": hardware, "primitive": primitive, "pass": pass_, "group": group,
                                "rows": int(len(frame)), "reason": "every row set aside as an outlier "
                                f"({', '.join(f'{k} {v}' for k, v in result.outliers.items() if k != 'rows' and v)})"})
                continue
            mid = model_id(hardware, primitive, pass_, group)
            meta = _metadata(mid, hardware, primitive, pass_, group, frame, result)
            if not extrapolate and primitive not in COLLECTIVE_PRIMITIVES:  # collectives anchor the link model
                meta["extrapolates"] = False
            (staging / f"{mid}.ubj.gz").write_bytes(gzip.compress(bytes(result.booster.save_raw("ubj")), 9, mtime=0))
            atomic_write_json(staging / f"{mid}.json", meta)
            summaries.append(meta)
            if on_model:
                on_model(meta)
        index = {
            "format": FORMAT,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "provenance": {k: v for k, v in (provenance or {}).items() if k != "clusters"},
            "clusters": (provenance or {}).get("clusters", {}),
            "models": [{k: m[k] for k in ("id", "hardware", "primitive", "pass", "group")} for m in summaries],
            "skipped": skipped,
            "framework": framework,
            "rates": {hw: asdict(r) for hw in sorted(samples["hardware"].unique())
                      if hw.startswith("cpu-") and (r := rates(hw)) is not None},  # a CPU always has rates
            "lowp_speedup": learn(samples),
        }
        if kept is not None:
            index = _merged(kept, index, sorted(set(samples["hardware"])), staging)
        atomic_write_json(staging / INDEX, index)
        _make_readable(staging)
        _swap_in(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    ModelSet.load.cache_clear()
    return summaries


def _kept(out: Path, retrained: set[str]) -> dict:
    """The index of the set at `out` (to update) and the ids of its models of other hardware than `retrained`."""
    try:
        index = json.loads((out / INDEX).read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{out}: no model set to update ({exc})") from exc
    if index.get("format") != FORMAT:
        raise ModelError(f"{out / INDEX}: unknown model format {index.get('format')!r} (expected {FORMAT})")
    index["_root"] = str(out)
    index["_retrained"] = sorted(retrained)
    return index


def _merged(old: dict, new: dict, retrained: list[str], staging: Path) -> dict:
    """The index of an updated set: the old set's entries of other hardware, the new training's of `retrained`;
    the kept models' files copied into `staging` unchanged."""
    root, gone = Path(old["_root"]), set(retrained)

    def others(entries: list[dict]) -> list[dict]:
        return [e for e in entries if e.get("hardware") not in gone]

    for entry in others(old.get("models", [])):
        for suffix in (".json", ".ubj.gz"):
            shutil.copy2(root / f"{entry['id']}{suffix}", staging / f"{entry['id']}{suffix}")
    updates = [u for u in old.get("updates", []) if not set(u.get("hardware", [])) <= gone]
    updates.append({"hardware": retrained, "created": new["created"], "provenance": new["provenance"]})
    return {
        "format": FORMAT, "created": new["created"], "provenance": old.get("provenance", {}), "updates": updates,
        "clusters": {**{h: c for h, c in old.get("clusters", {}).items() if h not in gone}, **new["clusters"]},
        "models": sorted(others(old.get("models", [])) + new["models"], key=lambda e: e["id"]),
        "skipped": others(old.get("skipped", [])) + new["skipped"],
        "framework": others(old.get("framework", [])) + new["framework"],
        "rates": {**{h: r for h, r in old.get("rates", {}).items() if h not in gone}, **new["rates"]},
        "lowp_speedup": others(old.get("lowp_speedup", [])) + new["lowp_speedup"],
    }


def framework_overheads(samples: pd.DataFrame) -> list[dict]:
    """Per (hardware, pass): the framework time per compute operator (`framework` samples of the reference layer,
    µs; median over the sampled layers, 0 when they say the layer is no slower than its operators), and FSDP2's per
    unit (`per_unit_us`, variant `fsdp2_unit`) where it was sampled. Not a regressor: it does not grow with the
    shape."""
    rows = samples[samples["primitive"].isin(HOST_PRIMITIVES)]
    unit = rows["variant"].astype("string").fillna("") == FSDP2_UNIT
    out = []
    for (hardware, pass_), frame in rows[~unit].groupby(["hardware", "pass"], sort=True):
        out.append({"hardware": hardware, "pass": pass_, "samples": int(len(frame)),
                    "per_op_us": round(max(0.0, float(frame["duration_us"].median())), 3)})
    for (hardware, pass_), frame in rows[unit].groupby(["hardware", "pass"], sort=True):
        out.append({"hardware": hardware, "pass": pass_, "variant": FSDP2_UNIT, "samples": int(len(frame)),
                    "per_unit_us": round(max(0.0, float(frame["duration_us"].median())), 3)})
    return out


def one_clock(samples: pd.DataFrame) -> None:
    """Refuse a GPU whose kernel samples mix the host's clock (the first harvest's `tracekit sample`: each row holds
    a launch and a synchronize) with the device's (tracekit.sampling.clocks): a model of both would answer short
    operators with either, and `predictor.costs.physics.transfer.kernel_timed` would take it for kernel times.
    Collectives are timed by the host's clock in either harvest."""
    if "source_path" not in samples.columns:
        return
    both = {HOST_CLOCK_SOURCE, DEVICE_CLOCK_SOURCE}
    kernels = samples[~samples["primitive"].isin(COLLECTIVE_PRIMITIVES)]
    for hardware, paths in kernels.groupby("hardware")["source_path"]:
        if both <= set(paths.dropna()):
            raise ModelError(f"{hardware}: its samples mix the host's clock ({HOST_CLOCK_SOURCE}, the first "
                             f"harvest's) with the device's ({DEVICE_CLOCK_SOURCE}); train on one of the two stores")


def _metadata(mid, hardware, primitive, pass_, group, frame, result: FitResult) -> dict:
    return {
        "id": mid, "hardware": hardware, "primitive": primitive, "pass": pass_, "group": group,
        "variants": sorted(frame["variant"].dropna().astype(str).unique().tolist()),
        "features": result.features, "ranges": result.ranges, "samples": result.n_samples,
        "cv": result.cv, "outliers": result.outliers, "params": result.params,
        "train_hash": result.train_hash, "train_seconds": round(result.seconds, 2),
        "dtypes": sorted(frame["dtype"].dropna().astype(str).unique().tolist()) if "dtype" in frame.columns else [],
        "sources": sorted(frame["source_path"].dropna().astype(str).unique().tolist())
        if "source_path" in frame.columns else [],
        # the shortest sample: on wall-clock samples the host's round trip (predictor.costs.learned.models)
        "floor_us": round(float(frame["duration_us"].min()), 3),
    }


def _make_readable(folder: Path) -> None:
    """The modes a new folder and new files get under the user's umask (0755/0644 under the usual 022), not the
    private 0700/0600 of the temporary-file helpers the set was staged with."""
    os.chmod(folder, umask_mode(folder=True))
    for path in folder.iterdir():
        os.chmod(path, umask_mode())


def _swap_in(staging: Path, out: Path) -> None:
    if out.exists() and not (out / INDEX).exists() and any(out.iterdir()):
        raise ModelError(f"{out}: exists and is not a model directory; refusing to replace it")
    backup = out.with_name(f".{out.name}.old")
    shutil.rmtree(backup, ignore_errors=True)
    if out.exists():
        os.replace(out, backup)
    os.replace(staging, out)
    shutil.rmtree(backup, ignore_errors=True)
