"""How torchtitan runs a job, for the rows of a published table that name it (`extractors.jobs.rows`) and its own job
files (`extractors.jobs.torchtitan`): its FSDP is FSDP2, tensor parallelism comes with sequence parallelism, units
keep their parameters across micro-batches when pipelined, and its pipeline splits the layers its own way."""
from __future__ import annotations

import dataclasses
from typing import Any

from tracekit.core.errors import ConfigError
from tracekit.core.pipeline_layout import LayoutSettings


def split_layers(layers: int, stages: int) -> list[int]:
    """Transformer layers per pipeline stage as torchtitan splits them: the embedding and the output layer count as
    one layer each, the units are spread as evenly as they go (the first stages take the remainder), and the first
    and last stage give a layer's place to the embedding and the output."""
    units = layers + 2
    if stages > units:
        raise ConfigError(f"{stages} pipeline stages for {layers} layers (+ embedding and output): too many stages")
    base, extra = divmod(units, stages)
    sizes = [base + (1 if s < extra else 0) for s in range(stages)]
    sizes[0] -= 1
    sizes[-1] -= 1
    if min(sizes) < 0 or (stages > 1 and min(sizes[1:-1] or [1]) < 1):
        raise ConfigError(f"{stages} pipeline stages for {layers} layers leave a stage without layers")
    return sizes


def as_torchtitan_runs(config: Any, notes: list[str]) -> Any:
    """A published row's configuration of a torchtitan run (not yet validated), as torchtitan runs it: its FSDP is
    FSDP2; tensor parallelism comes with sequence parallelism; with pipelining, units keep their parameters across
    the micro-batches; a pipeline without a stated layout splits its layers torchtitan's way (`split_layers`)."""
    changes: dict[str, Any] = {}
    sharding = config.sharding
    if sharding is not None and sharding.sharded_data_parallel == "torch-fsdp1":
        sharding = dataclasses.replace(sharding, sharded_data_parallel="torch-fsdp2")
    if sharding is not None and sharding.sharded_data_parallel == "torch-fsdp2" and config.pp > 1:
        sharding = dataclasses.replace(sharding, torch_fsdp2_reshard_after_forward=False)
    if sharding is not config.sharding:
        changes["sharding"] = sharding
    if config.tp > 1 and not config.sequence_parallel:
        changes["sequence_parallel"] = True
    layout = config.layout or LayoutSettings()
    stated = layout.pipeline_model_parallel_layout or layout.decoder_first_pipeline_num_layers is not None or \
        layout.decoder_last_pipeline_num_layers is not None
    if config.pp > 1 and not stated:
        sizes = split_layers(config.num_layers, config.pp * config.vp)
        text = "|".join(("E" if s == 0 else "") + (f"t*{n}" if n else "") + ("L" if s == len(sizes) - 1 else "")
                        for s, n in enumerate(sizes))
        changes["layout"] = dataclasses.replace(layout, pipeline_model_parallel_layout=text)
        notes.append(f"torchtitan's pipeline split: {text!r} (the embedding and the output count as a layer each)")
    return dataclasses.replace(config, **changes) if changes else config
