"""Ray, the optional extra that runs tracekit's work as tasks (`search --executor ray`, `ingest --executor ray`).

    ray_module() -> the `ray` module, or ConfigError(INSTALL_HINT) when the extra is not installed
    connect(address=None, **init_options) -> ray, initialized: a local Ray started on demand, or the cluster at
        `address` (`auto`, `ray://head:10001`); a Ray already initialized in this process is used as it is

Only imported where Ray is asked for: nothing else in tracekit needs it.
"""
from __future__ import annotations

import logging

from tracekit.core.errors import ConfigError

INSTALL_HINT = "--executor ray needs Ray: pip install 'tracekit[ray]'"


def ray_module():
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(INSTALL_HINT) from exc
    return ray


def connect(address: str | None = None, **init_options):
    ray = ray_module()
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                 **init_options)
    return ray
