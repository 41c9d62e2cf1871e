"""Whether a prediction and a real run can be the same job: world size and the sizes of the parallel groups.

The real run's process groups come from its traces (collectives' group descriptions and sizes, `distributedInfo`);
the prediction's from its configuration (a TrainingConfig dict). Each check raises ConfigError naming what differs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tracekit.core.errors import ConfigError

if TYPE_CHECKING:
    from .sides import Side

#: Process-group descriptions (Megatron's names) → the configuration's degree they must equal.
GROUP_DEGREES = {
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "DATA_PARALLEL_GROUP": "dp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "CONTEXT_PARALLEL_GROUP": "cp",
}
#: The configuration's degree → its TrainingConfig key.
CONFIG_KEYS = {"tp": "tensor_model_parallel_size", "dp": "data_parallel_size", "pp": "pipeline_model_parallel_size",
               "cp": "context_parallel_size"}


def check_same_configuration(predicted: Side, real: Side, config: dict[str, Any] | None = None) -> None:
    """Raise ConfigError when the two sides cannot be the same job (world size, parallel group sizes)."""
    if predicted.world_size and real.world_size and int(predicted.world_size) != int(real.world_size):
        raise ConfigError(
            f"configurations differ: the prediction is for {predicted.world_size} ranks, the real run has "
            f"{real.world_size}"
        )
    differ = [
        f"the prediction has {GROUP_DEGREES[desc].upper()}={size}, the real run's {desc} has {real.groups[desc]} "
        f"rank{'s' if real.groups[desc] != 1 else ''}"
        for desc, size in sorted(predicted.groups.items(), key=lambda kv: list(GROUP_DEGREES).index(kv[0])
                                 if kv[0] in GROUP_DEGREES else 99)
        if desc in GROUP_DEGREES and desc in real.groups and real.groups[desc] != size
    ]
    if differ:
        raise ConfigError("configurations differ: " + "; ".join(differ))
    if config and not real.groups:
        allowed = _allowed_group_sizes(config)
        odd = sorted(s for s in real.group_sizes if s not in allowed)
        if odd:
            raise ConfigError(
                f"configurations differ: the real run communicates in groups of {odd} ranks, which the predicted "
                f"configuration (tp={config.get('tensor_model_parallel_size')}, "
                f"pp={config.get('pipeline_model_parallel_size')}, dp={config.get('data_parallel_size')}) has not"
            )


def check_same_split(predicted: dict[str, Any], run: dict[str, Any]) -> None:
    """Raise ConfigError when a prediction's configuration splits the job differently from the run's (both
    TrainingConfig dicts)."""
    names = (("TP", "tensor_model_parallel_size"), ("PP", "pipeline_model_parallel_size"),
             ("CP", "context_parallel_size"), ("DP", "data_parallel_size"), ("world size", "world_size"))
    differ = [(label, predicted.get(key), run.get(key)) for label, key in names
              if predicted.get(key) is not None and run.get(key) is not None
              and int(predicted[key]) != int(run[key])]
    if differ:
        ours = ", ".join(f"{label}={a}" for label, a, _ in differ)
        theirs = ", ".join(f"{label}={b}" for label, _, b in differ)
        raise ConfigError(f"configurations differ: the prediction has {ours}, the real run {theirs}")


def _allowed_group_sizes(config: dict[str, Any]) -> set[int]:
    tp = int(config.get("tensor_model_parallel_size") or 1)
    pp = int(config.get("pipeline_model_parallel_size") or 1)
    cp = int(config.get("context_parallel_size") or 1)
    dp = int(config.get("data_parallel_size") or 1)
    sizes = {1, tp, cp, dp, tp * cp, dp * cp, tp * cp * dp * pp}
    if pp > 1:
        sizes |= {2, pp}
    return sizes
