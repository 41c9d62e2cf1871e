"""The batch CSV schema (`tracekit predict --batch`): the column layout of the shared corpus's e2e CSVs.

Input columns are Megatron settings (short names as in those files). Cells are read as published tables write
them: a value may carry a note after it (`full (use_checkpoint=true)`, `fp16 mixed (...)`): the leading token is
the value; an empty cell, `not stated`, `unknown` or `n/a` takes Megatron's default; an ambiguous cell
(`fp16/bf16`) takes the default when it is among the alternatives, else the first; `selective (attention core
only)` is `selective`. Every such substitution is reported in the row's `prediction_notes` output column (the
corpus files have a `notes` column of their own, carried through).

What the row's stack and cluster were is read from the row: `framework` picks the software-stack profile
(`predictor.stack`), `hardware_gpu` + `gpu_memory_gb` the hardware id (a datasheet entry; the closest installed
models are named in `hardware_used`), `gpus_per_node` + `interconnect` the cluster preset
(`tracekit.core.cluster.infer_cluster`). `num_gpus` that disagrees with tp·pp·dp·cp is an error naming both.
The output repeats every input column and appends OUTPUT_COLUMNS.
"""
from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracekit.core.cluster import Cluster, infer_cluster
from tracekit.core.config import TrainingConfig, own_setting_names, setting_name
from tracekit.core.errors import ConfigError, InputError
from tracekit.core.hardware import hardware_spec, normalize_hardware
from tracekit.core.sharding import settings_from_text, with_shard_inside
from tracekit.core.torchtitan_job import as_torchtitan_runs

from .calibration import Calibration
from .job_segments import launched_cluster
from .predict import BREAKDOWN
from .row_settings import argument_settings, note_settings
from .stack import Stack, get_stack, select_stack

#: Columns read as the configuration (everything else is carried through untouched).
CONFIG_COLUMNS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "seq_length",
    "vocab_size", "global_batch_size", "micro_batch_size", "tp", "pp", "dp", "cp", "sequence_parallel",
    "virtual_pipeline_stages", "activation_recompute", "precision", "num_gpus",
)
#: Optional extra columns understood when present: any setting TrainingConfig reads (e.g. attention, swiglu, the MoE
#: columns num_experts ... expert_tensor_parallel_size, moe_first_k_dense, the MLA columns q_lora_rank ...
#: v_head_dim with multi_latent_attention yes), and the row's `megatron_args` and `notes` (predictor.row_settings).
MLA_COLUMNS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
OUTPUT_COLUMNS = (
    "predicted_iteration_time_s", *(f"predicted_{k}_s" for k in BREAKDOWN), "predicted_tflops_per_gpu",
    "predicted_mfu", "predicted_tokens_per_s", "predicted_memory_gb_per_gpu", "hardware_used", "cluster", "stack",
    "prediction_notes", "warnings", "error",
)
_UNSTATED = re.compile(r"^(not stated|unknown|n/?a|unspecified|-|\?|none given)\b", re.I)
#: Defaults the documentation names for cells that do not say (Megatron's own where it has one).
DEFAULTS = {"micro_batch_size": 1, "precision": "bf16", "activation_recompute": "none", "sequence_parallel": False,
            "virtual_pipeline_stages": None, "cp": 1}


@dataclass
class BatchRow:
    line: int
    cells: dict[str, str]
    config: TrainingConfig | None
    cluster: Cluster | None
    error: str | None
    stack: Stack | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def calibration(self) -> Calibration | None:
        return self.stack.calibration(self.cluster.hardware if self.cluster else "") if self.stack else None

    def complete(self) -> tuple[TrainingConfig, Cluster, Stack]:
        """Configuration, cluster and stack of a row that parsed (`error` None: `parse_row` sets all three)."""
        if self.config is None or self.cluster is None or self.stack is None:
            raise ValueError(f"line {self.line} did not parse: {self.error}")
        return self.config, self.cluster, self.stack


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
            return None, f"micro_batch_size not stated: {DEFAULTS['micro_batch_size']} assumed"
        return None, None
    if _UNSTATED.match(raw):
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


def parse_row(cells: dict[str, str], line: int, hardware: str | None, gpus_per_node: int | None,
              overrides: dict[str, Any] | None = None, stack: str | None = None,
              cluster: Cluster | None = None) -> BatchRow:
    """One CSV row → configuration, cluster and stack (or the reason it cannot be predicted). `hardware`,
    `gpus_per_node`, `stack` and `cluster` override what the row says; `overrides` are Megatron settings."""
    notes: list[str] = []
    try:
        chosen, note = (get_stack(stack), None) if stack else select_stack(cells.get("framework", ""))
        if note:
            notes.append(note)
        mapping: dict[str, Any] = {}
        known = own_setting_names() - {"precision"} | {"precision"}
        mla = str(cells.get("multi_latent_attention", "")).strip().lower() in ("yes", "true", "1")
        for key in list(CONFIG_COLUMNS) + [k for k in cells if k in known and k not in CONFIG_COLUMNS]:
            if key not in cells or (key in MLA_COLUMNS and not mla):
                continue
            value, note = read_cell(key, cells[key])
            if note:
                notes.append(note)
            if value is not None:
                mapping[key] = value
        if mla:
            mapping["multi_latent_attention"] = True
        if str(mapping.get("moe_shared_expert_intermediate_size", "")) in ("0", "0.0"):
            mapping.pop("moe_shared_expert_intermediate_size")
        from_notes, read = note_settings(cells, {setting_name(k) for k in mapping})
        mapping.update(from_notes)
        notes.extend(read)
        mapping.update(argument_settings(cells))
        sharded, sharding_notes, inside_node = settings_from_text(cells.get("zero_or_fsdp", ""),
                                                                  cells.get("fsdp", ""), cells.get("framework", ""))
        mapping.update(sharded)
        notes.extend(sharding_notes)
        stated = _parallel_product(mapping)
        if "num_gpus" in mapping and stated and "dp" in mapping and int(float(mapping["num_gpus"])) != stated[0]:
            raise ConfigError(f"num_gpus {mapping['num_gpus']} disagrees with tp·pp·dp·cp = {stated[1]} = "
                              f"{stated[0]}")
        mapping.update(overrides or {})
        config = TrainingConfig.from_mapping(mapping, chosen.config)
        if chosen.name == "torchtitan":  # FSDP2, SP with TP, torchtitan's pipeline split
            config = as_torchtitan_runs(config, notes)
        config = _uneven(config, cells, notes)
        config.validate()
        if cluster is not None:
            where = cluster if not hardware else cluster.with_hardware(hardware)
        else:
            hw, note = (hardware, None) if hardware else hardware_text(cells)
            if note:
                notes.append(note)
            if not hw:
                raise ConfigError("no hardware: fill hardware_gpu or pass --hardware")
            gpn_cell = cells.get("gpus_per_node", "").strip().split(" ")[0]
            gpn = gpus_per_node or (int(float(gpn_cell)) if gpn_cell else None)
            where, note = infer_cluster(hw, gpn, " ".join(cells.get(k, "") for k in ("interconnect", "hardware_gpu")))
            if note:
                notes.append(note)
        where, note = launched_cluster(chosen.name, where, config.world_size)  # Bridge's Slurm segments
        if note:
            notes.append(note)
        if inside_node:  # HYBRID_SHARD: each node's data-parallel ranks shard, the nodes replicate
            config = with_shard_inside(config, where.domain_size)
        return BatchRow(line, cells, config, where, None, chosen, notes)
    except (ConfigError, ValueError) as exc:
        return BatchRow(line, cells, None, None, str(exc), None, notes)


def _uneven(config: TrainingConfig, cells: dict[str, str], notes: list[str]) -> TrainingConfig:
    """A row whose layers its virtual stages do not divide, with no layout stated, ran with the recipe's layout: the
    filled one (tracekit.core.pipeline_layout.filled_layout), said in the notes. Megatron refuses such a split
    without a layout, so a configuration file or command line is refused instead (TrainingConfig.validate)."""
    import dataclasses

    from tracekit.core.pipeline_layout import LayoutSettings, filled_layout

    stages = config.pp * config.vp
    layout = config.layout or LayoutSettings()
    if config.num_layers % stages == 0 or layout.pipeline_model_parallel_layout or \
            layout.decoder_first_pipeline_num_layers is not None or layout.decoder_last_pipeline_num_layers is not None:
        return config
    text = filled_layout(config.num_layers, stages, layout.mtp_num_layers or 0)
    notes.append(f"{config.num_layers} layers over pp·vp = {config.pp}·{config.vp} without a stated layout: "
                 f"{text!r} assumed (⌈layers/stages⌉ a stage, the rest with MTP and the loss on the last)")
    return dataclasses.replace(config, layout=dataclasses.replace(layout, pipeline_model_parallel_layout=text))


def _parallel_product(mapping: dict[str, Any]) -> tuple[int, str] | None:
    """(tp·pp·dp·cp, 'tp·pp·dp·cp' spelled out) from the stated cells; None when one is not a number."""
    try:
        parts = [int(float(mapping.get(k, 1))) for k in ("tp", "pp", "dp", "cp")]
    except (TypeError, ValueError):
        return None
    product = parts[0] * parts[1] * parts[2] * parts[3]
    return product, "·".join(str(p) for p in parts)


def output_row(row: BatchRow, prediction: Any = None, error: str | None = None) -> dict[str, Any]:
    """The row's input cells + prediction columns (blank on error) + what was assumed reading it."""
    out: dict[str, Any] = dict(row.cells)
    if prediction is not None:
        out["predicted_iteration_time_s"] = f"{prediction.iteration_time_s:.6g}"
        for key in BREAKDOWN:
            out[f"predicted_{key}_s"] = f"{prediction.breakdown[key]:.6g}"
        out["predicted_tflops_per_gpu"] = f"{prediction.tflops_per_gpu:.4g}"
        out["predicted_mfu"] = "" if prediction.mfu is None else f"{prediction.mfu:.4g}"
        out["predicted_tokens_per_s"] = f"{prediction.tokens_per_s:.6g}"
        out["predicted_memory_gb_per_gpu"] = f"{prediction.memory_gb_per_gpu['total']:.3g}"
        out["hardware_used"] = prediction.hardware_used
        out["cluster"] = prediction.cluster.name
        out["stack"] = row.stack.name if row.stack else ""
        out["warnings"] = " | ".join(prediction.warnings)
        out["error"] = ""
    else:
        out.update({c: "" for c in OUTPUT_COLUMNS})
        out["error"] = error or "failed"
    out["prediction_notes"] = " | ".join(row.notes)
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


def predict_rows(rows: list[BatchRow], models: Any, calibration: Calibration | None = None, chunk: int = 64,
                 on_chunk: Any = None) -> list[Any]:
    """Every row predicted: `tracekit predict --batch` and `tracekit validate --published` both call this, so the
    same rows get the same predictions. A row's own stack constants unless `calibration` replaces them all; rows in
    chunks of `chunk` (one batched model call each), `on_chunk(rows_done)` after each. Returns one item per row, in
    order: its Prediction, or the exception that stopped it (a row that did not parse: ConfigError(its error))."""
    from .predict import predict_many

    out: list[Any] = [None] * len(rows)
    good = []
    for i, row in enumerate(rows):
        if row.error is not None:
            out[i] = ConfigError(row.error)
        else:
            good.append(i)
    if on_chunk and len(good) < len(rows):
        on_chunk(len(rows) - len(good))
    for first in range(0, len(good), chunk):
        part = good[first:first + chunk]
        parsed = [rows[i].complete() for i in part]
        results = predict_many([config for config, _, _ in parsed], [where for _, where, _ in parsed], models,
                               [calibration if calibration is not None else rows[i].calibration for i in part])
        for i, result in zip(part, results):
            out[i] = result
        if on_chunk:
            on_chunk(len(part))
    return out
