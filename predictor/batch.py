"""The batch CSV schema (`tracekit predict --batch`): the column layout of the shared corpus's
e2e/vtrain_a100_single_node.csv. Input columns are Megatron settings (short names as in that file); an empty cell
takes Megatron's default; a cell may carry a note after its value (`full (use_checkpoint=true)`): the leading token is
the value. `hardware_gpu` is free text ("NVIDIA A100 (SXM variant/memory not stated in repo)"), refined by
`gpu_memory_gb` when given. The output repeats every input column and appends OUTPUT_COLUMNS.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError, InputError
from tracekit.core.hardware import Cluster, normalize_hardware

#: Columns read as the configuration (everything else is carried through untouched).
CONFIG_COLUMNS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "seq_length",
    "vocab_size", "global_batch_size", "micro_batch_size", "tp", "pp", "dp", "cp", "sequence_parallel",
    "virtual_pipeline_stages", "activation_recompute", "precision", "num_gpus",
)
CLUSTER_COLUMNS = ("hardware_gpu", "gpu_memory_gb", "gpus_per_node")
#: Optional extra columns understood when present: any TrainingConfig field name (e.g. attention, swiglu).
BREAKDOWN = ("compute", "exposed_communication", "pipeline_bubble", "optimizer", "other")
OUTPUT_COLUMNS = (
    "predicted_iteration_time_s", *(f"predicted_{k}_s" for k in BREAKDOWN), "predicted_tflops_per_gpu",
    "predicted_mfu", "predicted_tokens_per_s", "predicted_memory_gb_per_gpu", "hardware_used", "warnings", "error",
)
_OPTIMIZER_SHARDED = ("zero", "zero1", "zero-1", "zero_1", "distributed", "distributed_optimizer")


@dataclass
class BatchRow:
    line: int
    cells: dict[str, str]
    config: TrainingConfig | None
    cluster: Cluster | None
    error: str | None


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


def hardware_text(cells: dict[str, str]) -> str:
    """Normalized hardware id from `hardware_gpu` (text before any note) and `gpu_memory_gb`."""
    text = cells.get("hardware_gpu", "").split("(")[0].strip()
    memory = cells.get("gpu_memory_gb", "").strip().split(" ")[0]
    if memory:
        try:
            text = f"{text} {int(float(memory))}GB"
        except ValueError:
            pass
    return normalize_hardware(text) if text else ""


def parse_row(cells: dict[str, str], line: int, hardware: str | None, gpus_per_node: int | None,
              overrides: dict[str, Any] | None = None) -> BatchRow:
    """One CSV row → configuration and cluster (or the reason it cannot be predicted)."""
    try:
        mapping: dict[str, Any] = {k: cells[k] for k in CONFIG_COLUMNS if k in cells}
        known = {f for f in TrainingConfig.__dataclass_fields__ if f != "extra"}
        mapping.update({k: v for k, v in cells.items() if k in known and k not in mapping})
        sharding = cells.get("zero_or_fsdp", "").strip().split(" ")[0].lower()
        if sharding in _OPTIMIZER_SHARDED:
            mapping["use_distributed_optimizer"] = True
        mapping.update(overrides or {})
        config = TrainingConfig.from_mapping(mapping).validate()
        hw = hardware or hardware_text(cells)
        if not hw:
            raise ConfigError("no hardware: fill hardware_gpu or pass --hardware")
        gpn_cell = cells.get("gpus_per_node", "").strip().split(" ")[0]
        gpn = gpus_per_node or (int(float(gpn_cell)) if gpn_cell else 8)
        return BatchRow(line, cells, config, Cluster(hw, gpn), None)
    except (ConfigError, ValueError) as exc:
        return BatchRow(line, cells, None, None, str(exc))


def output_row(cells: dict[str, str], prediction: Any = None, error: str | None = None) -> dict[str, Any]:
    """Input cells + prediction columns (blank on error)."""
    out: dict[str, Any] = dict(cells)
    if prediction is not None:
        out["predicted_iteration_time_s"] = f"{prediction.iteration_time_s:.6g}"
        for key in BREAKDOWN:
            out[f"predicted_{key}_s"] = f"{prediction.breakdown[key]:.6g}"
        out["predicted_tflops_per_gpu"] = f"{prediction.tflops_per_gpu:.4g}"
        out["predicted_mfu"] = "" if prediction.mfu is None else f"{prediction.mfu:.4g}"
        out["predicted_tokens_per_s"] = f"{prediction.tokens_per_s:.6g}"
        out["predicted_memory_gb_per_gpu"] = f"{prediction.memory_gb_per_gpu['total']:.3g}"
        out["hardware_used"] = prediction.hardware_used
        out["warnings"] = " | ".join(prediction.warnings)
        out["error"] = ""
    else:
        out.update({c: "" for c in OUTPUT_COLUMNS})
        out["error"] = error or "failed"
    return out


def write_rows(path: str | Path, header: list[str], rows: list[dict[str, Any]]) -> None:
    """The output CSV (input columns first, then OUTPUT_COLUMNS), written atomically."""
    from tracekit.core.atomic import atomic_write_text

    columns = header + [c for c in OUTPUT_COLUMNS if c not in header]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())
