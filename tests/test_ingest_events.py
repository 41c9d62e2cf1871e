"""The chunked event decoder (used for large traces) reads exactly what the one-shot decoder reads."""
from __future__ import annotations

import gzip

import msgspec
import numpy as np
import orjson

import extractors.kineto.decode as events_module
from extractors.kineto.load import open_trace
from tests.conftest import KINETO

NCCL = KINETO / "hta" / "nccl_parser_config_nccl_data.json.gz"


def same_columns(a, b) -> None:
    for name in ("op_ts", "op_dur", "op_ext", "dev_ts", "dev_dur", "dev_corr", "rt_ts", "rt_corr"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.op_name == b.op_name and a.op_dims == b.op_dims and a.dev_name == b.dev_name
    assert a.events_total == b.events_total and a.kernel_events == b.kernel_events


def test_chunked_decoding_matches_one_shot(monkeypatch):
    whole = events_module.decode_events(open_trace(NCCL).events_raw)
    monkeypatch.setattr(events_module, "CHUNK_THRESHOLD", 0)
    monkeypatch.setattr(events_module, "CHUNK_BYTES", 64 << 10)
    chunked = events_module.decode_events(open_trace(NCCL).events_raw)
    same_columns(whole, chunked)


def test_chunk_cut_inside_a_string_falls_back_to_the_exact_split(tmp_path, monkeypatch):
    data = orjson.loads(gzip.decompress(NCCL.read_bytes()))
    tricky = {"ph": "X", "cat": "user_annotation", "name": "x" * 70000 + "}, {" + "y" * 70000, "pid": 1, "tid": 1,
              "ts": data["traceEvents"][0]["ts"], "dur": 1.0}
    data["traceEvents"].insert(len(data["traceEvents"]) // 2, tricky)
    path = tmp_path / "tricky.json"
    path.write_bytes(orjson.dumps(data))
    whole = events_module.decode_events(open_trace(path).events_raw)
    assert tricky["name"] in whole.op_name
    monkeypatch.setattr(events_module, "CHUNK_THRESHOLD", 0)
    monkeypatch.setattr(events_module, "CHUNK_BYTES", 64 << 10)
    undecodable = 0
    for chunk in events_module._byte_chunks(memoryview(open_trace(path).events_raw)):
        try:
            events_module.EVENTS.decode(chunk)
        except (msgspec.DecodeError, msgspec.ValidationError):
            undecodable += 1
    assert undecodable  # a cut landed inside the string: the fast split fails and the fallback must be exact
    same_columns(whole, events_module.decode_events(open_trace(path).events_raw))


def test_bare_event_array_reads_like_the_object_form(tmp_path):
    """Chrome's JSON Array Format (just the events) is a trace too; without deviceProperties hardware is unknown."""
    from extractors.kineto import read_trace

    data = orjson.loads(gzip.decompress(NCCL.read_bytes()))
    path = tmp_path / "array.json"
    path.write_bytes(orjson.dumps(data["traceEvents"]))
    bare, full = read_trace(path), read_trace(NCCL)
    assert bare.hardware == "unknown" and bare.rank is None and bare.kernels == full.kernels == 2700
    assert bare.device_events["primitive"].tolist() == full.device_events["primitive"].tolist()
