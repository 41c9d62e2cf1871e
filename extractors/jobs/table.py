"""Published end-to-end tables (the shared corpus's e2e CSVs, `tracekit predict --batch`): the columns, and each cell
as a value.

Input columns are Megatron settings (short names as in those files). Cells are read as published tables write
them: a value may carry a note after it (`full (use_checkpoint=true)`, `fp16 mixed (...)`): the leading token is
the value; an empty cell, `not stated`, `unknown` or `n/a` takes Megatron's default; an ambiguous cell
(`fp16/bf16`) takes the default when it is among the alternatives, else the first; `selective (attention core
only)` is `selective`. Every such substitution is reported in the row's notes (`extractors.jobs.rows`).
`hardware_gpu` + `gpu_memory_gb` name the hardware id (a datasheet entry).
"""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

from tracekit.core.errors import InputError
from tracekit.core.hardware import hardware_spec, normalize_hardware

#: Columns read as the configuration (everything else is carried through untouched).
CONFIG_COLUMNS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "seq_length",
    "vocab_size", "global_batch_size", "micro_batch_size", "tp", "pp", "dp", "cp", "sequence_parallel",
    "virtual_pipeline_stages", "activation_recompute", "precision", "num_gpus",
)
#: Optional extra columns understood when present: any setting TrainingConfig reads (e.g. attention, swiglu, the MoE
#: columns num_experts ... expert_tensor_parallel_size, moe_first_k_dense, the MLA columns q_lora_rank ...
#: v_head_dim with multi_latent_attention yes), and the row's `megatron_args` and `notes` (extractors.jobs.notes).
MLA_COLUMNS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
_UNSTATED = re.compile(r"^(not stated|unknown|n/?a|unspecified|-|\?|none given)\b", re.I)
#: What a row that states no micro-batch is predicted at (Megatron has none: `--micro-batch-size` is required):
#: `predictor.batch` tries 1, 2, 4, 8 and 16 and takes the fastest that fits; the row is parsed at 1 meanwhile.
UNSTATED_MICRO_BATCH = ("micro_batch_size not stated: the fastest of 1, 2, 4, 8 and 16 that fits is taken (the "
                        "prediction's warnings say which)")
#: Defaults the documentation names for cells that do not say (Megatron's own where it has one; the micro-batch a
#: row is parsed at before `predictor.batch` picks one).
DEFAULTS = {"micro_batch_size": 1, "precision": "bf16", "activation_recompute": "none", "sequence_parallel": False,
            "virtual_pipeline_stages": None, "cp": 1}


def read_rows(path: str | Path) -> tuple[list[str], list[dict[str, str]]]:
    """(header, rows as str dicts); InputError when the file is unreadable or lacks the model columns."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise InputError(path, "not a UTF-8 CSV file") from exc
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip() for h in (reader.fieldnames or [])]
    needed = ("num_layers", "hidden_size", "num_attention_heads", "seq_length")
    missing = [c for c in needed if c not in header]
    if missing:
        raise InputError(path, f"missing column(s) {', '.join(missing)} (expected the e2e CSV layout)")
    rows = [{(k or "").strip(): (v or "") for k, v in row.items()} for row in reader]
    if not rows:
        raise InputError(path, "no rows")
    return header, rows


def read_cell(column: str, text: str) -> tuple[Any, str | None]:
    """(value, note) of one cell: None for 'take the default' (note says why when the cell said something)."""
    raw = (text or "").strip()
    if not raw:
        if column == "micro_batch_size":
            return None, UNSTATED_MICRO_BATCH
        return None, None
    if _UNSTATED.match(raw):
        if column == "micro_batch_size":
            return None, UNSTATED_MICRO_BATCH
        default = DEFAULTS.get(column, "Megatron's default")
        return None, f"{column} {raw!r}: {default} assumed"
    value = raw.split("(")[0].strip() or raw
    token = value.split()[0]
    if "/" in token and column in ("precision", "activation_recompute"):
        options = [t.strip().lower() for t in token.split("/") if t.strip()]
        default = str(DEFAULTS.get(column, "")).lower()
        chosen = default if default in options else options[0]
        return chosen, f"{column} {raw!r} is ambiguous: {chosen} assumed"
    return token, None


def hardware_text(cells: dict[str, str]) -> tuple[str, str | None]:
    """(hardware id, note) from `hardware_gpu` (text before any note) and `gpu_memory_gb`: the datasheet entry the
    text names (an A100 without a memory size is the 80 GB part; the note says what was assumed)."""
    full = cells.get("hardware_gpu", "").strip()
    text = re.sub(r"\(.*", "", full).strip()
    memory = cells.get("gpu_memory_gb", "").strip().split(" ")[0]
    if memory:
        try:
            text = f"{text} {int(float(memory))}GB"
        except ValueError:
            pass
    if re.search(r"pcie", full, re.I) and "pcie" not in text.lower():
        text += " PCIe"
    if not text:
        return "", None
    hardware = normalize_hardware(text)
    spec = hardware_spec(hardware)
    if spec is None or hardware == spec.name:
        return hardware, None
    stated = "" if re.search(r"\d+\s*GB", text, re.I) else " (memory not stated)"
    return spec.name, f"hardware {full!r}: {spec.name} datasheet{stated}"
