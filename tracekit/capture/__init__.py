"""Capture: profile a user's unchanged launch command (Megatron's own profiling flags, or an import hook for any
PyTorch script), save the traces with a manifest (configuration, topology, versions, iteration times), then ingest.

`capture(out_dir, argv, steps="10-13") -> Manifest` is the library entry point; `Manifest.load(dir)` reads one back.
"""
from .manifest import Manifest
from .run import capture

__all__ = ["Manifest", "capture"]
