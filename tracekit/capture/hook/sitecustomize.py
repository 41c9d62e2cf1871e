"""tracekit's profiling hook for any PyTorch training script (not only Megatron).

`tracekit capture` puts this directory first on PYTHONPATH, so every Python process of the launch command loads it
at start-up. When `TRACEKIT_HOOK_DIR` is set it registers a global optimizer-step hook as soon as torch.optim is
imported; around optimizer steps START..END-1 (`TRACEKIT_HOOK_STEPS=START-END`, START ≥ 2) it runs torch.profiler
(CPU + CUDA activities, shapes on, ProfilerStep markers) and writes one trace per rank to
`$TRACEKIT_HOOK_DIR/rank-{RANK}.pt.trace.json`. `TRACEKIT_HOOK_RANKS` (`all` or `0,1,...`) limits the ranks.
Processes that never step an optimizer (e.g. the torchrun launcher) write nothing. Any other sitecustomize on the
path is still loaded afterwards.
"""
from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported when the first profiled step begins
    from torch.profiler import profile

_DIR = os.path.dirname(os.path.abspath(__file__))
_WATCHED = "torch.optim.optimizer"


def _warn(message: str) -> None:
    sys.stderr.write(f"tracekit hook: {message}\n")


class _StepProfiler:
    """Counts optimizer steps and drives torch.profiler over the requested ones."""

    def __init__(self, out_dir: str, start: int, end: int, rank: int):
        self.out_dir, self.start, self.end, self.rank = out_dir, start, end, rank
        self.steps = 0
        self.prof: profile | None = None
        self.done = False

    def after_step(self, *_args) -> None:
        self.steps += 1
        if self.done:
            return
        try:
            if self.prof is None:
                # as Megatron: one warm-up step (none when START is 2), then steps START..END-1 recorded
                if self.steps == max(self.start - 2, 1):
                    self._begin(warmup=1 if self.start > 2 else 0)
                return
            self.prof.step()
        except Exception as exc:  # noqa: BLE001 - profiling must never break the user's training
            _warn(f"profiling stopped ({exc})")
            self.done = True

    def _begin(self, warmup: int) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        prof = self.prof = profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=warmup, active=self.end - self.start, repeat=1),
            on_trace_ready=self._save,
            record_shapes=True,
        )
        if not torch.cuda.is_available():  # tracekit's convention: CPU traces name their CPU (torch does not)
            try:
                from tracekit.core.hardware import cpu_hardware_id
            except ImportError:  # tracekit is not installed in the job's environment: ingest says cpu-unknown
                pass
            else:
                prof.preset_metadata_json("cpu_model", json.dumps(cpu_hardware_id().removeprefix("cpu-")))
        prof.start()

    def _save(self, prof) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        path = os.path.join(self.out_dir, f"rank-{self.rank}.pt.trace.json")
        prof.export_chrome_trace(path + ".tmp")
        os.replace(path + ".tmp", path)
        self.done = True

    def finish(self) -> None:
        """At exit: a run that stopped inside the window still saves what it recorded."""
        if self.prof is not None and not self.done:
            try:
                self.prof.stop()
            except Exception as exc:  # noqa: BLE001 - never break the user's process at exit
                _warn(f"could not save the partial trace ({exc})")


def _config() -> tuple[str, int, int, int] | None:
    out_dir = os.environ.get("TRACEKIT_HOOK_DIR")
    if not out_dir:
        return None
    rank = int(os.environ.get("RANK", "0"))
    ranks = os.environ.get("TRACEKIT_HOOK_RANKS", "all").strip().lower()
    if ranks != "all" and rank not in {int(r) for r in ranks.split(",") if r.strip()}:
        return None
    start_text, _, end_text = os.environ.get("TRACEKIT_HOOK_STEPS", "10-13").partition("-")
    start, end = int(start_text), int(end_text)
    if start < 2 or end <= start:
        _warn(f"TRACEKIT_HOOK_STEPS={start}-{end} needs 2 ≤ START < END; not profiling")
        return None
    return out_dir, start, end, rank


def _install(module) -> None:
    settings = _config()
    if settings is None:
        return
    profiler = _StepProfiler(*settings)
    module.register_optimizer_step_post_hook(profiler.after_step)
    atexit.register(profiler.finish)


class _OptimizerWatcher(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Lets torch.optim.optimizer import normally, then installs the step hook on it."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _WATCHED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        self._inner = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        try:
            _install(module)
        except Exception as exc:  # noqa: BLE001 - the user's training must run even if the hook cannot
            _warn(f"not profiling ({exc})")


def _chain_next_sitecustomize() -> None:
    """Load the sitecustomize this one shadows, if any."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _DIR]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("TRACEKIT_HOOK_DIR"):
    sys.meta_path.insert(0, _OptimizerWatcher())
_chain_next_sitecustomize()
