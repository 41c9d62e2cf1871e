"""Shared types and services every part of tracekit uses: errors, hardware ids, sample schema, store, configs."""
from .cluster import PRESETS, Cluster, infer_cluster, load_cluster, preset
from .config import TrainingConfig
from .errors import ConfigError, InputError, ModelError, StoreError, TracekitError
from .hardware import HardwareSpec, cpu_hardware_id, hardware_spec, normalize_hardware
from .samples import COLUMNS, FEATURE_COLUMNS, PASSES, PRIMITIVES, SCHEMA
from .store import SampleStore, default_store

__all__ = [
    "COLUMNS", "FEATURE_COLUMNS", "PASSES", "PRESETS", "PRIMITIVES", "SCHEMA", "Cluster", "ConfigError", "HardwareSpec",
    "InputError", "ModelError", "SampleStore", "StoreError", "TracekitError", "TrainingConfig", "cpu_hardware_id",
    "default_store", "hardware_spec", "infer_cluster", "load_cluster", "normalize_hardware", "preset",
]
