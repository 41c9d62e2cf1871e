"""Processes for an ingest of several trace files: each file is parsed (`trace.read_trace`, with its report and, when
no other trace can be matched with it, its samples) by this process or one of `jobs` - 1 workers, while this
process then matches the collectives of a run's ranks (which needs all of them) and commits the samples. Results
come back in the order of the files, so the outcome is the one-process outcome.

This process parses too: while the next result is not ready it takes the last file no worker has started, so with
`--jobs 2` one worker is forked and both processes parse, and the files it parses are neither sent nor returned.

The workers are forked from this process when that is safe — it runs no other thread (a fork copies a thread's
held locks, never the thread) and the platform forks — so they start in milliseconds with everything already
imported (and the collector's generations frozen, so that a worker neither walks nor copies what it inherited): a
folder of small traces gains as much as one large trace. Otherwise they are spawned (each imports the parser, numpy
and pyarrow: ~0.3 s), and only for files large enough together to pay that (`spawn_min_bytes`).
"""
from __future__ import annotations

import gc
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

#: Below this many bytes of trace files together, spawned workers (each importing the parser) cost more than they save.
SPAWN_MIN_BYTES = 32 << 20


def start_method() -> str:
    """"fork" where this process may fork (POSIX, no thread but this one), else "spawn"."""
    forkable = "fork" in multiprocessing.get_all_start_methods() and sys.platform != "darwin"
    return "fork" if forkable and threading.active_count() == 1 else "spawn"


@contextmanager
def worker_pool(jobs: int, files: list[Path], spawn_min_bytes: int = SPAWN_MIN_BYTES) -> Iterator[Executor | None]:
    """A pool of `jobs` - 1 worker processes for these files (this process is the other one, see `ordered_map`), or
    None (all work in this process): one file, one job, or spawned workers for files smaller together than
    `spawn_min_bytes`."""
    workers = min(jobs, len(files)) - 1
    method = start_method()
    if workers < 1 or (method == "spawn" and sum(_size(f) for f in files) < spawn_min_bytes):
        yield None
        return
    if method == "fork":
        # the objects this process holds go to the collector's permanent generation: a forked worker's collections
        # then never walk them, so it neither spends the time nor copies the pages they sit on
        gc.freeze()
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method)) as pool:
            yield pool
    finally:
        if method == "fork":
            gc.unfreeze()


def ordered_map(fn: Callable[[T], R], items: Iterable[T], pool: Executor | None) -> Iterator[R]:
    """`fn` over the items, in their order: in this process alone, or shared with the pool's workers: all items are
    submitted at once, and while the next result is not ready this process takes the last item no worker has
    started (it cancels that submission and runs it itself), so it works instead of waiting, and what it runs
    is neither sent nor handed back."""
    if pool is None:
        return map(fn, items)
    return _shared_map(fn, list(items), pool)


def _shared_map(fn: Callable[[T], R], items: list[T], pool: Executor) -> Iterator[R]:
    futures = [pool.submit(fn, item) for item in items]
    own: dict[int, R] = {}  # results this process computed, by index
    tail = len(items) - 1  # the last item this process may still take
    for index, future in enumerate(futures):
        while index not in own and not future.done() and tail > index:
            if futures[tail].cancel():
                own[tail] = fn(items[tail])
            tail -= 1
        yield own.pop(index) if index in own else future.result()


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
