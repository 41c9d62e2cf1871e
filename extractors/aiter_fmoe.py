"""ROCm aiter's fused-MoE tuning results (`aiter/configs/tuned_fmoe.csv`: the best two-stage kernels per MoE shape on
the tuning machine) → grouped-GEMM samples.

A row is one MoE layer's experts on `token` tokens: `expert` experts, each token routed to `topk` of them, hidden
`model_dim`, expert width `inter_dim` (gate and up together when `use_g1u1`). Its two timed kernels are the two
grouped GEMMs of the experts, as the operator graph describes them (predictor.layers.moe.ops: a `gemm` row with `batch`
= experts, each group m = token · topk / expert rows):
- stage 1 (`us1`): [m, model_dim] × [model_dim, inter_dim (× 2 with use_g1u1)], the activation fused;
- stage 2 (`us2`): [m, inter_dim] × [inter_dim, model_dim], the routing weights applied.
dtype from `q_type`: QuantType.No → bf16, per_Tensor → fp8, per_Token → fp8 (one scale per row: the epilogue cost of
a per-tensor scale), per_1x128 → fp8_block; the kind stays in `variant`. The kernels are named (`kernelName1/2`),
the times are the tuner's best (best of an autotuning sweep); the library version is the aiter commit (not in the
file).

Refused by name: int8 rows (not a GEMM dtype tracekit models), one-stage rows (`run_1stage`: one fused kernel, no
per-stage time). The file has no `gfx` column: the part is found from `cu_num` among the datasheet parts; when
none has that CU count (the corpus's file: 80 CUs and fp8 e4m3fnuz, a gfx942 part with 80 CUs — MI308X, which the
datasheet table does not hold), the file is refused whole unless `--hardware` names the part.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tracekit.core.errors import InputError
from tracekit.core.hardware import SPECS, normalize_hardware
from tracekit.core.hashing import file_digest

from . import files
from .tables import TableRead, above_peak, numbers, read_table, refuse, repeated

COLUMNS = ("cu_num", "token", "model_dim", "inter_dim", "expert", "topk", "act_type", "q_type", "use_g1u1", "us1",
           "us2", "kernelName1", "kernelName2")
QUANT = {"QuantType.No": "bf16", "QuantType.per_Tensor": "fp8", "QuantType.per_Token": "fp8",
         "QuantType.per_1x128": "fp8_block"}


def list_files(root: str | Path) -> list[Path]:
    return files.list_files(root, lambda p: p.suffix.lower() == ".csv" and "fmoe" in p.name.lower())


def read_file(path: str | Path, hardware: str | None = None, source: str | None = None) -> TableRead:
    """Samples of one aiter tuned-fMoE file (two per row, see the module docstring)."""
    path = Path(path)
    frame = read_table(path, COLUMNS, "an aiter tuned-fMoE file")
    c = numbers(frame, path, ("cu_num", "token", "model_dim", "inter_dim", "expert", "topk", "use_g1u1", "us1", "us2"),
                zero_ok=("use_g1u1", "us2"))  # us2 is 0 for one-stage rows
    if hardware:
        hw = normalize_hardware(hardware)
    else:
        cus = sorted(set(c["cu_num"]))
        by_cus = {cu: [s.name for s in SPECS.values() if s.sms == cu and s.die.startswith("gfx")] for cu in cus}
        unplaced = [cu for cu, names in by_cus.items() if len(names) != 1]
        if unplaced:
            raise InputError(path, f"no gfx column, and cu_num {unplaced[0]:g} names no single AMD part of the "
                                   "datasheet table (MI300X has 304 CUs, MI355X 256; 80 CUs with fp8 e4m3fnuz is a "
                                   "gfx942 part such as MI308X); give --hardware to place the rows")
        if len(cus) > 1:
            raise InputError(path, f"rows of several parts (cu_num {', '.join(f'{x:g}' for x in cus)}); "
                                   "import one part per file")
        hw = by_cus[cus[0]][0]
    q_type = frame["q_type"].str.strip()
    lines = np.arange(len(frame)) + 2
    names = [f"{path.name} line {line}: token={t:g} model_dim={d:g} inter_dim={i:g} expert={e:g} topk={k:g} {q}"
             for line, t, d, i, e, k, q in zip(lines, c["token"], c["model_dim"], c["inter_dim"], c["expert"],
                                               c["topk"], q_type)]
    bad = np.zeros(len(frame), dtype=bool)
    refused: list[dict] = []

    def take(mask: np.ndarray, reason: str) -> None:
        new = mask & ~bad
        refuse(refused, lines[new], [nm for nm, keep in zip(names, new) if keep], reason)
        bad[new] = True

    weights = frame.get("q_dtype_w", pd.Series("", index=frame.index)).str.strip()
    take((~q_type.isin(list(QUANT)) | weights.str.contains("int")).to_numpy(),
         "quantisation not a GEMM dtype tracekit models (integer weights)")
    fused = frame.get("run_1stage", pd.Series("0", index=frame.index)).str.strip() == "1"
    take((c["us2"] <= 0) | fused.to_numpy(), "one fused kernel (run_1stage): no per-stage time")
    key = pd.DataFrame({col: frame[col].str.strip() for col in COLUMNS if col not in ("us1", "us2", "kernelName1",
                                                                                     "kernelName2")})
    key["doweight"] = frame.get("doweight_stage1", pd.Series("", index=frame.index)).str.strip()
    take(repeated(key, list(key.columns)), "the same MoE shape and quantisation is listed again later in the file "
                                           "(the later entry is kept)")
    dtype = q_type.map(QUANT).fillna("")
    m = c["token"] * c["topk"] / c["expert"]
    fc1 = c["inter_dim"] * np.where(c["use_g1u1"] > 0, 2.0, 1.0)
    act = frame["act_type"].str.strip().str.replace("ActivationType.", "", regex=False).str.lower()
    stages = []
    for stage, n, k, us, kernel in ((1, fc1, c["model_dim"], c["us1"], "kernelName1"),
                                    (2, c["model_dim"], c["inter_dim"], c["us2"], "kernelName2")):
        work = 2.0 * c["expert"] * m * n * k
        over = above_peak(hw, dtype, work, us * 1e-6) & ~bad
        take(over, f"stage {stage} faster than the part's dense peak for its dtype")
        stages.append((stage, n, k, us, kernel))
    keep = ~bad
    parts = []
    for stage, n, k, us, kernel in stages:
        parts.append(pd.DataFrame({
            "hardware": hw, "primitive": "gemm", "pass": "fwd", "dtype": dtype[keep].to_numpy(),
            "variant": (f"aiter fmoe stage{stage} " + act + " " + q_type.str.replace("QuantType.", "", regex=False)
                        )[keep].to_numpy(),
            "m": m[keep], "n": n[keep], "k": k[keep], "batch": c["expert"][keep],
            "numel": (c["expert"] * m * n)[keep], "duration_us": us[keep],
            "kernel": frame[kernel].str.strip()[keep].to_numpy(), "source": source or file_digest(path),
            "source_path": path.name,
        }))
    samples = pd.concat(parts, ignore_index=True)
    facts = {"format": "aiter-fmoe", "hardware": hw,
             "hardware_note": f"--hardware {hardware}" if hardware else f"cu_num {c['cu_num'][0]:g} → {hw}",
             "best_of_autotune": "yes: the tuner's best kernels per shape", "kernel": "named per row",
             "unknown": ["library version (the aiter commit the file was taken at; not in the file)",
                         "how tokens were spread over the experts (m = token · topk / expert on average)"]}
    return TableRead(samples, refused, facts)


__all__ = ["QUANT", "list_files", "read_file"]
