"""How operator rows and samples map to models: a model's key (hardware, primitive, pass, group), the group of a
row (its variant for primitives whose variants are different kernels, the topology `<nodes>x<ranks per node>` for
collectives, the role of a GEMM backward part, the input dtype of a GEMM below half precision or in TF32
(`fp8`, `fp8_block`, ..., `tf32`; a role and a dtype together: `dgrad:fp8`), `*` for the rest), the variant aliases
of the published sample sets, and the sample hygiene training applies (duplicates, a collective's repeats at one
point, rows without shape features). Used by `predictor.costs.learned.training` to form training sets and by
`predictor.costs.learned.models` to route rows to them."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from predictor.costs.features import shape_features
from tracekit.core.samples import COLLECTIVE_PRIMITIVES, FEATURE_COLUMNS, GEMM_ROLES

SPLIT_BY_VARIANT = ("softmax", "norm", "elementwise", "optimizer", "activation")
MIN_GROUP_ROWS = 30
POOLED = "*"
#: Group used when a row names no variant (or an unknown one) and no pooled model exists; first present wins.
DEFAULT_GROUPS = {
    "norm": ("layernorm", "RMSlayernorm"),
    "elementwise": ("res_add",),
    "softmax": ("softmax", "ScaledUpperTriangMaskedSoftmax"),
    "optimizer": ("middleStage_optimizer", "optimizer"),
    "activation": ("gelu",),
}
#: Variant hints the predictor may send, normalized (lower case, letters and digits only) → group name.
ALIASES = {
    "rmsnorm": "RMSlayernorm", "rmslayernorm": "RMSlayernorm", "layernorm": "layernorm",
    "rope": "RoPE", "rotary": "RoPE", "rotaryembedding": "RoPE",
    # fused kernels answered by the kernel of at least their bytes (predictor.layers.norm_rope)
    "rmsnormfused": "layernorm", "ropefused": "res_add",
    "resadd": "res_add", "residual": "res_add", "add": "res_add", "biasdropoutadd": "res_add",
    "scaleduppertriangmaskedsoftmax": "ScaledUpperTriangMaskedSoftmax", "causalsoftmax":
        "ScaledUpperTriangMaskedSoftmax", "fusedsoftmax": "ScaledUpperTriangMaskedSoftmax",
    "fillmask": "fillmask", "maskedsoftmax": "fillmask", "softmax": "softmax",
    "firststage": "firstStage_optimizer", "firststageoptimizer": "firstStage_optimizer",
    "middlestage": "middleStage_optimizer", "middlestageoptimizer": "middleStage_optimizer",
    "laststage": "lastStage_optimizer", "laststageoptimizer": "lastStage_optimizer",
    "optimizer": "optimizer", "adam": "optimizer", "gelu": "gelu",
    # the local implementation's norms: one fused kernel each way, as the LayerNorm kernel (predictor.layers.norm_rope)
    "layernormapexpersist": "layernorm", "layernormapex": "layernorm", "layernormtorch": "layernorm",
    "rmsnormtorch": "layernorm",
    # memory-bound kernels asked at the numel that moves their bytes (predictor.layers.local_kernels.STREAMING)
    "dropout": "res_add", "repeatkv": "res_add", "contextcopy": "res_add", "causalmask": "res_add",
    "softmaxcast": "res_add", "softmaxscale": "res_add", "biasadd": "res_add", "gluadd": "res_add",
    "glumul": "res_add", "glucat": "res_add", "foreachadam": "res_add", "paramcopy": "res_add", "silu": "gelu",
    "ddpbucketcopy": "res_add", "autocastcast": "res_add",  # PyTorch DDP's copies, autocast's casts (parallel.fsdp)
}
#: Primitives whose backward splits into roles (tracekit.core.samples.GEMM_ROLES).
ROLE_PRIMITIVES = ("gemm", "bmm")
#: GEMM input dtypes with models of their own: a GEMM in one of these is another kernel on other tensor cores than
#: the half-precision GEMMs the pooled models learn (fp32 stays pooled: CPU runs sample their GEMMs in fp32).
#: (`fp8_row`: fp8 with a scale per row and column, torch._scaled_mm's rowwise, as `tracekit sample` times it)
DTYPE_GROUPS = ("tf32", "fp8", "fp8_block", "fp8_row", "mxfp8", "nvfp4", "mxfp4")


def dtype_key(dtype: object, role: object = None) -> str | None:
    """The group of a GEMM/bmm row of `dtype` (and backward `role`), None for the pooled dtypes."""
    if not isinstance(dtype, str) or dtype not in DTYPE_GROUPS:
        return None
    return f"{role}:{dtype}" if isinstance(role, str) and role in GEMM_ROLES else dtype


def is_dtype_key(group: object) -> bool:
    """Whether a group name is a dtype group (`fp8`, `dgrad:fp8`, ...)."""
    return isinstance(group, str) and group.rsplit(":", 1)[-1] in DTYPE_GROUPS


def _dtype_groups(frame: pd.DataFrame, keys: pd.Series) -> pd.Series:
    """`keys` with the dtype group put on GEMM/bmm rows of a DTYPE_GROUPS dtype."""
    if "dtype" not in frame.columns:
        return keys
    lowp = (frame["primitive"].isin(ROLE_PRIMITIVES) & frame["dtype"].isin(DTYPE_GROUPS)).to_numpy()
    if not lowp.any():
        return keys
    roles = frame["role"] if "role" in frame.columns else pd.Series(None, index=frame.index, dtype=object)
    named = [dtype_key(d, r) for d, r in zip(frame["dtype"].to_numpy()[lowp], roles.to_numpy()[lowp])]
    out = keys.astype(object).copy()
    out.iloc[np.flatnonzero(lowp)] = named
    return out


def variant_key(text: object) -> str:
    """A variant name as the models compare them: lower case, letters and digits only ('' for a non-string)."""
    return re.sub(r"[^a-z0-9]", "", str(text).lower()) if isinstance(text, str) else ""


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "_", text).strip("_")


def model_id(hardware: str, primitive: str, pass_: str, group: str) -> str:
    return "__".join(_slug(p if p != POOLED else "all") for p in (hardware, primitive, pass_, group))


def topology_key(frame: pd.DataFrame) -> pd.Series:
    """`<nodes>x<ranks per node>` of collective rows (POOLED where unknown)."""
    nodes = pd.to_numeric(frame["nodes"], errors="coerce") if "nodes" in frame.columns else None
    per_node = pd.to_numeric(frame["ranks_per_node"], errors="coerce") if "ranks_per_node" in frame.columns \
        else None
    if nodes is None or per_node is None:
        return pd.Series(POOLED, index=frame.index, dtype=object)
    key = nodes.round().astype("Int64").astype("string") + "x" + per_node.round().astype("Int64").astype("string")
    return key.fillna(POOLED).astype(object)


def role_rows(frame: pd.DataFrame) -> pd.Series:
    """Rows that are one role of a GEMM's backward (dgrad, wgrad, bgrad)."""
    if "role" not in frame.columns:
        return pd.Series(False, index=frame.index)
    return frame["primitive"].isin(ROLE_PRIMITIVES) & frame["role"].isin(GEMM_ROLES)


def route_key(frame: pd.DataFrame) -> pd.Series:
    """What selects a model group for each row: the topology for collectives, the role for a part of a GEMM's
    backward, the variant otherwise."""
    variant = frame["variant"].astype(object) if "variant" in frame.columns else \
        pd.Series(None, index=frame.index, dtype=object)
    roles = role_rows(frame).to_numpy()
    if roles.any():
        variant = variant.where(~roles, frame["role"].astype(object))
    variant = _dtype_groups(frame, variant)
    coll = frame["primitive"].isin(COLLECTIVE_PRIMITIVES).to_numpy()
    if not coll.any():
        return variant
    return variant.where(~coll, topology_key(frame))


def groups_of(samples: pd.DataFrame) -> pd.Series:
    """The model group of each sample row (see module docstring)."""
    variant = samples["variant"].astype("string").fillna(POOLED)
    split = samples["primitive"].isin(SPLIT_BY_VARIANT)
    counts = variant.groupby([samples["hardware"], samples["primitive"], samples["pass"], variant]).transform("size")
    groups = variant.where(split & (counts >= MIN_GROUP_ROWS) & (variant != POOLED), POOLED).astype(object)
    roles = role_rows(samples).to_numpy()
    if roles.any():
        groups = groups.where(~roles, samples["role"].astype(object))
    groups = _dtype_groups(samples, groups)
    coll = samples["primitive"].isin(COLLECTIVE_PRIMITIVES).to_numpy()
    if coll.any():
        groups = groups.where(~coll, topology_key(samples))
    return groups.astype(str)


def training_sets(samples: pd.DataFrame):
    """(hardware, primitive, pass, group) → rows, plus a pooled model over every topology of a collective measured
    on more than one (it answers topologies without a model of their own)."""
    keys = samples.groupby(["hardware", "primitive", "pass", "group"], sort=True).groups
    for key, index in keys.items():
        yield key, index
    coll = samples[samples["primitive"].isin(COLLECTIVE_PRIMITIVES)]
    for (hardware, primitive, pass_), frame in coll.groupby(["hardware", "primitive", "pass"], sort=True):
        groups = set(frame["group"])
        if len(groups) > 1 and POOLED not in groups:
            yield (hardware, primitive, pass_, POOLED), frame.index


def deduplicate(samples: pd.DataFrame) -> pd.DataFrame:
    """Drop exact duplicate measurements (same hardware, op, shape and duration), e.g. rows present both in a
    sample file and in a combined file of the same sweep."""
    cols = ["hardware", "primitive", "pass", "variant", *FEATURE_COLUMNS, "duration_us"]
    return samples.drop_duplicates(subset=[c for c in cols if c in samples.columns])


def mean_of_repeats(samples: pd.DataFrame) -> pd.DataFrame:
    """Collectives measured more than once at the same point (hardware, pass, variant, dtype and features: message,
    group, topology) become one row with their mean time. An iteration sums every occurrence, so a model must answer
    the mean; the regressor fits log time, which at one point answers the rows' geometric mean, and a collective's
    time is a heavy-tailed wait (a captured gloo all-reduce of 16 KiB: mean 1.7× the geometric mean; send/recv up
    to 7×). Compute rows stay as they are: their repeats scatter little (a CPU's GEMMs: mean ≤ 1.1× the geometric
    mean)."""
    comm = samples["primitive"].isin(COLLECTIVE_PRIMITIVES)
    if not comm.any():
        return samples
    keys = [c for c in ("hardware", "primitive", "pass", "variant", "dtype", *FEATURE_COLUMNS) if c in samples.columns]
    rows = samples[comm]
    mean = rows.groupby(keys, dropna=False, sort=False)["duration_us"].transform("mean")
    merged = rows.assign(duration_us=mean)[~rows.duplicated(subset=keys)]
    return pd.concat([samples[~comm], merged]).sort_index()


def shapeless_rows(samples: pd.DataFrame) -> pd.Series:
    """Rows with none of their primitive's shape features: they say how long something took, not for what shape,
    so a shape model learns nothing from them (mixed into a shaped set they only blur it)."""
    mask = pd.Series(True, index=samples.index)
    for primitive, index in samples.groupby("primitive").groups.items():
        columns = [c for c in shape_features(str(primitive)) if c in samples.columns]
        if columns:
            mask.loc[index] = samples.loc[index, columns].isna().all(axis=1)
    return mask
