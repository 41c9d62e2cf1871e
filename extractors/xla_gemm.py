"""XLA's GEMM performance tables (`GemmPerfTable`, the data of XLA's matmul interpolator cost model), transcribed one
entry per CSV line (`gpu,arch_key,b,m,n,k,lhs_dtype,rhs_dtype,out_dtype,dtype_key,flops_per_s,...,source_repo,
source_path,source_commit`) → GEMM samples.

Each row is a dot `[b, m, k] × [b, k, n] → [b, m, n]`: a `gemm` sample for b = 1, a `bmm` sample for b > 1, with
m, n, k, batch = b. Its time is the table's own: XLA stores `flops_per_s = 2·b·m·n·k · 1e9 / t_ns` from an integer
kernel time t_ns, so the sample's duration is that t_ns (recovered exactly; a row whose rate does not give back an
integer t_ns is refused: a mistyped digit).

Part (`arch_key`): sm_90 → H100-80GB-HBM3 (the table says "H100 (sm_90)"; the SXM part is assumed), sm_100_B200 →
B200-180GB, gfx942 → MI300X (gfx942 is also MI300A and MI325X; the table names no product). dtype (the inputs):
bf16 → bf16; f8e4m3fn / f8e5m2 → fp8 (XLA's fp8 dot is a per-tensor scaled GEMM); f32 → tf32: XLA's default
precision runs an f32 dot on TF32 (NVIDIA) / xf32 (CDNA 3) tensor cores, and these rows run up to 6× above the fp32
vector peak. The dtype key stays in `variant` (`xla bf16xbf16->f32` keeps the f32 output of gfx942's second bf16
table apart).

What the table cannot tell — which kernel or library ran, its version, whether the time is the best of an
autotuning sweep — is recorded as such (the `kernel` column and the source's facts say "not stated by the table").
Refused rows (see `extractors.tables`): checksum failures, rows above the part's dense peak for their dtype,
low-precision tables implausible against the same file's bf16 rows, a shape and dtype repeated later in the file.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tracekit.core.errors import InputError
from tracekit.core.hardware import normalize_hardware
from tracekit.core.hashing import file_digest

from . import files
from .tables import NOT_STATED, TableRead, above_peak, exact_ns, implausible_lowp, numbers, read_table, refuse, repeated

COLUMNS = ("arch_key", "b", "m", "n", "k", "lhs_dtype", "rhs_dtype", "out_dtype", "dtype_key", "flops_per_s")
#: XLA device keys → hardware id, and what the table does not say about the part.
ARCH = {
    "sm_90": ("H100-80GB-HBM3", "the table says H100 (sm_90); the SXM 80 GB HBM3 part is assumed"),
    "sm_100_B200": ("B200-180GB", "the table says B200 (sm_100)"),
    "gfx942": ("MI300X", "gfx942 is the CDNA 3 ISA of MI300X, MI300A and MI325X; the table names no product, "
                         "MI300X is assumed"),
}
#: Input element types → GEMM dtype.
DTYPES = {"bf16": "bf16", "f16": "fp16", "f32": "tf32", "f8e4m3fn": "fp8", "f8e5m2": "fp8"}
UNKNOWN = ("kernel", "library version", "whether the time is the best of an autotuning sweep")


def list_files(root: str | Path) -> list[Path]:
    return files.list_files(root, lambda p: p.suffix.lower() == ".csv")


def arch_key(frame: pd.DataFrame, path: Path, hardware: str | None) -> str:
    """The one arch key of an XLA table (InputError for several, or an unknown one without `hardware`)."""
    archs = sorted(set(frame["arch_key"].str.strip()))
    if len(archs) != 1:
        raise InputError(path, f"one device per file expected, found arch keys {archs}")
    if hardware is None and archs[0] not in ARCH:
        raise InputError(path, f"unknown arch key {archs[0]!r} (known: {', '.join(ARCH)}); give --hardware")
    return archs[0]


def read_file(path: str | Path, hardware: str | None = None, source: str | None = None) -> TableRead:
    """Samples of one XLA GEMM table, every row validated (InputError names the file and line of a malformed one);
    suspect rows are refused by name (`TableRead.refused`). `hardware` overrides the part the arch key names."""
    path = Path(path)
    frame = read_table(path, COLUMNS, "an XLA GEMM table")
    arch = arch_key(frame, path, hardware)
    part, part_note = ARCH.get(arch, ("", ""))
    hw = normalize_hardware(hardware) if hardware else part
    c = numbers(frame, path, ("b", "m", "n", "k", "flops_per_s"))
    for col in ("lhs_dtype", "rhs_dtype"):
        unknown = ~frame[col].str.strip().isin(list(DTYPES))
        if unknown.any():
            row = int(np.flatnonzero(unknown.to_numpy())[0])
            raise InputError(path, f"line {row + 2}: unknown element type {frame[col].iloc[row]!r} "
                                   f"(known: {', '.join(DTYPES)})")
    lhs = frame["lhs_dtype"].str.strip().map(DTYPES)
    rhs = frame["rhs_dtype"].str.strip().map(DTYPES)
    mixed = (lhs != rhs).to_numpy()
    if mixed.any():
        row = int(np.flatnonzero(mixed)[0])
        raise InputError(path, f"line {row + 2}: inputs of different kinds ({frame['lhs_dtype'].iloc[row]} × "
                               f"{frame['rhs_dtype'].iloc[row]})")
    dtype = lhs
    key = frame["dtype_key"].str.strip()
    work = 2.0 * c["b"] * c["m"] * c["n"] * c["k"]
    t_ns, exact = exact_ns(work, c["flops_per_s"])
    lines = np.arange(len(frame)) + 2
    names = [f"{path.name} line {line}: b={b:g} m={m:g} n={n:g} k={k:g} {dk}"
             for line, b, m, n, k, dk in zip(lines, c["b"], c["m"], c["n"], c["k"], key)]
    shape = frame[["b", "m", "n", "k"]].assign(key=key)
    bad = np.zeros(len(frame), dtype=bool)
    refused: list[dict] = []

    def take(mask: np.ndarray, reason: str) -> None:
        new = mask & ~bad
        refuse(refused, lines[new], [n for n, keep in zip(names, new) if keep], reason)
        bad[new] = True

    take(~exact, "checksum: the rate does not give back an integer number of nanoseconds (a mistyped digit)")
    take(repeated(shape, ["b", "m", "n", "k", "key"]), "the same shape and dtype is listed again later in the file "
                                                       "(the later entry is kept)")
    seconds = np.where(exact, t_ns, work * 1e9 / c["flops_per_s"]) * 1e-9
    judged = pd.DataFrame({"dtype": dtype, "seconds": seconds, "b": c["b"], "m": c["m"], "n": c["n"], "k": c["k"]})
    implausible = implausible_lowp(judged[~bad], hw, ["b", "m", "n", "k"])  # the whole table, as measured
    take(above_peak(hw, dtype, work, seconds), "faster than the part's dense peak for its dtype")
    for low, reason in implausible.items():
        take((dtype == low).to_numpy(), reason)
    keep = ~bad
    b = c["b"][keep]
    samples = pd.DataFrame({
        "hardware": hw, "primitive": np.where(b > 1, "bmm", "gemm"), "pass": "fwd", "dtype": dtype[keep].to_numpy(),
        "variant": ("xla " + key[keep]).to_numpy(), "m": c["m"][keep], "n": c["n"][keep], "k": c["k"][keep],
        "batch": b, "numel": b * c["m"][keep] * c["n"][keep], "duration_us": t_ns[keep] / 1000.0,
        "kernel": f"{NOT_STATED} (XLA dot)", "source": source or file_digest(path), "source_path": path.name,
    })
    facts = {
        "format": "xla-gemm", "arch_key": arch, "hardware": hw,
        "hardware_note": part_note if not hardware else f"--hardware {hardware} (arch key {arch})",
        "origin": _origin(frame), "unknown": list(UNKNOWN),
        "dtype_note": "f32 dots imported as tf32 (XLA's default f32 precision runs TF32/xf32 tensor-core math)",
    }
    return TableRead(samples, refused, facts)


def _origin(frame: pd.DataFrame) -> list[str]:
    """`repo/path@commit` of the rows (the tables carry it per row)."""
    cols = ("source_repo", "source_path", "source_commit")
    if not all(c in frame.columns for c in cols):
        return []
    return sorted({f"{r}/{p}@{c}" for r, p, c in zip(*(frame[col].str.strip() for col in cols))})


__all__ = ["ARCH", "DTYPES", "list_files", "read_file"]
