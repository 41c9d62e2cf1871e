"""SampleStore: atomic, idempotent appends partitioned by hardware and primitive."""
import hashlib

import pytest

from tracekit.core.errors import StoreError
from tracekit.core.samples import SCHEMA
from tracekit.core.store import SampleStore


def _rows(source, n=3, hardware="A100-SXM4-80GB"):
    return [
        {"hardware": hardware, "primitive": prim, "pass": "fwd", "m": float(i + 1), "n": 8.0, "k": 8.0,
         "duration_us": 10.0 + i, "source": source}
        for i, prim in zip(range(n), ["gemm", "gemm", "norm"])
    ]


def _tree_digest(root):
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def test_add_is_idempotent_and_partitioned(tmp_path):
    store = SampleStore(tmp_path / "s")
    assert store.add("src1", _rows("src1")) == 3
    assert store.add("src1", _rows("src1")) == 0
    frame = store.read()
    assert len(frame) == 3 and list(frame.columns) == SCHEMA.names
    assert sorted(p.parent.name for p in (tmp_path / "s" / "samples").rglob("*.parquet")) == [
        "primitive=gemm", "primitive=norm"]
    assert len(store.read(primitive="gemm")) == 2
    assert len(store.read(hardware="H100-80GB-HBM3")) == 0


def test_failed_add_leaves_store_unchanged(tmp_path):
    store = SampleStore(tmp_path / "s")
    store.add("src1", _rows("src1"))
    before = _tree_digest(tmp_path / "s")
    bad = _rows("src2")
    bad[2]["duration_us"] = "not a number"
    with pytest.raises(Exception):
        store.add("src2", bad)
    with pytest.raises(StoreError, match="another source id"):
        store.add("src3", _rows("src1"))
    assert _tree_digest(tmp_path / "s") == before
    assert set(store.sources()) == {"src1"}


def test_unrecorded_files_are_invisible(tmp_path):
    """Files of a source whose add never reached the manifest (a crash) are not read."""
    store = SampleStore(tmp_path / "s")
    store.add("src1", _rows("src1"))
    orphan = next((tmp_path / "s" / "samples").rglob("src1.parquet"))
    orphan.with_name("ghost.parquet").write_bytes(orphan.read_bytes())
    assert len(store.read()) == 3


def test_remove(tmp_path):
    store = SampleStore(tmp_path / "s")
    store.add("a", _rows("a"))
    store.add("b", _rows("b", hardware="GH200-120GB"))
    store.remove("a")
    assert set(store.read()["hardware"]) == {"GH200-120GB"}


def test_add_many_is_one_commit_and_idempotent(tmp_path):
    """Several sources in one commit: one Parquet file per partition holds them all, each source is recorded with its
    rows; a source already in the store, or given twice in the batch, writes 0; a batch of known sources writes
    nothing at all."""
    store = SampleStore(tmp_path / "s")
    store.add("old", _rows("old"))
    written = store.add_many([("a", _rows("a"), {"path": "a.json"}), ("old", _rows("old"), None),
                              ("b", _rows("b", hardware="GH200-120GB"), {"path": "b.json"}),
                              ("a", _rows("a"), {"path": "a.json"})])
    assert written == [3, 0, 3, 0]
    files = sorted((tmp_path / "s" / "samples").rglob("*.parquet"))
    batch = {p.stem for p in files} - {"old"}
    assert len(batch) == 1 and len(files) == 2 + 2 + 2  # old, a (gemm, norm on A100), b (gemm, norm on GH200)
    assert store.sources()["a"]["path"] == "a.json" and store.sources()["a"]["rows"] == 3
    frame = store.read()
    assert frame.groupby("source").size().to_dict() == {"a": 3, "b": 3, "old": 3}
    before = _tree_digest(tmp_path / "s")
    assert store.add_many([("a", _rows("a"), None), ("b", _rows("b"), None)]) == [0, 0]
    assert _tree_digest(tmp_path / "s") == before


def test_a_failed_add_many_leaves_the_store_unchanged(tmp_path):
    store = SampleStore(tmp_path / "s")
    store.add("src1", _rows("src1"))
    before = _tree_digest(tmp_path / "s")
    with pytest.raises(StoreError, match="another source id"):
        store.add_many([("a", _rows("a"), None), ("b", _rows("a"), None)])
    assert _tree_digest(tmp_path / "s") == before and set(store.sources()) == {"src1"}


def test_remove_one_source_of_a_batch_keeps_the_others(tmp_path):
    store = SampleStore(tmp_path / "s")
    store.add_many([("a", _rows("a"), None), ("b", _rows("b"), None), ("c", _rows("c", hardware="GH200-120GB"), None)])
    store.remove("b")
    assert store.read().groupby("source").size().to_dict() == {"a": 3, "c": 3}
    assert store.add("b", _rows("b")) == 3  # can be added again
    store.remove("a")
    store.remove("c")
    assert store.read().groupby("source").size().to_dict() == {"b": 3}
    assert [p.stem for p in (tmp_path / "s" / "samples").rglob("*.parquet")] == ["b", "b"]  # the batch's files gone
