"""Sets of trained operator regressors: load and predict (vectorized); training them is
`predictor.costs.learned.training`.

A model directory holds `index.json` (the list of models, the provenance of the data they were trained on, the
framework time per compute operator sampled on each CPU, the CPU rates the models were normalised with — loading
the set makes them those ids' rates, so a model predicts the same on every machine — and the cluster each
hardware's collectives were sampled on), and per model `<id>.json` (features, trained ranges,
sample count, CV error, outlier report, hash of the training samples) plus `<id>.ubj.gz` (the XGBoost booster in
its UBJSON format, gzip-compressed; never pickle).

Models are keyed by (hardware, primitive, pass, group). `group` is the sample `variant` for primitives whose
variants are different kernels (the norms, softmaxes, element-wise ops, optimizer steps, activations), the topology
`<nodes>x<ranks per node>` for collectives (plus a pooled `*` model over all measured topologies, which answers
the others), the `role` for the parts of a GEMM's backward (`dgrad`, `wgrad`, `bgrad`: trace kernels linked to
their forward op), and `*` (all variants pooled) for the rest.

Backward, one family in two forms, both keyed by the forward op's shape features: the whole backward of an op (the
seed paper's `bwd` rows, role `whole` or none) and, for gemm/bmm, its parts per role. A row asking for a role is
answered only by that role's model; a whole row only by a whole-form model, else (path `derived`) by the sum of
the role models the set holds (dgrad + wgrad, + bgrad where held). `role_primitives(hw)` names the primitives
whose backward the set holds per role only; the operator graph asks those per role (predictor/assembly/graph.py).

A model trained with `extrapolates: false` in its metadata (`tracekit train --in-range-only`: the models of
published tables, which sample a fixed grid of shapes) answers only rows inside its trained ranges; the others take
the paths below as if it were not there.

`predict` answers each operator row by one of five paths:
- `model`: a model of that hardware, primitive and pass (for a GEMM, of its dtype when below half precision);
- `derived`: a whole GEMM backward summed from its role models; a collective composed from related models on
  that hardware (reduce_scatter ≈ all_gather at the same
  per-rank bytes, all_reduce ≈ reduce_scatter + all_gather of bytes/n, all_to_all ≈ all_gather of bytes/n,
  broadcast ≈ all_reduce · n/(2(n−1)), send_recv ≈ a 2-rank all_gather), or a compute primitive from a model of
  a sibling device (A100 40 GB ↔ 80 GB) scaled by the ratio of their roofline estimates;
- `transfer`: a compute row of a GPU with a datasheet entry and no models, from the models of other GPUs through
  their rooflines (`predictor.costs.physics.transfer`); the `sources` column names them with their weights;
- `roofline`: the roofline estimate of `predictor.costs.physics.roofline` (no model covers the row);
- `lowp`: a GEMM in a dtype its GPU has no model for (fp8, fp8_block, MXFP8, NVFP4, MXFP4, fp32): the same row's
  bf16 answer (by any path above) at the speed-up of `predictor.costs.physics.lowp_gemm`, learned from the GPUs that
  measured both dtypes, bounded by the dtype's dense peak; `sources` says which curve and how the bf16 time was
  obtained.
The roofline answers of an NVIDIA GPU are GPU-side kernel times: the host part of the roofline's 5 µs launch
term is taken off, never below the shortest kernel of the corpus's A100 traces
(`kernel_paths.gpu_side`; the schedule charges the launch on the host). No fused RoPE estimate on a GPU of the
datasheet table is faster than its bytes at the HBM bandwidth (`predictor.costs.physics.hbm_floor`), nor Megatron-core's
native vocab-parallel cross entropy than its fp32 passes (`predictor.layers.embedding.cross_entropy`). Whatever the
path, an unaligned shape on an NVIDIA GPU (a half-precision GEMM with an odd k or n, a wide softmax
row that is not a whole number of 16-byte vectors) is raised to the time of the kernel it forces
(`predictor.costs.physics.kernel_paths`). No GEMM estimate on a GPU of the datasheet table is faster than the dense peak
of its dtype, and a GEMM in a dtype the part has no tensor cores for (peak 0: MXFP8 on H100, NVFP4 on AMD parts) is a
ConfigError naming both.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from predictor.costs.learned import derived
from predictor.costs.learned.model_keys import (
    ALIASES,
    DEFAULT_GROUPS,
    POOLED,
    ROLE_PRIMITIVES,
    is_dtype_key,
    route_key,
    variant_key,
)
from predictor.costs.learned.regressor import physics_table, predict
from predictor.costs.learned.trained_model import (
    GRID_FEATURES,
    TrainedModel,
    above_grid,
    at_most_peak,
    other_dtype_rows,
    unseen_dtype,
    unsized,
)
from predictor.costs.physics import cross_entropy_floor, hbm_floor, kernel_paths, sustained_gemm
from predictor.costs.physics.achieved_rates import lowp_curves
from predictor.costs.physics.lowp_gemm import bounded, peak_flops
from predictor.costs.physics.roofline import Rates, estimate_us, record_rates
from predictor.costs.physics.transfer import kernel_timed, transfer
from tracekit.core.data_files import DATA
from tracekit.core.errors import ModelError
from tracekit.core.hardware import gpu_family, hardware_spec
from tracekit.core.samples import DTENSOR_SUFFIX, FUSED_SUFFIX, GEMM_ROLES

FORMAT = "tracekit-models/1"
INDEX = "index.json"
OUTPUT_COLUMNS = ("duration_us", "path", "out_of_range", "sources")
#: A model trained on wall-clock samples alone (`tracekit sample` on a GPU: the host's clock around each call and a
#: synchronize, `predictor.costs.physics.transfer.kernel_timed`) answers a row as the kernel's time only where its
#: shortest sample (`floor_us`, the host's round trip) is at most a fifth of the answer; below, the row takes the
#: kernel-timed paths as if the GPU had no model (a real step launches its kernels without waiting for each).
WALL_CLOCK_TRUST = 5.0


def bundled_models_dir() -> Path:
    """The default models shipped inside the package."""
    return DATA / "models"


class ModelSet:
    """A loaded model directory; `predict` answers operator rows by model, derived model or roofline."""

    def __init__(self, path: Path, index: dict, models: list[TrainedModel], left_out: frozenset[str] = frozenset(),
                 sustained: bool = True):
        self.path = path
        self.index = index
        self.models = models
        #: GPUs a leave-one-GPU-out test hides (`without`): their models, their measured GEMM rates and their
        #: sustained GEMM ceilings
        self.left_out = left_out
        #: whether a training graph's GEMMs are held to the parts' sustained ceilings (`gemm_ceilings`)
        self.sustained = sustained
        self._by_key: dict[tuple[str, str, str], dict[str, TrainedModel]] = {}
        for model in models:
            self._by_key.setdefault((model.hardware, model.primitive, model.pass_), {})[model.group] = model

    @classmethod
    @lru_cache(maxsize=8)
    def load(cls, path: str | Path | None = None) -> "ModelSet":
        """Load a model directory (None: the bundled defaults). Cached: loading the same path again is free."""
        root = Path(path) if path is not None else bundled_models_dir()
        index_path = root / INDEX
        try:
            index = json.loads(index_path.read_text())
        except FileNotFoundError as exc:
            raise ModelError(f"{root}: not a model directory (no {INDEX}); "
                             f"run `tracekit train --models-out {root}`") from exc
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelError(f"{index_path}: unreadable model index ({exc})") from exc
        if index.get("format") != FORMAT:
            raise ModelError(f"{index_path}: unknown model format {index.get('format')!r} (expected {FORMAT})")
        for hardware, recorded in index.get("rates", {}).items():
            try:
                record_rates(hardware, Rates(**recorded))
            except TypeError as exc:
                raise ModelError(f"{index_path}: unreadable rates of {hardware} ({exc})") from exc
        models = []
        for entry in index.get("models", []):
            meta_path = root / f"{entry['id']}.json"
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise ModelError(f"{meta_path}: unreadable model metadata ({exc})") from exc
            models.append(TrainedModel(meta["id"], meta["hardware"], meta["primitive"], meta["pass"], meta["group"],
                                       meta, root))
        return cls(root, index, models)

    def framework_us(self, hardware: str) -> dict[str, float]:
        """{pass: µs} of framework time per compute operator sampled on `hardware` ({} when none was)."""
        return {entry["pass"]: float(entry["per_op_us"]) for entry in self.index.get("framework", [])
                if entry["hardware"] == hardware and "per_op_us" in entry}

    def fsdp_unit_us(self, hardware: str) -> dict[str, float]:
        """{pass: µs} of torch FSDP2's own host time per unit sampled on `hardware` ({} when none was)."""
        return {entry["pass"]: float(entry["per_unit_us"]) for entry in self.index.get("framework", [])
                if entry["hardware"] == hardware and "per_unit_us" in entry}

    def hardware_ids(self) -> list[str]:
        return sorted({m.hardware for m in self.models})

    def sampled_cluster(self, hardware: str) -> str | None:
        """The cluster preset the collective samples of `hardware` were measured on (the index's `clusters`, set
        by `tracekit train --cluster HW=NAME`); None when not recorded."""
        return self.index.get("clusters", {}).get(hardware)

    def sampled_topologies(self, hardware: str, primitive: str) -> set[str]:
        """`<nodes>x<ranks per node>` keys with a collective model of their own (the pooled model excluded)."""
        return {g for g in self._by_key.get((hardware, primitive, "comm"), {}) if g != POOLED}

    # -- resolution -------------------------------------------------------------------------------------------
    def role_primitives(self, hardware: str) -> frozenset[str]:
        """Primitives whose backward on `hardware` this set holds per role only (dgrad and wgrad models, no
        whole-form model): the graph asks for their backward per role (see the module docstring)."""
        out = set()
        for primitive in ROLE_PRIMITIVES:
            groups = {g: m for g, m in self._by_key.get((hardware, primitive, "bwd"), {}).items()
                      if not is_dtype_key(g)}
            if {"dgrad", "wgrad"} <= set(groups) and set(groups) <= set(GEMM_ROLES):
                out.add(primitive)
        return frozenset(out)

    def resolve(self, hardware: str, primitive: str, pass_: str, variant: object = None) -> TrainedModel | None:
        """The model answering a row directly, or None. `variant` is the row's route key: a role answers only
        with that role's model; anything else never with a role's."""
        groups = self._by_key.get((hardware, primitive, pass_))
        if not groups:
            return None
        if variant in GEMM_ROLES or (primitive in ROLE_PRIMITIVES and is_dtype_key(variant)):
            return groups.get(str(variant))
        if primitive in ROLE_PRIMITIVES:
            groups = {name: model for name, model in groups.items()
                      if name not in GEMM_ROLES and not is_dtype_key(name)}
            if not groups:
                return None
        if isinstance(variant, str) and variant in groups:
            return groups[variant]
        # no DTensor step or fused optimizer step sampled here: its stage's plain step (`rmsnorm_fused` is a kernel)
        for suffix in (DTENSOR_SUFFIX, FUSED_SUFFIX) if primitive == "optimizer" else (DTENSOR_SUFFIX,):
            if isinstance(variant, str) and variant.endswith(suffix):
                return self.resolve(hardware, primitive, pass_, variant[:-len(suffix)])
        wanted = variant_key(variant)
        if wanted:
            for name, model in groups.items():
                if variant_key(name) == wanted:
                    return model
            alias = ALIASES.get(wanted)
            if alias in groups:
                return groups[alias]
        if POOLED in groups:
            return groups[POOLED]
        for name in DEFAULT_GROUPS.get(primitive, ()):
            if name in groups:
                return groups[name]
        return max(groups.values(), key=lambda m: m.meta.get("samples", 0))

    def sibling(self, hardware: str, primitive: str, pass_: str) -> str | None:
        """Another hardware id of the same GPU family with a model for this primitive and pass."""
        if hardware_spec(hardware) is None:
            return None
        family = gpu_family(hardware)
        for other in self.hardware_ids():
            if other != hardware and hardware_spec(other) is not None and gpu_family(other) == family \
                    and (other, primitive, pass_) in self._by_key:
                return other
        return None

    # -- prediction -------------------------------------------------------------------------------------------
    def predict(self, ops: pd.DataFrame, transfer_primitives: frozenset[str] | None = None) -> pd.DataFrame:
        """Duration (µs), path ('model' | 'derived' | 'transfer' | 'roofline' | 'lowp'), out_of_range and sources (the
        source GPUs of transfer answers with their weights, the curve and bf16 path of lowp answers, '' otherwise)
        for each operator row. `transfer_primitives`:
        the primitives that may take the transfer path (default: those `predictor.costs.physics.transfer` selected).

        `out_of_range` is True when a shape feature lies outside the range the answering model was trained on, and
        for roofline answers (no training data covers them). `duration_us` is NaN only for rows whose work even the
        roofline cannot size (no shape features, unknown hardware)."""
        frame = ops.reset_index(drop=True)
        n = len(frame)
        for col in ("hardware", "primitive", "pass"):
            if col not in frame.columns:
                raise ModelError(f"operator rows need a {col!r} column")
        if "variant" not in frame.columns:
            frame = frame.assign(variant=None)
        other_dtype = other_dtype_rows(frame)
        if other_dtype.any():  # a dtype the part has no tensor cores for: a clear error before any estimate
            for hw, dt in {(str(h), str(d)) for h, d in frame.loc[other_dtype, ["hardware", "dtype"]].to_numpy()}:
                peak_flops(hw, dt)
        physics = physics_table(frame) if n else None
        duration = physics[1].copy() if physics is not None else np.zeros(0)  # the roofline answers rows no model takes
        path = np.full(n, "roofline", dtype=object)
        oor = np.ones(n, dtype=bool)
        sources = np.full(n, "", dtype=object)
        done = self._predict_direct(frame, duration, path, oor, tag="model", physics=physics)
        missing = np.flatnonzero(~done)
        if len(missing):
            derived.fill(self, frame, missing, duration, path, oor)
            rest = missing[path[missing] == "roofline"]
            lowp = rest[other_dtype[rest]]
            rest = rest[~other_dtype[rest]]
            t, named, t_oor, hit = transfer(self, frame, rest, transfer_primitives)
            duration[rest[hit]], sources[rest[hit]], oor[rest[hit]] = t[hit], named[hit], t_oor[hit]
            path[rest[hit]] = "transfer"
            # from the same rows in bf16, at a learned and bounded speed-up (predictor.costs.physics.lowp_gemm)
            if len(lowp):
                sub = frame.iloc[lowp]
                half = self.predict(sub.assign(dtype="bf16"), transfer_primitives)
                t_low, notes = bounded(sub, half["duration_us"].to_numpy(), self.lowp_curves())
                duration[lowp], oor[lowp], path[lowp] = t_low, half["out_of_range"].to_numpy(), "lowp"
                sources[lowp] = [f"{note}; bf16 by {p}" + (f" from {src}" if src else "")
                                 for note, p, src in zip(notes, half["path"], half["sources"])]
        if n:
            kernel_paths.gpu_side(frame, duration, path)  # no host launch cost in a kernel's GPU-side time
            kernel_paths.apply(frame, duration)  # unaligned shapes: the kernels they force (no model has seen them)
            at_most_peak(frame, duration)
            hbm_floor.apply(frame, duration)  # fused RoPE: never faster than its bytes at HBM bandwidth
            cross_entropy_floor.apply(frame, duration)  # the native loss chain: nor its fp32 passes
        return pd.DataFrame({"duration_us": duration.astype("float64"), "path": path, "out_of_range": oor,
                             "sources": sources}, index=ops.index)

    def without(self, hardware: str) -> "ModelSet":
        """This set without the models of `hardware` and its measured GEMM rates
        (`predictor.costs.physics.achieved_rates`): leave-one-GPU-out, its rows then take the transfer path as a GPU
        never measured would."""
        return ModelSet(self.path, self.index, [m for m in self.models if m.hardware != hardware],
                        self.left_out | {hardware}, self.sustained)

    def unsustained(self) -> "ModelSet":
        """This set with no sustained GEMM ceiling: a training graph's GEMMs at their bursts' speed (what the
        ceiling's own fit starts from, tools/fit_sustained_gemm.py)."""
        return ModelSet(self.path, self.index, self.models, self.left_out, sustained=False)

    def gemm_ceilings(self) -> dict[str, dict[str, float]]:
        """part → dtype → the sustained GEMM ceiling (TFLOP/s) a training graph's GEMMs are held to
        (`predictor.costs.physics.sustained_gemm`), without the left-out parts'; {} when `unsustained`."""
        if not self.sustained:
            return {}
        return {hw: t for hw, t in sustained_gemm.ceilings().items() if hw not in self.left_out}

    def lowp_curves(self) -> list[dict]:
        """The low-precision GEMM speed-up curves (`predictor.costs.physics.lowp_gemm`): those learned at training (the
        index's `lowp_speedup`) and those of the measured matmul tables no model was trained on
        (`predictor.costs.physics.achieved_rates`), without the left-out GPUs'."""
        learned = [c for c in self.index.get("lowp_speedup", []) if c["hardware"] not in self.left_out]
        return learned + lowp_curves(self.left_out)

    def _predict_direct(self, frame: pd.DataFrame, duration: np.ndarray, path: np.ndarray, oor: np.ndarray,
                        tag: str, physics: tuple[pd.DataFrame, np.ndarray] | None = None) -> np.ndarray:
        """Fill rows answered by a model of their own hardware; returns the mask of rows answered.

        `physics` is `physics_table(frame)` when the caller has it; it is computed once here otherwise."""
        done = np.zeros(len(frame), dtype=bool)
        if not len(frame):
            return done
        keys = frame[["hardware", "primitive", "pass"]].astype("object").assign(route=route_key(frame))
        keys["dtype"] = frame["dtype"].astype("object") if "dtype" in frame.columns else None
        keys = keys.where(keys.notna(), None)
        codes, uniques = pd.factorize(pd.MultiIndex.from_frame(keys))
        chosen: dict[str, list[int]] = {}
        for code, key in enumerate(uniques):
            model = self.resolve(*key[:4])
            if model is not None and not unseen_dtype(model, key[4]):
                chosen.setdefault(model.id, []).append(code)
        if not chosen:
            return done
        by_id = {m.id: m for m in self.models}
        if physics is None:
            physics = physics_table(frame)
        for mid, code_list in chosen.items():
            rows = np.flatnonzero(np.isin(codes, code_list))
            sub_physics = (physics[0].iloc[rows], physics[1][rows])
            answered, before = rows, duration[rows].copy()
            self._run(by_id[mid], frame.iloc[rows], rows, duration, oor, sub_physics)
            if not by_id[mid].meta.get("extrapolates", True):  # a table's model answers inside its table,
                outside = oor[rows] | unsized(by_id[mid], frame.iloc[rows])  # and above it at its edge's efficiency
                above = outside & above_grid(by_id[mid], frame.iloc[rows])
                if above.any():
                    duration[rows[above]] = self._at_edge(by_id[mid], frame.iloc[rows[above]])
                    oor[rows[above]] = True
                outside &= ~above
                duration[rows[outside]], oor[rows[outside]] = before[outside], True
                rows = rows[~outside]
            floor = by_id[mid].meta.get("floor_us")
            if floor and not kernel_timed(by_id[mid]):  # a wall-clock model answers where its host round trip
                host = duration[rows] < WALL_CLOCK_TRUST * float(floor)  # is at most a fifth of its answer
                duration[rows[host]] = before[np.isin(answered, rows[host])]
                oor[rows[host]] = True
                rows = rows[~host]
            path[rows] = tag
            done[rows] = True
        return done

    def _at_edge(self, model: TrainedModel, sub: pd.DataFrame) -> np.ndarray:
        """A table model's answer for rows above its grid: the efficiency (time over roofline) of the row clamped to
        the grid's largest shapes, at the row's own roofline. A GEMM's efficiency rises with its size and levels off
        well inside a 4096-edge grid, so the edge's efficiency is what the GPU itself reaches on larger shapes (a
        transfer from other GPUs would carry their efficiency instead: an A100 reaches a larger share of its
        datasheet peak than a Blackwell part)."""
        edge = sub.copy()
        for name in GRID_FEATURES.intersection(model.meta["ranges"]):
            lo, hi = model.meta["ranges"][name]
            values = pd.to_numeric(edge[name], errors="coerce").to_numpy(dtype="float64")
            edge[name] = np.clip(np.nan_to_num(values, nan=1.0), lo, hi)
        clamped = np.empty(len(edge))
        ignored = np.ones(len(edge), dtype=bool)
        self._run(model, edge, np.arange(len(edge)), clamped, ignored, physics_table(edge))
        return clamped * np.asarray(estimate_us(sub)) / np.asarray(estimate_us(edge))

    @staticmethod
    def _run(model: TrainedModel, sub: pd.DataFrame, rows: np.ndarray, duration: np.ndarray, oor: np.ndarray,
             physics: tuple[pd.DataFrame, np.ndarray]):
        params = model.meta["params"]
        duration[rows], matrix = predict(model.booster, model.meta["features"], model.primitive, sub,
                                         params["target"], physics, params.get("size_grid"))
        outside = np.zeros(len(sub), dtype=bool)
        for name, (lo, hi) in model.meta["ranges"].items():
            values = matrix[name].to_numpy()
            tol = 1e-6 * max(abs(lo), abs(hi), 1.0)
            outside |= (values < lo - tol) | (values > hi + tol)
        oor[rows] = outside

    def direct_estimates(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Duration (NaN where no model of the row's own hardware answers), out_of_range and answered, per row."""
        n = len(frame)
        duration = np.full(n, np.nan)
        path = np.full(n, "roofline", dtype=object)
        oor = np.ones(n, dtype=bool)
        done = self._predict_direct(frame, duration, path, oor, tag="model")
        return np.where(done, duration, np.nan), oor, done

    # -- reporting --------------------------------------------------------------------------------------------
    def summaries(self) -> list[dict]:
        """Per-model metadata (what `tracekit models` and `tracekit train` print)."""
        return [m.meta for m in self.models]
