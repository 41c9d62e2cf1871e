"""The sample store: Parquet files partitioned by hardware and primitive, one file per source and partition.

Appends are atomic and idempotent, also from many processes at once: a source (identified by its content hash) is
added at most once. Its Parquet files are written under temporary names of this process, then — holding the
store's lock (`filelock`, a file beside `sources.json`) — the source list is read again, the files renamed into
place and the source recorded in `sources.json` in one step; a source another process recorded meanwhile is not
written twice. Readers see only recorded sources, so an add interrupted at any point (even killed) leaves the store
readable and as it was.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from filelock import FileLock

from .atomic import atomic_write_json
from .errors import StoreError
from .samples import SCHEMA, to_table

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
        sources = self.sources()
        if source_id in sources:
            return 0
        table = to_table(rows)
        bad = table.column("source").to_pylist()
        if any(s != source_id for s in bad):
            raise StoreError(f"samples of source {source_id} carry another source id")
        staged: list[tuple[Path, Path]] = []
        token = uuid.uuid4().hex[:12]  # temporary names of this add alone: concurrent adds never share one
        try:
            hardware_col, primitive_col = table.column("hardware"), table.column("primitive")
            keys = pa.table({"h": hardware_col, "p": primitive_col}).group_by(["h", "p"]).aggregate([])
            for hardware, primitive in sorted(zip(keys["h"].to_pylist(), keys["p"].to_pylist())):
                folder = self.root / "samples" / f"hardware={_part(hardware)}" / f"primitive={_part(primitive)}"
                folder.mkdir(parents=True, exist_ok=True)
                final = folder / f"{source_id}.parquet"
                tmp = folder / f".{source_id}.{token}.parquet.tmp"
                rows_of_part = pc.and_(pc.equal(hardware_col, hardware), pc.equal(primitive_col, primitive))
                pq.write_table(table.filter(rows_of_part), tmp)
                staged.append((tmp, final))
            with self._lock():
                sources = self.sources()
                if source_id in sources:  # another process added it while this one was writing
                    for tmp, _ in staged:
                        tmp.unlink(missing_ok=True)
                    return 0
                for tmp, final in staged:
                    os.replace(tmp, final)
                sources[source_id] = {**(meta or {}), "rows": table.num_rows}
                atomic_write_json(self._manifest_path, sources)
        except BaseException:
            for tmp, _ in staged:
                tmp.unlink(missing_ok=True)
            raise
        return table.num_rows

    def remove(self, source_id: str) -> None:
        """Forget a source and delete its files."""
        with self._lock():
            sources = self.sources()
            if source_id not in sources:
                return
            del sources[source_id]
            atomic_write_json(self._manifest_path, sources)
            for path in (self.root / "samples").glob(f"*/*/{source_id}.parquet"):
                path.unlink(missing_ok=True)

    # -- reading ----------------------------------------------------------------------------------------------
    def read(self, hardware: str | list[str] | None = None, primitive: str | list[str] | None = None):
        """All recorded samples (optionally of some hardware ids / primitives) as a pandas DataFrame."""
        known = self.sources()
        hardware_set = {_part(h) for h in ([hardware] if isinstance(hardware, str) else hardware or [])}
        primitive_set = {_part(p) for p in ([primitive] if isinstance(primitive, str) else primitive or [])}
        tables = []
        base = self.root / "samples"
        for path in sorted(base.glob("hardware=*/primitive=*/*.parquet")) if base.exists() else []:
            hw = path.parent.parent.name.split("=", 1)[1]
            prim = path.parent.name.split("=", 1)[1]
            if path.stem not in known or (hardware_set and hw not in hardware_set):
                continue
            if primitive_set and prim not in primitive_set:
                continue
            try:
                tables.append(pq.read_table(path, schema=SCHEMA))
            except (OSError, pa.ArrowInvalid) as exc:
                raise StoreError(f"{path}: unreadable sample file ({exc})") from exc
        if not tables:
            return SCHEMA.empty_table().to_pandas()
        return pa.concat_tables(tables).to_pandas()

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
