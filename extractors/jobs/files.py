"""Job files of PyTorch-native trainers, told apart from Megatron configurations: a torchtitan TOML job
(`extractors.jobs.torchtitan`) or a Composer/llm-foundry training YAML (`extractors.jobs.composer`). A YAML or
JSON mapping of Megatron argument names is neither (`read_job` gives None: `extractors.jobs.megatron.config_from_file`
reads it)."""
from __future__ import annotations

from pathlib import Path

from extractors.jobs.composer import is_composer, read_composer
from extractors.jobs.torchtitan import Job, read_torchtitan
from tracekit.core.yaml_file import read_yaml


def read_job(path: str | Path, world_size: int | None = None, gpus_per_node: int | None = None) -> Job | None:
    """The job a torchtitan TOML or a Composer YAML describes (settings, its stack profile's name, notes), or None
    for any other file. `world_size`: the launch's GPUs; `gpus_per_node`: where a shard-inside-a-node split puts
    its groups."""
    path = Path(path)
    if path.suffix.lower() == ".toml":
        return read_torchtitan(path, world_size)
    if path.suffix.lower() not in (".yaml", ".yml"):
        return None
    data = read_yaml(path)
    if not is_composer(data):
        return None
    return read_composer(path, world_size, gpus_per_node, data)
