"""Search work as Ray tasks: the candidate configurations in shards, one `predictor.sweeps.search.evaluate` per shard.

Ray is an optional extra (`pip install 'tracekit[ray]'`). `RayExecutor(address=None)` starts a local Ray on demand
(or joins the cluster at `address`, e.g. `ray://head:10001` or `auto`; `tracekit.core.ray_runtime.connect`). The
model set travels once: its files (XGBoost UBJ and JSON, never pickles) go into Ray's object store, and each worker
process writes them to a folder of its own and loads them once (`ModelSet.load` caches by path). The shards' rows
merge into the same ranking the local executor gives (`predictor.sweeps.search.search` sorts them).
"""
from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

from tracekit.core.ray_runtime import connect, ray_module

#: Candidates per task: big enough that a task's one batched model call amortizes, small enough to spread.
SHARD = 256


def model_files(path: Path) -> dict[str, bytes]:
    """The model directory's files (index, per-model JSON and UBJ boosters) by name."""
    return {p.name: p.read_bytes() for p in sorted(Path(path).iterdir()) if p.is_file()}


_LOADED: dict[str, Any] = {}  # per worker process: content hash → ModelSet


def _models_in_worker(files: dict[str, bytes]):
    from predictor.costs.learned.models import ModelSet

    digest = hashlib.sha256(b"".join(k.encode() + v for k, v in sorted(files.items()))).hexdigest()[:16]
    if digest not in _LOADED:
        folder = Path(tempfile.mkdtemp(prefix=f"tracekit-models-{digest}-"))
        for name, data in files.items():
            (folder / name).write_bytes(data)
        _LOADED[digest] = ModelSet.load(folder)
    return _LOADED[digest]


def _evaluate_shard(files, configs, cluster, calibration, gpus, price):
    from predictor.sweeps.search import evaluate

    return evaluate(configs, cluster, _models_in_worker(files), calibration, gpus, price)


class RayExecutor:
    """Runs `evaluate` over shards of the candidates as Ray tasks and merges their rows."""

    def __init__(self, address: str | None = None, shard: int = SHARD, init_options: dict | None = None):
        ray_module()  # without Ray, say how to install it before any work is done
        self.address = address
        self.shard = shard
        self.init_options = init_options or {}

    def run(self, configs, cluster, models, calibration=None, gpus: int = 1, price: float | None = None,
            progress=None):
        """What `predictor.sweeps.search.evaluate` returns for all of `configs`; `progress(n)` hears of each shard
        done."""
        ray = connect(self.address, **self.init_options)
        task = ray.remote(_evaluate_shard)
        files = ray.put(model_files(models.path))
        from predictor.sweeps.search import shape

        configs = sorted(configs, key=shape)  # a shard's candidates share pipeline shapes: simulated together
        shards = [configs[i:i + self.shard] for i in range(0, len(configs), self.shard)]
        pending = {task.remote(files, shard, cluster, calibration, gpus, price): len(shard) for shard in shards}
        order = list(pending)
        done: dict = {}
        while len(done) < len(order):
            ready, _ = ray.wait([ref for ref in order if ref not in done], num_returns=1)
            for ref in ready:
                done[ref] = ray.get(ref)
                if progress:
                    progress(pending[ref])
        rows: list[dict[str, Any]] = []
        pruned = {"memory": 0, "failed": 0, "implausible": 0}
        problems: dict[str, str] = {}
        for ref in order:  # the shards' order, whatever order they finished in
            shard_rows, shard_pruned, shard_problems = done[ref]
            rows.extend(shard_rows)
            for key, value in shard_pruned.items():
                pruned[key] += value
            for key, message in shard_problems.items():
                problems.setdefault(key, message)
        return rows, pruned, problems
