"""XLA's collective performance table (the data of XLA's collective interpolator, written by
`collective_perf_table_gen`), transcribed one entry per CSV line (`gpu,arch_key,collective,num_replica_groups,
replica_group_size,replica_groups,message_elements,dtype,bytes,network_throughput_bytes_per_sec,...`) → collective
samples.

Byte conventions. XLA's generator times a collective on a tensor of T bytes and stores T · 1e9 / t_ns as the
throughput; T is the whole buffer — the all-reduce's, the all-gather's output, the reduce-scatter's input, the
all-to-all's — and its interpolator turns a throughput back into time from the same whole buffer
(`GpuHloCostAnalysis` bytes transferred). The table's `message_elements` is the instruction's result shape, which
for a reduce-scatter is the per-device output T / n: its time is n · elements · 4 / throughput (the transcription's
`time_us` column, elements · 4 / throughput, is n× too short for reduce-scatter rows; it is not read). With T so
defined, every row is an integer number of nanoseconds, which is the integrity check; a row that fails it is refused.

tracekit's `bytes` (predictor.costs.physics.collectives): the whole buffer for all_reduce and all_to_all, each rank's
shard for all_gather and reduce_scatter, so all_gather and reduce_scatter rows get T / n. The groups are `iota` replica
groups of one 8-GPU node: [1×8] one group of 8, [2×4] two groups of 4, [4×2] four groups of 2, all running at once
(every GPU of the node busy, as in training); group_size = ranks_per_node = the group's size, nodes = 1. Elements are
f32 (`dtype` fp32).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tracekit.core.errors import InputError
from tracekit.core.hardware import normalize_hardware
from tracekit.core.hashing import file_digest

from . import files
from .tables import NOT_STATED, TableRead, exact_ns, numbers, read_table, refuse, repeated
from .xla_gemm import ARCH, _origin, arch_key

COLUMNS = ("arch_key", "collective", "num_replica_groups", "replica_group_size", "message_elements", "dtype",
           "network_throughput_bytes_per_sec")
KINDS = {"all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
         "all-to-all": "all_to_all"}
ELEMENT_BYTES = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8, "S32": 4, "U32": 4, "S8": 1, "U8": 1}
DTYPES = {"F32": "fp32", "BF16": "bf16", "F16": "fp16", "F64": "fp64", "S32": "int32", "U32": "uint32",
          "S8": "int8", "U8": "uint8"}
UNKNOWN = ("NCCL version and algorithm", "which GPUs of the node the groups used")


def list_files(root: str | Path) -> list[Path]:
    return files.list_files(root, lambda p: p.suffix.lower() == ".csv")


def read_file(path: str | Path, hardware: str | None = None, source: str | None = None) -> TableRead:
    """Samples of one XLA collective table (see the module docstring), every row validated; rows failing the
    integrity check are refused by name."""
    path = Path(path)
    frame = read_table(path, COLUMNS, "an XLA collective table")
    arch = arch_key(frame, path, hardware)
    hw = normalize_hardware(hardware) if hardware else ARCH[arch][0]
    cols = numbers(frame, path, ("num_replica_groups", "replica_group_size", "message_elements",
                                 "network_throughput_bytes_per_sec"))
    kind = frame["collective"].str.strip()
    element = frame["dtype"].str.strip().str.upper()
    for values, known, what in ((kind, KINDS, "collective"), (element, ELEMENT_BYTES, "element type")):
        unknown = ~values.isin(list(known))
        if unknown.any():
            row = int(np.flatnonzero(unknown.to_numpy())[0])
            raise InputError(path, f"line {row + 2}: unknown {what} {values.iloc[row]!r} (known: {', '.join(known)})")
    n = cols["replica_group_size"]
    groups = cols["num_replica_groups"]
    primitive = kind.map(KINDS).to_numpy()
    size = element.map(ELEMENT_BYTES).to_numpy(dtype="float64")
    result = cols["message_elements"] * size
    whole = np.where(primitive == "reduce_scatter", result * n, result)  # XLA's T: the whole buffer
    t_ns, exact = exact_ns(whole, cols["network_throughput_bytes_per_sec"])
    lines = np.arange(len(frame)) + 2
    names = [f"{path.name} line {line}: {k} {int(e)} elements, {int(g)} group(s) of {int(s)}"
             for line, k, e, g, s in zip(lines, kind, cols["message_elements"], groups, n)]
    bad = np.zeros(len(frame), dtype=bool)
    refused: list[dict] = []

    def take(mask: np.ndarray, reason: str) -> None:
        new = mask & ~bad
        refuse(refused, lines[new], [name for name, keep in zip(names, new) if keep], reason)
        bad[new] = True

    take(~exact, "checksum: the throughput does not give back an integer number of nanoseconds on the whole buffer "
                 "(a mistyped digit)")
    take(repeated(pd.DataFrame({"k": kind, "g": groups, "n": n, "e": cols["message_elements"]}),
                  ["k", "g", "n", "e"]),
         "the same collective, groups and size are listed again later in the file (the later entry is kept)")
    keep = ~bad
    per_rank = np.where(np.isin(primitive, ("all_gather", "reduce_scatter")), whole / n, whole)[keep]
    groups_text = [f"iota[{int(g)}x{int(s)}]" for g, s in zip(groups[keep], n[keep])]
    samples = pd.DataFrame({
        "hardware": hw, "primitive": primitive[keep], "pass": "comm", "dtype": element[keep].map(DTYPES).to_numpy(),
        "variant": [f"xla {k} {g}" for k, g in zip(kind[keep], groups_text)], "bytes": per_rank,
        "numel": per_rank / size[keep], "group_size": n[keep], "ranks_per_node": n[keep], "nodes": 1.0,
        "duration_us": t_ns[keep] / 1000.0, "kernel": f"{NOT_STATED} (XLA collective through NCCL)",
        "source": source or file_digest(path), "source_path": path.name,
    })
    facts = {"format": "xla-collectives", "arch_key": arch, "hardware": hw,
             "hardware_note": ARCH.get(arch, ("", ""))[1] if not hardware else f"--hardware {hardware}",
             "origin": _origin(frame), "unknown": list(UNKNOWN),
             "devices": int(np.max(groups * n)),
             "bytes_note": "XLA's throughput is defined on the whole buffer (reduce-scatter: the input, n x the "
                           "per-device output the table's shape gives)"}
    return TableRead(samples, refused, facts)


__all__ = ["KINDS", "list_files", "read_file"]
