"""One row of a published end-to-end table → the job it describes: configuration, cluster and software stack (or
the reason it cannot be predicted), with what was assumed reading it.

What the row's stack and cluster were is read from the row: `framework` picks the software-stack profile
(`tracekit.core.stacks`), `hardware_gpu` + `gpu_memory_gb` the hardware id (`extractors.jobs.table`),
`gpus_per_node` + `interconnect` the cluster preset (`tracekit.core.cluster.infer_cluster`), the row's notes and
launch line what its columns do not say (`extractors.jobs.notes`), its sharding cells FSDP/ZeRO
(`extractors.jobs.sharding_cells`). `num_gpus` that disagrees with tp·pp·dp·cp is an error naming both.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tracekit.core.calibration import Calibration
from tracekit.core.cluster import Cluster, infer_cluster
from tracekit.core.config import TrainingConfig, own_setting_names
from tracekit.core.errors import ConfigError
from tracekit.core.settings import setting_name
from tracekit.core.stacks import Stack, get_stack, select_stack

from .bridge.segments import launched_cluster
from .notes import argument_settings, not_a_transformer, note_settings
from .sharding_cells import settings_from_text, with_shard_inside
from .table import CONFIG_COLUMNS, MLA_COLUMNS, hardware_text, read_cell
from .torchtitan_runs import as_torchtitan_runs


@dataclass
class BatchRow:
    line: int
    cells: dict[str, str]
    config: TrainingConfig | None
    cluster: Cluster | None
    error: str | None
    stack: Stack | None = None
    notes: list[str] = field(default_factory=list)
    # settings the row left blank whose default was taken (their notes say so): a prediction may say how much they
    # matter (predictor.batch)
    assumed: tuple[str, ...] = ()

    @property
    def calibration(self) -> Calibration | None:
        return self.stack.calibration(self.cluster.hardware if self.cluster else "") if self.stack else None

    def complete(self) -> tuple[TrainingConfig, Cluster, Stack]:
        """Configuration, cluster and stack of a row that parsed (`error` None: `parse_row` sets all three)."""
        if self.config is None or self.cluster is None or self.stack is None:
            raise ValueError(f"line {self.line} did not parse: {self.error}")
        return self.config, self.cluster, self.stack


def parse_row(cells: dict[str, str], line: int, hardware: str | None, gpus_per_node: int | None,
              overrides: dict[str, Any] | None = None, stack: str | None = None,
              cluster: Cluster | None = None) -> BatchRow:
    """One CSV row → configuration, cluster and stack (or the reason it cannot be predicted). `hardware`,
    `gpus_per_node`, `stack` and `cluster` override what the row says; `overrides` are Megatron settings."""
    notes: list[str] = []
    assumed: list[str] = []
    try:
        chosen, note = (get_stack(stack), None) if stack else select_stack(cells.get("framework", ""))
        if note:
            notes.append(note)
        mapping: dict[str, Any] = {}
        known = own_setting_names() - {"precision"} | {"precision"}
        mla = str(cells.get("multi_latent_attention", "")).strip().lower() in ("yes", "true", "1")
        launched = argument_settings(cells)  # the row's launch line states what its columns may leave blank
        overridden = {setting_name(k) for k in [*(overrides or {}), *launched]}
        for key in list(CONFIG_COLUMNS) + [k for k in cells if k in known and k not in CONFIG_COLUMNS]:
            if key not in cells or (key in MLA_COLUMNS and not mla):
                if key == "micro_batch_size" and setting_name(key) not in overridden:  # a file without the column
                    assumed.append(setting_name(key))
                continue
            value, note = read_cell(key, cells[key])
            if note and setting_name(key) not in overridden:  # what --set or the launch line states was not assumed
                notes.append(note)
                if value is None:
                    assumed.append(setting_name(key))
            if value is not None:
                mapping[key] = value
        if mla:
            mapping["multi_latent_attention"] = True
        if str(mapping.get("moe_shared_expert_intermediate_size", "")) in ("0", "0.0"):
            mapping.pop("moe_shared_expert_intermediate_size")
        from_notes, read = note_settings(cells, {setting_name(k) for k in mapping})
        mapping.update(from_notes)
        notes.extend(read)
        mapping.update(launched)
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
        said = not_a_transformer(cells.get("notes", ""))
        if said and (config.hybrid is None or not config.hybrid.is_hybrid):
            raise ConfigError(f"the row's notes say its model is not a transformer ({said!r}) and the row gives no "
                              "layer pattern (a hybrid_override_pattern / hybrid_layer_pattern column, or an `arch:` "
                              "model provider tracekit knows): priced as a transformer it would be wrong")
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
        return BatchRow(line, cells, config, where, None, chosen, notes, tuple(assumed))
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
