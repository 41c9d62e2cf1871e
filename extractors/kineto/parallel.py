"""Worker processes for an ingest of several trace files: each file is parsed (`trace.read_trace`) in a worker, and
each parsed trace's samples are written to the store (`SampleStore.add`, safe from many processes at once) in a
worker, while this process matches the collectives of a run's ranks (which needs all of them) and builds the
reports. Results come back in the order of the files, so the outcome is the one-process outcome.

The workers are forked from this process when that is safe — it runs no other thread (a fork copies a thread's
held locks, never the thread) and the platform forks — so they start in milliseconds with everything already
imported: a folder of small traces gains as much as one large trace. Otherwise they are spawned (each imports
pandas: ~0.5 s), and only for files large enough together to pay that (`spawn_min_bytes`).
"""
from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
import threading
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Below this many bytes of trace files together, spawned workers (each importing pandas) cost more than they save.
SPAWN_MIN_BYTES = 32 << 20
#: What the workers run, imported before they are forked so that none of them imports it again.
PRELOAD = ("pandas", "pyarrow.parquet", "tracekit.core.store")


def start_method() -> str:
    """"fork" where this process may fork (POSIX, no thread but this one), else "spawn"."""
    forkable = "fork" in multiprocessing.get_all_start_methods() and sys.platform != "darwin"
    return "fork" if forkable and threading.active_count() == 1 else "spawn"


@contextmanager
def worker_pool(jobs: int, files: list[Path], spawn_min_bytes: int = SPAWN_MIN_BYTES) -> Iterator[Executor | None]:
    """A pool of `jobs` worker processes for these files, or None (work in this process): one file, one job, or
    spawned workers for files smaller together than `spawn_min_bytes`."""
    workers = min(jobs, len(files))
    method = start_method()
    if workers < 2 or (method == "spawn" and sum(_size(f) for f in files) < spawn_min_bytes):
        yield None
        return
    if method == "fork":
        for module in PRELOAD:
            importlib.import_module(module)
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method)) as pool:
        yield pool


def ordered_map(fn: Callable[[T], R], items: Iterable[T], pool: Executor | None) -> Iterator[R]:
    """`fn` over the items, in their order: in the pool's workers (all submitted at once) or in this process."""
    if pool is None:
        return map(fn, items)
    return pool.map(fn, items)


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
