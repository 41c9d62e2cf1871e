"""Shared types and services every part of tracekit uses: errors, hardware ids, sample schema, store, configs.

The names below are imported from their modules when first used (PEP 562), so that importing one light module of
this package (`tracekit.core.errors`, as every command does) does not import pyarrow, YAML and the datasheet table.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracekit.core.cluster import PRESETS, Cluster, infer_cluster, load_cluster, preset
    from tracekit.core.config import TrainingConfig
    from tracekit.core.errors import ConfigError, InputError, ModelError, StoreError, TracekitError
    from tracekit.core.hardware import HardwareSpec, cpu_hardware_id, hardware_spec, normalize_hardware
    from tracekit.core.samples import COLUMNS, FEATURE_COLUMNS, PASSES, PRIMITIVES, SCHEMA
    from tracekit.core.store import SampleStore, default_store

_MODULE_OF = {
    **dict.fromkeys(("PRESETS", "Cluster", "infer_cluster", "load_cluster", "preset"), "cluster"),
    "TrainingConfig": "config",
    **dict.fromkeys(("ConfigError", "InputError", "ModelError", "StoreError", "TracekitError"), "errors"),
    **dict.fromkeys(("HardwareSpec", "cpu_hardware_id", "hardware_spec", "normalize_hardware"), "hardware"),
    **dict.fromkeys(("COLUMNS", "FEATURE_COLUMNS", "PASSES", "PRIMITIVES", "SCHEMA"), "samples"),
    **dict.fromkeys(("SampleStore", "default_store"), "store"),
}

__all__ = [
    "COLUMNS", "FEATURE_COLUMNS", "PASSES", "PRESETS", "PRIMITIVES", "SCHEMA", "Cluster", "ConfigError", "HardwareSpec",
    "InputError", "ModelError", "SampleStore", "StoreError", "TracekitError", "TrainingConfig", "cpu_hardware_id",
    "default_store", "hardware_spec", "infer_cluster", "load_cluster", "normalize_hardware", "preset",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
