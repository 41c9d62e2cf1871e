"""`tracekit ingest` end to end: tables/JSON, bad inputs (one line each, exit codes, store untouched),
idempotent re-ingest, redaction of the trace environment, and B/E event pairs."""
from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import orjson
import pandas as pd
import pytest
from typer.testing import CliRunner

from extractors.kineto import read_trace
from tests.conftest import KINETO, TRACES
from tracekit.cli import app
from tracekit.core.store import SampleStore

NCCL = KINETO / "hta" / "nccl_parser_config_nccl_data.json.gz"
BERT = KINETO / "tracelens" / "h100__gaunernst_bert-small-uncased__1016001.json.gz"
CHAKRA = KINETO / "hta" / "execution_trace_benchmark_simple_add_et.json.gz"
runner = CliRunner()


def ingest(*args: str):
    return runner.invoke(app, ["ingest", *args])


def tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture()
def bad_inputs(tmp_path) -> dict:
    """Each bad input is derived from a real file; value = words the error line must contain."""
    truncated = tmp_path / "truncated.json.gz"
    truncated.write_bytes(NCCL.read_bytes()[:200_000])
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model": "gpt", "layers": 2}))
    untimed = tmp_path / "untimed.json"
    data = orjson.loads(gzip.decompress(BERT.read_bytes()))
    data = {"schemaVersion": 1, "traceEvents": [e for e in data["traceEvents"] if e.get("ph") in ("M", "i")]}
    untimed.write_bytes(orjson.dumps(data))
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    return {CHAKRA: "Chakra execution trace", truncated: "truncated gzip", config: "not a Kineto trace",
            untimed: "nothing timed", empty: "no trace files"}


def test_bad_inputs_one_line_each_exit_2_store_unchanged(tmp_path, bad_inputs):
    store = tmp_path / "store"
    assert ingest(str(TRACES / "kineto" / "nccl_parser_config_nccl_data.json.gz"), "--store", str(store)).exit_code == 0
    before = tree_digest(store)
    for path, words in bad_inputs.items():
        result = ingest(str(path), "--store", str(store))
        assert result.exit_code == 2, result.output
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and str(path) in lines[0] and words in lines[0], lines
        assert tree_digest(store) == before
    result = ingest(*map(str, bad_inputs), "--store", str(store), "--json")
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc["traces"] == [] and len(doc["errors"]) == len(bad_inputs)
    assert tree_digest(store) == before


def test_a_failed_ingest_names_no_store_it_did_not_make(tmp_path, bad_inputs):
    """Nothing ingested: the error lines and exit 2, not "0 traces ingested, 0 samples written to S" for a store that
    does not exist."""
    store = tmp_path / "never-made"
    for path in bad_inputs:
        result = ingest(str(path), "--store", str(store))
        assert result.exit_code == 2 and result.stdout == "" and str(store) not in result.stderr, result.output
        assert not store.exists()


def test_partial_failure_exits_1_and_ingests_the_rest(tmp_path, bad_inputs):
    store = tmp_path / "store"
    result = ingest(str(NCCL), str(CHAKRA), "--store", str(store), "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert [Path(t["path"]).name for t in doc["traces"]] == [NCCL.name]
    assert [Path(e["path"]).name for e in doc["errors"]] == [CHAKRA.name]


def test_json_schema_and_idempotent_reingest(tmp_path):
    store = tmp_path / "store"
    first = ingest(str(NCCL), "--store", str(store), "--json")
    assert first.exit_code == 0, first.output
    doc = json.loads(first.stdout)
    assert set(doc) == {"traces", "errors", "skipped"} and doc["errors"] == [] == doc["skipped"]
    (report,) = doc["traces"]
    assert set(report) == {"path", "hardware", "rank", "world_size", "iterations", "kernels", "gpu_busy_us",
                           "primitives", "unclassified_share", "backward", "launch_not_recorded",
                           "samples_written"}
    assert (report["hardware"], report["rank"], report["world_size"]) == ("A100-PG509-200", 0, 2)
    assert report["kernels"] == 2700 and report["iterations"] == 3
    device_events = 2700 + 114 + 960  # kernels + memsets + memcpys in the file
    assert sum(p["count"] for p in report["primitives"].values()) == device_events
    # one sample per device event, but a backward node's linked kernels are one sample per role
    events = read_trace(NCCL).device_events
    linked = events[events["bwd_node"] >= 0]
    groups = len(linked.groupby(["bwd_node", "role"]))
    assert 0 < groups <= len(linked)
    assert report["samples_written"] == device_events - len(linked) + groups
    back = report["backward"]
    assert back["linked"] == len(linked) == sum(back["roles"].values())
    assert back["linked"] + back["unlinked"] == back["kernels"]
    assert all(set(p) == {"count", "time_us"} for p in report["primitives"].values())
    assert 0 <= report["unclassified_share"] < 1
    before = tree_digest(store)
    again = json.loads(ingest(str(NCCL), "--store", str(store), "--json").stdout)
    assert again["traces"][0]["samples_written"] == 0
    assert tree_digest(store) == before
    assert len(SampleStore(store).read()) == report["samples_written"]
    table = ingest(str(NCCL), "--store", str(store))
    assert "A100-PG509-200" in table.stdout and "all_reduce" in table.stdout


def test_trace_environment_is_never_stored_or_printed(tmp_path):
    env = orjson.loads(gzip.decompress(BERT.read_bytes()))["metadata"]["system"]["env"]
    secrets = ["HF_TOKEN", "MOCA_LOG_FILE", "KMP_DUPLICATE_LIB_OK", "<REDACTED>"]
    secrets += [v for k, v in env.items() if k in ("HOSTNAME", "HF_HOME") and isinstance(v, str) and len(v) > 5]
    store = tmp_path / "store"
    outputs = [ingest(str(BERT), "--store", str(store), "--json"), ingest(str(BERT), "--store", str(store))]
    text = "".join(o.output for o in outputs)
    blobs = b"".join(p.read_bytes() for p in store.rglob("*") if p.is_file())
    frame = SampleStore(store).read()
    cells = " ".join(str(v) for v in frame.astype(str).to_numpy().ravel()) + json.dumps(SampleStore(store).sources())
    for secret in secrets:
        assert secret not in text and secret.encode() not in blobs and secret not in cells, secret


def test_begin_end_pairs_read_like_complete_events(tmp_path):
    """The same real trace with every X event rewritten as a B/E pair gives the same device events."""
    data = orjson.loads(gzip.decompress(NCCL.read_bytes()))
    paired = []
    for e in data["traceEvents"]:
        if e.get("ph") != "X":
            paired.append((e.get("ts", 0), 2, 0, e))
            continue
        begin = {k: v for k, v in e.items() if k != "dur"} | {"ph": "B"}
        end = {"ph": "E", "pid": e["pid"], "tid": e["tid"], "ts": e["ts"] + e["dur"]}
        paired.append((e["ts"], 1, -e["dur"], begin))
        paired.append((e["ts"] + e["dur"], 0, -e["ts"], end))
    paired.sort(key=lambda item: item[:3])
    data["traceEvents"] = [item[3] for item in paired]
    path = tmp_path / "paired.json"
    path.write_bytes(orjson.dumps(data))
    original = read_trace(NCCL).device_events
    rewritten = read_trace(path).device_events
    key = ["ts_us", "name"]
    original = original.sort_values(key, kind="stable").reset_index(drop=True)
    rewritten = rewritten.sort_values(key, kind="stable").reset_index(drop=True)
    assert len(rewritten) == len(original) == 3774
    assert rewritten["dur_us"].to_numpy() == pytest.approx(original["dur_us"].to_numpy(), abs=1e-3)
    for column in ("name", "primitive", "pass", "op", "iteration", "bytes", "m", "n", "k"):
        pd.testing.assert_series_equal(rewritten[column], original[column], check_names=False)


def test_bundled_demo_traces_ingest_cleanly(tmp_path):
    """`make demo` ingests traces/: every bundled trace must ingest, and the 8 DLRM ranks match up."""
    result = ingest(str(TRACES), "--store", str(tmp_path / "store"), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["errors"] == []
    names = sorted(Path(t["path"]).name for t in doc["traces"])
    assert names == sorted(p.name for p in TRACES.rglob("*.json*"))
    table = ingest(str(TRACES), "--store", str(tmp_path / "store2"))
    assert "collectives matched across ranks: 8" in table.stdout


def test_a_multi_rank_run_prints_a_summary_and_skips_non_trace_json(tmp_path):
    """Eight DLRM ranks and a config.json in one run folder: one line per rank (their tables with --verbose), the
    config skipped with a note on stderr (named on its own it is an error: see bad_inputs)."""
    run = tmp_path / "run"
    run.mkdir()
    ranks = sorted((TRACES / "kineto" / "dlrm_8rank").glob("*.json.gz"))
    for path in ranks:
        (run / path.name).write_bytes(path.read_bytes())
    (run / "config.json").write_text(json.dumps({"model": "dlrm", "lr": 0.1}))
    done = ingest(str(run), "--store", str(tmp_path / "store"))
    assert done.exit_code == 0, done.output
    assert f"note: skipped {run / 'config.json'}: JSON but not a Kineto trace" in done.stderr
    lines = done.stdout.splitlines()
    assert sum(1 for line in lines if line.startswith("│ worker")) == len(ranks) == 8  # one summary row per rank
    assert f"{len(ranks)} traces ingested" in done.stdout and "primitive" not in done.stdout  # no per-rank tables
    assert "1 iterations" not in done.stdout and "?" not in done.stdout
    verbose = ingest(str(run), "--store", str(tmp_path / "store2"), "--verbose", "--json")
    doc = json.loads(verbose.stdout)
    skipped = {"path": str(run / "config.json"), "reason": "JSON but not a Kineto trace (no traceEvents)"}
    assert doc["skipped"] == [skipped]
    tables = ingest(str(run), "--store", str(tmp_path / "store3"), "--verbose")
    assert tables.stdout.count("primitive") == len(ranks)  # each rank's table of primitives


def test_parallel_ingest_gives_what_one_process_gives(tmp_path):
    """Two runs' traces (the DLRM ranks and the 2-rank DDP file bundled in traces/) parsed and written by 2 worker
    processes give the same samples, reports (in the same order) and matched collectives as one process; the
    workers are forked (they start with everything imported) where this process runs no other thread, and spawned
    otherwise (forced here whatever the files' size)."""
    from extractors.kineto import ingest_paths
    from tracekit.core.store import SampleStore

    run = Path(__file__).resolve().parent.parent / "traces" / "kineto"
    results, frames = [], []
    for jobs in (1, 2):
        store = SampleStore(tmp_path / f"jobs{jobs}")
        results.append(ingest_paths([str(run / "dlrm_8rank"), str(run / "nccl_parser_config_nccl_data.json.gz")],
                                    store, jobs=jobs, parallel_min_bytes=0))
        frames.append(store.read().sort_values(["source", "rank", "kernel", "duration_us"]).reset_index(drop=True))
    assert results[0].traces == results[1].traces and results[0].errors == results[1].errors
    assert results[0].matched_collectives == results[1].matched_collectives > 0
    assert frames[0].equals(frames[1]) and len(frames[0]) > 0


def test_ray_ingest_gives_what_one_process_gives(tmp_path, ray_local):
    """The DLRM ranks parsed as Ray tasks: the same samples, reports and matched collectives as one process;
    ingesting again writes nothing (the store's idempotence holds), and the CLI flag runs the same path."""
    from extractors.kineto import ingest_paths
    from tracekit.core.store import SampleStore

    run = Path(__file__).resolve().parent.parent / "traces" / "kineto" / "dlrm_8rank"
    local_store, ray_store = SampleStore(tmp_path / "local"), SampleStore(tmp_path / "ray")
    local = ingest_paths([str(run)], local_store, jobs=1)
    remote = ingest_paths([str(run)], ray_store, executor="ray")
    assert remote.traces == local.traces and remote.errors == local.errors == []
    assert remote.matched_collectives == local.matched_collectives > 0
    frames = [s.read().sort_values(["source", "rank", "kernel", "duration_us"]).reset_index(drop=True)
              for s in (local_store, ray_store)]
    assert frames[0].equals(frames[1]) and len(frames[0]) > 0
    again = ingest_paths([str(run)], ray_store, executor="ray")
    assert [t["samples_written"] for t in again.traces] == [0] * 8
    cli = ingest(str(run), "--store", str(tmp_path / "cli"), "--executor", "ray", "--json")
    assert cli.exit_code == 0, cli.output
    assert sorted(t["samples_written"] for t in json.loads(cli.stdout)["traces"]) == \
        sorted(t["samples_written"] for t in local.traces)


def test_ray_ingest_flags_and_missing_extra(tmp_path, monkeypatch):
    import sys

    from extractors.kineto import ingest_paths
    from tracekit.core.errors import ConfigError
    from tracekit.core.store import SampleStore

    both = ingest(str(TRACES), "--store", str(tmp_path / "s"), "--executor", "ray", "--jobs", "2")
    assert both.exit_code == 2 and "--jobs" in both.stderr
    monkeypatch.setitem(sys.modules, "ray", None)  # as on a machine without the extra
    with pytest.raises(ConfigError, match="pip install 'tracekit\\[ray\\]'"):
        ingest_paths([str(TRACES)], SampleStore(tmp_path / "s"), executor="ray")
    assert not (tmp_path / "s").exists()  # nothing written


def test_a_folder_is_one_store_commit(tmp_path):
    """The DLRM run's 8 ranks are written in one commit: one Parquet file per (hardware, primitive) partition holds
    all of them; every rank's rows are there as its report says; a rank removed from the store is written again by
    a re-ingest and the others are not."""
    from extractors.kineto import ingest_paths

    run = TRACES / "kineto" / "dlrm_8rank"
    store = SampleStore(tmp_path / "s")
    result = ingest_paths([str(run)], store, jobs=1)
    files = sorted((tmp_path / "s" / "samples").rglob("*.parquet"))
    assert len({p.stem for p in files}) == 1 and len(files) == len({p.parent for p in files})
    written = {Path(t["path"]).name: t["samples_written"] for t in result.traces}
    per_source = store.read().groupby("source_path").size().to_dict()
    assert len(written) == 8 and per_source == written
    dropped = next(sid for sid, meta in store.sources().items() if meta["rank"] == 3)
    store.remove(dropped)
    again = ingest_paths([str(run)], store, jobs=1)
    assert sorted(t["samples_written"] for t in again.traces) == [0] * 7 + [written[store.sources()[dropped]["path"]]]
    assert store.read().groupby("source_path").size().to_dict() == written
