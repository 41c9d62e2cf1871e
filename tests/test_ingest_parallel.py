"""Parsing several traces at once (extractors/kineto/parallel.py): this process and jobs - 1 forked workers share
the files, results in file order."""
from __future__ import annotations

import os

from extractors.kineto import read_trace
from extractors.kineto.parallel import ordered_map, start_method, worker_pool
from tests.conftest import TRACES

RANKS = sorted((TRACES / "kineto" / "dlrm_8rank").glob("*.json.gz"))


def _rank_and_process(path) -> tuple[int | None, int]:
    return read_trace(path).rank, os.getpid()


def test_this_process_and_the_workers_share_the_files_in_order():
    """With --jobs 2 one worker is started (forked where this process runs no other thread, spawned otherwise) and
    this process parses too (it takes the last files no worker has started while it waits): the ranks come back in
    file order, parsed by both processes."""
    assert start_method() in ("fork", "spawn")
    expected = [read_trace(path).rank for path in RANKS]
    assert sorted(expected) == list(range(8))
    with worker_pool(2, RANKS, spawn_min_bytes=0) as pool:
        assert pool is not None and pool._max_workers == 1  # type: ignore[attr-defined]
        results = list(ordered_map(_rank_and_process, RANKS, pool))
    assert [rank for rank, _ in results] == expected
    processes = {pid for _, pid in results}
    assert os.getpid() in processes and len(processes) == 2


def test_one_job_or_one_file_runs_here():
    with worker_pool(1, RANKS) as pool:
        assert pool is None
    with worker_pool(4, RANKS[:1]) as pool:
        assert pool is None
    assert [rank for rank, _ in ordered_map(_rank_and_process, RANKS[:2], None)] == \
        [read_trace(path).rank for path in RANKS[:2]]
