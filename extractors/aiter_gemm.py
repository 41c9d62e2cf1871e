"""ROCm aiter's GEMM tuning results (`aiter/configs/*tuned_gemm.csv`: the best kernel the tuner found per shape on
its machine) → GEMM samples.

Two layouts, told by their header:
- block-scaled fp8 (`a8w8_blockscale_tuned_gemm.csv`: gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName,...):
  fp8 inputs with 1×128 activation and 128×128 weight scales → dtype `fp8_block`;
- bf16 (`bf16_tuned_gemm.csv`: gfx,cu_num,M,N,K,bias,dtype,outdtype,...,us,kernelName,...) → dtype `bf16` (the
  output dtype is kept in `variant`).

Each row is one GEMM [M, K] × [K, N] (a `gemm` sample, batch 1) timed `us` µs by its kernel `kernelName` (named:
the `kernel` column keeps it). The time is the tuner's best over its candidate kernels (best of an autotuning
sweep); the library version is the aiter commit the file comes from (not in the file: `--data` notes it).

Part: `gfx` and `cu_num` together: gfx950 with 256 CUs → MI355X (256 CUs is both MI350X and MI355X, which differ
in clocks and power; the datasheet table holds MI355X only), gfx942 with 304 CUs → MI300X. Rows of any other part
(gfx1250, or a CU count the datasheet part does not have) are refused by name: no datasheet entry to place them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tracekit.core.errors import InputError
from tracekit.core.hardware import hardware_spec, normalize_hardware
from tracekit.core.hashing import file_digest

from . import files
from .tables import TableRead, above_peak, numbers, read_table, refuse, repeated

#: gfx ISA → (hardware id, note). The CU count must match the datasheet part's.
PARTS = {
    "gfx950": ("MI355X", "gfx950 with 256 CUs is MI350X or MI355X (same die, other clocks); the datasheet table has "
                         "MI355X"),
    "gfx942": ("MI300X", "gfx942 with 304 CUs is MI300X (MI300A has 228, MI308X 80)"),
}
BLOCKSCALE = ("gfx", "cu_num", "M", "N", "K", "us", "kernelName")
BF16 = ("gfx", "cu_num", "M", "N", "K", "dtype", "outdtype", "us", "kernelName")
TORCH_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}


def list_files(root: str | Path) -> list[Path]:
    return files.list_files(root, lambda p: p.suffix.lower() == ".csv" and "gemm" in p.name.lower())


def part_of(gfx: pd.Series, cus: np.ndarray, hardware: str | None) -> tuple[np.ndarray, list[str]]:
    """Hardware id per row ('' where no datasheet part fits) and the reason for each misfit ('' where it fits)."""
    ids, why = [], []
    for g, cu in zip(gfx, cus):
        if hardware:
            ids.append(normalize_hardware(hardware))
            why.append("")
            continue
        part = PARTS.get(g)
        spec = hardware_spec(part[0]) if part else None
        if spec is None:
            ids.append("")
            why.append(f"{g} ({cu:g} CUs): no datasheet part (give --hardware to place it)")
        elif spec.sms != cu:
            ids.append("")
            why.append(f"{g} with {cu:g} CUs: the datasheet's {spec.name} has {spec.sms}")
        else:
            ids.append(spec.name)
            why.append("")
    return np.array(ids, dtype=object), why


def read_file(path: str | Path, hardware: str | None = None, source: str | None = None) -> TableRead:
    """Samples of one aiter tuned-GEMM file, every row validated (InputError names the file and line of a malformed
    one); rows of parts without a datasheet entry and rows above the part's dense peak are refused by name."""
    path = Path(path)
    frame = read_table(path, (), "an aiter tuned-GEMM file")
    if all(c in frame.columns for c in BF16):
        layout = "bf16"
    elif all(c in frame.columns for c in BLOCKSCALE):
        layout = "blockscale"
    else:
        raise InputError(path, f"not an aiter tuned-GEMM file: needs the columns {list(BLOCKSCALE)} "
                               f"(block-scaled fp8) or {list(BF16)} (bf16)")
    c = numbers(frame, path, ("cu_num", "M", "N", "K", "us"))
    gfx = frame["gfx"].str.strip()
    if layout == "bf16":
        unknown = ~frame["dtype"].str.strip().isin(list(TORCH_DTYPES))
        if unknown.any():
            row = int(np.flatnonzero(unknown.to_numpy())[0])
            raise InputError(path, f"line {row + 2}: unknown dtype {frame['dtype'].iloc[row]!r}")
        dtype = frame["dtype"].str.strip().map(TORCH_DTYPES)
        out = frame["outdtype"].str.strip().map(lambda t: TORCH_DTYPES.get(t, t))
        variant = "aiter " + dtype + "->" + out + " " + frame.get("libtype", pd.Series("", index=frame.index))
    else:
        dtype = pd.Series("fp8_block", index=frame.index)
        variant = "aiter a8w8_blockscale " + frame.get("libtype", pd.Series("", index=frame.index))
    hw, misfit = part_of(gfx, c["cu_num"], hardware)
    lines = np.arange(len(frame)) + 2
    names = [f"{path.name} line {line}: {g} M={m:g} N={n:g} K={k:g} {d}"
             for line, g, m, n, k, d in zip(lines, gfx, c["M"], c["N"], c["K"], dtype)]
    bad = np.zeros(len(frame), dtype=bool)
    refused: list[dict] = []

    def take(mask: np.ndarray, reason: str | list[str]) -> None:
        new = mask & ~bad
        reasons = reason if isinstance(reason, list) else [reason] * len(frame)
        for why in sorted({reasons[i] for i in np.flatnonzero(new)}):
            rows = new & (np.array(reasons, dtype=object) == why)
            refuse(refused, lines[rows], [nm for nm, keep in zip(names, rows) if keep], why)
        bad[new] = True

    take(hw == "", misfit)
    take(repeated(pd.DataFrame({"g": gfx, "cu": c["cu_num"], "m": c["M"], "n": c["N"], "k": c["K"], "d": dtype,
                                "v": variant}), ["g", "cu", "m", "n", "k", "d", "v"]),
         "the same part, shape and kernel family are listed again later in the file (the later entry is kept)")
    work = 2.0 * c["M"] * c["N"] * c["K"]
    for part in sorted(set(hw[~bad]) - {""}):
        rows = (hw == part) & ~bad
        over = np.zeros(len(frame), dtype=bool)
        over[rows] = above_peak(part, dtype[rows], work[rows], c["us"][rows] * 1e-6)
        take(over, "faster than the part's dense peak for its dtype")
    keep = ~bad
    samples = pd.DataFrame({
        "hardware": hw[keep], "primitive": "gemm", "pass": "fwd", "dtype": dtype[keep].to_numpy(),
        "variant": variant[keep].str.strip().to_numpy(), "m": c["M"][keep], "n": c["N"][keep], "k": c["K"][keep],
        "batch": 1.0, "numel": c["M"][keep] * c["N"][keep], "duration_us": c["us"][keep],
        "kernel": frame["kernelName"].str.strip()[keep].to_numpy(), "source": source or file_digest(path),
        "source_path": path.name,
    })
    parts = sorted(set(hw[keep]))
    facts = {"format": "aiter-gemm", "layout": layout, "hardware": ", ".join(parts),
             "hardware_note": "; ".join(PARTS[g][1] for g in sorted(set(gfx[keep])) if g in PARTS)
             if not hardware else f"--hardware {hardware}",
             "best_of_autotune": "yes: the tuner's best kernel per shape", "kernel": "named per row (kernelName)",
             "unknown": ["library version (the aiter commit the file was taken at; not in the file)"]}
    return TableRead(samples, refused, facts)


__all__ = ["PARTS", "list_files", "part_of", "read_file"]
