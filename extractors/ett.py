"""The seed paper's sample CSVs (estimate-train-time: `<GPU>_<op>_fp16[_<nodes>_<gpusPerNode>].csv`) → samples.

Each operator file becomes samples of tracekit's primitives with the tensor shapes of the paper's micro-benchmarks
(tensors laid out [l, b, ...] as in Megatron/GPT-NeoX; `mp` = tensor-parallel degree, vocabulary 50257 padded to a
multiple of 128·mp). NCCL files become collectives: `bytes` = fp16 element count × 2 (the per-rank buffer),
`group_size` = nodes × GPUs per node. A `B_dur(us)` row is the whole backward of the op (role `whole`), keyed by
the forward shapes like the `F_dur(us)` row beside it. The fit-summary files (`<GPU>.csv`, no op suffix) are not
samples; their `Best_error%` entries (the paper's per-operator error) are read by `fit_summaries`.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from tracekit.core.errors import InputError
from tracekit.core.hardware import normalize_hardware
from tracekit.core.hashing import file_digest
from tracekit.core.megatron_defaults import padded_vocab_size

from . import files
from .tables import numbers

VOCAB = 50257
_NAME = re.compile(r"^(?P<gpu>[^_]+)_(?P<op>.+)_(?P<dtype>fp16|bf16|fp32)(?:_(?P<nodes>\d+)_(?P<gpn>\d+))?\.csv$")
_SUMMARY = re.compile(r"^(?P<gpu>[^_]+)\.csv$")


def vocab_padded(mp: np.ndarray) -> np.ndarray:
    """Megatron's padded vocabulary: 50257 rounded up to a multiple of 128·mp."""
    return padded_vocab_size(VOCAB, 128, mp)


def stage_params(dim: np.ndarray, layers: np.ndarray, mp: np.ndarray, stage: str) -> np.ndarray:
    """Parameters one tensor-parallel rank of a GPT-NeoX pipeline stage holds (weights and biases)."""
    per_layer = 12 * dim**2 / mp + 7 * dim / mp + 6 * dim
    params = layers * per_layer
    if stage == "first":
        params = params + vocab_padded(mp) / mp * dim
    elif stage == "last":
        params = params + vocab_padded(mp) / mp * dim + 2 * dim
    return params


def _gemm(m, n, k):
    return {"m": m, "n": n, "k": k, "batch": np.ones_like(m)}


def _shapes(op: str, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feature columns of one op file from its input columns (names as in the CSV header)."""
    # ops without an `mp` column (norms, res_add, the whole-model optimizer) never use it
    mp = c["mp"] if "mp" in c else np.array(np.nan)
    if op == "linear1":
        return _gemm(c["l"] * c["b"], 3 * c["dim"] / mp, c["dim"])
    if op == "linear2":
        return _gemm(c["l"] * c["b"], c["dim"], c["dim"] / mp)
    if op == "linear3":
        return _gemm(c["l"] * c["b"], 4 * c["dim"] / mp, c["dim"])
    if op == "linear4":
        return _gemm(c["l"] * c["b"], c["dim"], 4 * c["dim"] / mp)
    if op == "linear_final":
        return _gemm(c["l"] * c["b"], vocab_padded(mp) / mp, c["dim"])
    heads = c["h"] / mp if "h" in c else None
    if op == "flash_atten":
        return {"batch": c["b"], "heads": heads, "kv_heads": heads, "seq": c["l"], "seq_kv": c["l"],
                "head_dim": c["dim"] / c["h"], "causal": np.zeros_like(c["l"])}
    if op == "baddbmm":
        return {"batch": c["b"] * heads, "m": c["l"], "n": c["l"], "k": c["dim"] / c["h"]}
    if op == "bmm":
        return {"batch": c["b"] * heads, "m": c["l"], "n": c["dim"] / c["h"], "k": c["l"]}
    if op in ("softmax", "ScaledUpperTriangMaskedSoftmax", "fillmask"):
        out = {"batch": c["b"], "heads": heads, "seq": c["l"], "rows": c["b"] * heads * c["l"], "width": c["l"],
               "numel": c["b"] * heads * c["l"] ** 2,
               "causal": np.full_like(c["l"], 1.0 if op == "ScaledUpperTriangMaskedSoftmax" else 0.0)}
        if "dim" in c:  # fillmask also runs the baddbmm that produces the scores
            out["head_dim"] = c["dim"] / c["h"]
        return out
    if op == "gelu":
        width = 4 * c["dim"] / mp
        return {"rows": c["l"] * c["b"], "width": width, "numel": c["l"] * c["b"] * width}
    if op == "RoPE":
        return {"rows": c["l"] * c["b"] * heads, "width": c["dim"] / c["h"], "heads": heads,
                "head_dim": c["dim"] / c["h"], "numel": c["l"] * c["b"] * c["dim"] / mp}
    if op in ("layernorm", "RMSlayernorm", "res_add"):
        return {"rows": c["l"] * c["b"], "width": c["dim"], "numel": c["l"] * c["b"] * c["dim"]}
    if op == "embedding":
        return {"rows": c["b"] * c["l"], "width": c["dim"], "params": vocab_padded(mp) / mp, "tp": mp,
                "numel": c["b"] * c["l"] * c["dim"]}
    if op.startswith("parallel_cross_entropy"):
        width = vocab_padded(mp) / mp
        return {"rows": c["b"] * c["l"], "width": width, "tp": mp, "numel": c["b"] * c["l"] * width}
    if op in ("firstStage_optimizer", "middleStage_optimizer", "lastStage_optimizer"):
        stage = op.split("Stage")[0]
        return {"params": stage_params(c["dim"], c["encoders"], mp, stage), "layers": c["encoders"],
                "width": c["dim"], "tp": mp}
    if op == "optimizer":
        return {"params": c["params"], "layers": c["num_layers"], "width": c["hidden_size"]}
    raise KeyError(op)


#: op → (primitive, input columns). Durations: F_dur(us)/B_dur(us) (fwd/bwd) or dur(us)/dur (one pass).
OPS: dict[str, tuple[str, tuple[str, ...]]] = {
    **{f"linear{i}": ("gemm", ("mp", "b", "l", "dim")) for i in (1, 2, 3, 4)},
    "linear_final": ("gemm", ("mp", "b", "l", "dim")),
    "flash_atten": ("attention", ("mp", "b", "h", "l", "dim")),
    "baddbmm": ("bmm", ("mp", "b", "h", "l", "dim")),
    "bmm": ("bmm", ("mp", "b", "h", "l", "dim")),
    "softmax": ("softmax", ("mp", "b", "h", "l")),
    "ScaledUpperTriangMaskedSoftmax": ("softmax", ("mp", "b", "h", "l")),
    "fillmask": ("softmax", ("mp", "b", "h", "l", "dim")),
    "gelu": ("activation", ("mp", "b", "l", "dim")),
    "RoPE": ("elementwise", ("mp", "b", "h", "l", "dim")),
    "res_add": ("elementwise", ("b", "l", "dim")),
    "layernorm": ("norm", ("b", "l", "dim")),
    "RMSlayernorm": ("norm", ("b", "l", "dim")),
    "embedding": ("embedding", ("mp", "b", "l", "dim")),
    "parallel_cross_entropy_128": ("cross_entropy", ("mp", "b", "l")),
    "firstStage_optimizer": ("optimizer", ("mp", "dim", "encoders")),
    "middleStage_optimizer": ("optimizer", ("mp", "dim", "encoders")),
    "lastStage_optimizer": ("optimizer", ("mp", "dim", "encoders")),
    "optimizer": ("optimizer", ("num_layers", "hidden_size", "param_tensors", "params")),
}
#: NCCL file op → collective primitive.
COLLECTIVES = {"allreduce": "all_reduce", "allreduce_large": "all_reduce", "allgather_large": "all_gather",
               "allgather": "all_gather", "reducescatter": "reduce_scatter", "p2p": "send_recv",
               "alltoall": "all_to_all", "broadcast": "broadcast"}
NCCL_COLUMNS = ("shape", "nodes", "GPUsPerNode")


def is_fit_summary(path: Path) -> bool:
    return bool(_SUMMARY.match(path.name))


def list_files(root: str | Path) -> list[Path]:
    """Sample files under a folder tree (or the file itself), fit summaries excluded, sorted."""
    return files.list_files(root, lambda p: p.suffix.lower() == ".csv" and not is_fit_summary(p))


def read_file(path: str | Path, source: str | None = None) -> pd.DataFrame:
    """All samples of one sample file, every row validated (InputError names the file and line otherwise)."""
    path = Path(path)
    match = _NAME.match(path.name)
    if not match:
        raise InputError(path, "not a sample file name of the form <GPU>_<op>_<dtype>[_<nodes>_<gpusPerNode>].csv")
    op, dtype = match["op"], match["dtype"]
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=True)
    except (OSError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise InputError(path, f"unreadable CSV ({str(exc).splitlines()[0]})") from exc
    frame.columns = [c.strip() for c in frame.columns]
    if frame.empty:
        raise InputError(path, "no sample rows")
    hardware = normalize_hardware(match["gpu"])
    base = {"hardware": hardware, "dtype": dtype, "variant": op, "source": source or file_digest(path),
            "source_path": path.name}

    if op in COLLECTIVES:
        missing = [c for c in (*NCCL_COLUMNS, "dur(us)") if c not in frame.columns]
        if missing:
            raise InputError(path, f"missing column(s) {missing} for NCCL samples")
        c = numbers(frame, path, [*NCCL_COLUMNS, "dur(us)"])
        if match["nodes"] and (np.any(c["nodes"] != int(match["nodes"])) or
                               np.any(c["GPUsPerNode"] != int(match["gpn"]))):
            row = int(np.flatnonzero((c["nodes"] != int(match["nodes"])) |
                                     (c["GPUsPerNode"] != int(match["gpn"])))[0])
            raise InputError(path, f"line {row + 2}: topology differs from the file name's "
                                   f"{match['nodes']} nodes × {match['gpn']} GPUs")
        size = 2 if dtype in ("fp16", "bf16") else 4
        rows = pd.DataFrame({"primitive": COLLECTIVES[op], "pass": "comm", "bytes": c["shape"] * size,
                             "group_size": c["nodes"] * c["GPUsPerNode"], "ranks_per_node": c["GPUsPerNode"],
                             "nodes": c["nodes"], "numel": c["shape"], "duration_us": c["dur(us)"]})
        return rows.assign(**base)

    if op not in OPS:
        raise InputError(path, f"unknown operator {op!r} (known: {', '.join(sorted(OPS))})")
    primitive, inputs = OPS[op]
    durations = [("fwd", "F_dur(us)"), ("bwd", "B_dur(us)")] if "F_dur(us)" in frame.columns else \
        [("optimizer" if primitive == "optimizer" else "fwd", "dur(us)" if "dur(us)" in frame.columns else "dur")]
    missing = [col for col in (*inputs, *(d for _, d in durations)) if col not in frame.columns]
    if missing:
        raise InputError(path, f"missing column(s) {missing} for operator {op!r}")
    c = numbers(frame, path, list(inputs) + [d for _, d in durations])
    shapes = pd.DataFrame(_shapes(op, c))
    parts = [shapes.assign(primitive=primitive, **{"pass": name}, duration_us=c[col],
                           role="whole" if name == "bwd" else None) for name, col in durations]
    return pd.concat(parts, ignore_index=True).assign(**base)


def fit_summaries(root: str | Path) -> pd.DataFrame:
    """The paper's per-operator fit summaries: hardware, op, pass (fwd/bwd/optimizer/comm), nodes, gpus_per_node
    (0 = the pooled fit over every topology), model, best_error (MAPE as a fraction)."""
    frames = []
    for path in sorted(Path(root).rglob("*.csv")):
        if not is_fit_summary(path):
            continue
        table = pd.read_csv(path)
        if "Best_error%" not in table.columns:
            raise InputError(path, "fit summary without a Best_error% column")
        out = pd.DataFrame({
            "hardware": [normalize_hardware(g) for g in table["GPU"]],
            "op": table["Function"].astype(str),
            "best_error": table["Best_error%"].astype(float),
            "model": table["Best_model"].astype(str),
        })
        if "Propagation" in table.columns:
            prop = table["Propagation"].astype(str)
            out["pass"] = np.where(prop == "dur", "optimizer", prop)
            out["nodes"] = 0
            out["gpus_per_node"] = 0
        else:
            out["pass"] = "comm"
            out["nodes"] = table["Nodes"].astype(int)
            out["gpus_per_node"] = table["GPUsPerNode"].astype(int)
        frames.append(out)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def topology_of(path: Path) -> tuple[int, int]:
    """(nodes, GPUs per node) from an NCCL file name; (0, 0) for a file pooling every topology."""
    match = _NAME.match(path.name)
    if not match or not match["nodes"]:
        return 0, 0
    return int(match["nodes"]), int(match["gpn"])


__all__ = ["OPS", "COLLECTIVES", "fit_summaries", "is_fit_summary", "list_files", "read_file", "stage_params",
           "topology_of", "vocab_padded"]
