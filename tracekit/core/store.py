"""The sample store: Parquet files partitioned by hardware and primitive, one file per commit and partition (a commit
adds one source, or several at once: `add_many`, how ingest writes a folder of traces).

Appends are atomic and idempotent, also from many processes at once: a source (identified by its content hash) is
added at most once. A commit's Parquet files are written under temporary names of this process, then — holding the
store's lock (`filelock`, a file beside `sources.json`) — the source list is read again, the files renamed into
place and the source recorded in `sources.json` in one step; a source another process recorded meanwhile is not
written twice (the commit's other sources are written again without it). Readers see only recorded sources, so an
add interrupted at any point (even killed) leaves the store readable and as it was.

Adding does not use `pyarrow.compute` (importing it takes ~70 ms, a sixth of `tracekit ingest`'s start-up): the
partitions are read from the columns' buffers (`arrow_arrays.string_codes`) and each is written as the slices of
its rows, in order; a table whose rows come grouped by partition (ingest's do) is one slice per source and partition.
Removing and reading import it.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from filelock import FileLock

from tracekit.core.arrow_arrays import holds_only, string_codes
from tracekit.core.atomic import atomic_write_json
from tracekit.core.errors import StoreError
from tracekit.core.samples import SCHEMA, to_table

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def default_store() -> Path:
    """`$TRACEKIT_HOME`, else `./.tracekit`."""
    return Path(os.environ.get("TRACEKIT_HOME") or ".tracekit")


def _part(value: str) -> str:
    return _SAFE.sub("_", value) or "_"


class SampleStore:
    """Operator samples on disk. `add` one source at a time; `read` a filtered frame."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_store()
        self._manifest_path = self.root / "sources.json"

    def _lock(self) -> FileLock:
        """The store-wide lock around every change of the source list (and the files it records)."""
        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / ".lock"))

    # -- sources ----------------------------------------------------------------------------------------------
    def sources(self) -> dict[str, dict]:
        """Recorded sources: source id → metadata (path, kind, rows, ...)."""
        if not self._manifest_path.exists():
            return {}
        try:
            return json.loads(self._manifest_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise StoreError(f"{self._manifest_path}: unreadable store manifest ({exc})") from exc

    def has_source(self, source_id: str) -> bool:
        return source_id in self.sources()

    def add(self, source_id: str, rows, meta: dict | None = None) -> int:
        """Add the samples of one source; returns rows written (0 when the source is already in the store)."""
        return self.add_many([(source_id, rows, meta)])[0]

    def add_many(self, batch: Iterable[tuple[str, Any, dict | None]]) -> list[int]:
        """Add the samples of several sources, (source id, rows, metadata) each, in one commit: one Parquet file per
        partition for all of them (named for the source when there is one, else `batch-<token>`, recorded as each
        source's `file`), one take of the lock, one write of the source list. Returns the rows written per item:
        0 for a source already in the store, or earlier in the batch. All or nothing, like `add`."""
        known = self.sources()
        items = list(batch)
        tables: dict[str, tuple[pa.Table, dict | None]] = {}
        for source_id, rows, meta in items:
            if source_id not in known and source_id not in tables:
                tables[source_id] = (_source_table(source_id, rows), meta)
        if not tables:
            return [0] * len(items)
        firsts = {source_id: index for index, (source_id, _, _) in reversed(list(enumerate(items)))}
        token = uuid.uuid4().hex[:12]  # temporary names of this add alone: concurrent adds never share one
        name = next(iter(tables)) if len(tables) == 1 else f"batch-{token}"
        staged: list[tuple[Path, Path]] = []
        try:
            staged = self._stage(name, token, [table for table, _ in tables.values()])
            with self._lock():
                known = self.sources()
                raced = [source_id for source_id in tables if source_id in known]
                if raced:  # another process recorded some of them while this one was writing: restage the others
                    _unlink(staged)
                    tables = {k: v for k, v in tables.items() if k not in known}
                    staged = self._stage(name, token, [table for table, _ in tables.values()])
                if not tables:
                    return [0] * len(items)
                for tmp, final in staged:
                    os.replace(tmp, final)
                for source_id, (table, meta) in tables.items():
                    known[source_id] = {**(meta or {}), "rows": table.num_rows,
                                        **({"file": name} if name != source_id else {})}
                atomic_write_json(self._manifest_path, known)
        except BaseException:
            _unlink(staged)
            raise
        return [tables[source_id][0].num_rows if source_id in tables and firsts[source_id] == index else 0
                for index, (source_id, _, _) in enumerate(items)]

    def _stage(self, name: str, token: str, tables: list[pa.Table]) -> list[tuple[Path, Path]]:
        """Write the rows of `tables` under temporary names, one file per partition folder (hardware and primitive
        as `_part` spells them), rows in their order: [(temporary path, final path)]."""
        if not tables:
            return []
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        codes, folders = _partition_codes(table)
        heads = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]]) if len(codes) else np.zeros(0, dtype=np.int64)
        runs: dict[int, list[pa.Table]] = {}  # partition → the slices of its rows (runs of neighbours), in order
        for start, stop in zip(heads.tolist(), heads[1:].tolist() + [len(codes)]):
            runs.setdefault(int(codes[start]), []).append(table.slice(start, stop - start))
        staged: list[tuple[Path, Path]] = []
        try:
            for code in sorted(runs):
                hardware, primitive = folders[code]
                folder = self.root / "samples" / f"hardware={hardware}" / f"primitive={primitive}"
                folder.mkdir(parents=True, exist_ok=True)
                tmp = folder / f".{name}.{token}.parquet.tmp"
                staged.append((tmp, folder / f"{name}.parquet"))
                part = runs[code]
                pq.write_table(pa.concat_tables(part), tmp)  # chunks, not combined: that copy costs more
        except BaseException:
            _unlink(staged)
            raise
        return staged

    def remove(self, source_id: str) -> None:
        """Forget a source and delete its rows (its files; in a batch's files shared with other sources, its rows)."""
        import pyarrow.compute as pc

        with self._lock():
            sources = self.sources()
            if source_id not in sources:
                return
            name = sources.pop(source_id).get("file", source_id)
            atomic_write_json(self._manifest_path, sources)
            shared = any(meta.get("file") == name for meta in sources.values())
            for path in (self.root / "samples").glob(f"*/*/{name}.parquet"):
                if not shared:
                    path.unlink(missing_ok=True)
                    continue
                table = pq.read_table(path, schema=SCHEMA)
                tmp = path.with_name(f".{name}.{uuid.uuid4().hex[:12]}.parquet.tmp")
                pq.write_table(table.filter(pc.not_equal(table.column("source"), source_id)), tmp)
                os.replace(tmp, path)

    # -- reading ----------------------------------------------------------------------------------------------
    def read(self, hardware: str | list[str] | None = None, primitive: str | list[str] | None = None):
        """All recorded samples (optionally of some hardware ids / primitives) as a pandas DataFrame. Rows an older
        tracekit stored under a device name's own words read under today's id for it (`H200` as `H200-141GB`:
        `tracekit.core.hardware.DEVICE_IDS`), and are found by either."""
        import pyarrow.compute as pc

        from .hardware import DEVICE_IDS

        known = self.sources()
        files = set(known) | {meta["file"] for meta in known.values() if "file" in meta}
        hardware_set = {_part(h) for h in ([hardware] if isinstance(hardware, str) else hardware or [])}
        primitive_set = {_part(p) for p in ([primitive] if isinstance(primitive, str) else primitive or [])}
        tables = []
        batched: set = set()  # partitions holding a batch's file: their rows are put in source order, as files are
        base = self.root / "samples"
        for path in sorted(base.glob("hardware=*/primitive=*/*.parquet")) if base.exists() else []:
            hw = path.parent.parent.name.split("=", 1)[1]
            prim = path.parent.name.split("=", 1)[1]
            if path.stem not in files or (hardware_set and not {hw, DEVICE_IDS.get(hw)} & hardware_set):
                continue
            if primitive_set and prim not in primitive_set:
                continue
            try:
                table = pq.read_table(path, schema=SCHEMA)
            except (OSError, pa.ArrowInvalid) as exc:
                raise StoreError(f"{path}: unreadable sample file ({exc})") from exc
            if path.stem not in known:  # a batch's file: only its recorded sources (a remove may have stopped midway)
                table = table.filter(pc.is_in(table.column("source"), pa.array(sorted(known))))
                batched.add(path.parent)
            tables.append((path.parent, table))
        if not tables:
            return SCHEMA.empty_table().to_pandas()
        parts = []
        for folder, group in itertools.groupby(tables, key=lambda item: item[0]):
            part = pa.concat_tables([table for _, table in group])
            if folder in batched:  # the order of one file per source (sorted by name): by source, stable
                part = part.take(pc.sort_indices(part, [("source", "ascending")]))
            parts.append(part)
        frame = pa.concat_tables(parts).to_pandas()
        renamed = {hw: DEVICE_IDS[hw] for hw in frame["hardware"].unique() if hw in DEVICE_IDS}
        if renamed:
            frame["hardware"] = frame["hardware"].replace(renamed)
        return frame

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _source_table(source_id: str, rows) -> pa.Table:
    """The rows of one source as a table of the sample schema; every row must carry its source id."""
    table = to_table(rows)
    if table.num_rows and not holds_only(table.column("source").combine_chunks(), source_id):
        raise StoreError(f"samples of source {source_id} carry another source id")
    return table


def _unlink(staged: list[tuple[Path, Path]]) -> None:
    for tmp, _ in staged:
        tmp.unlink(missing_ok=True)


def _partition_codes(table: pa.Table) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """Each row's partition as a code, and the partitions ((hardware, primitive) folder names, sorted) they index."""
    try:
        hardware, hw_values = string_codes(table.column("hardware").combine_chunks())
        primitive, prim_values = string_codes(table.column("primitive").combine_chunks())
    except ValueError as exc:
        raise StoreError(f"samples without hardware or primitive: {exc}") from exc
    hw_names = [_part(v) for v in hw_values]
    prim_names = [_part(v) for v in prim_values]
    folders = sorted({(h, p) for h in hw_names for p in prim_names})
    index = {folder: i for i, folder in enumerate(folders)}
    grid = np.array([[index[(h, p)] for p in prim_names] for h in hw_names], dtype=np.int64).reshape(
        len(hw_names), len(prim_names))
    return grid[hardware, primitive], folders
