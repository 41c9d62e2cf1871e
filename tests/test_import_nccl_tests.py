"""`tracekit import --format nccl-tests`: vTrain's real nccl-tests tables (group size from the file name, times in
ns) and nccl-tests' own stdout layout (devices and hosts from its header; all_gather bytes per rank)."""
from __future__ import annotations

import csv
import json
import shutil

from typer.testing import CliRunner

from tests.conftest import SAMPLES
from tracekit.cli import app
from tracekit.core.store import SampleStore

VTRAIN = SAMPLES / "vtrain-allreduce" / "a100"
runner = CliRunner()

STDOUT = """\
# nThread 1 nGpus 1 minBytes 1048576 maxBytes 2097152 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation:
# 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  31962 on     node-a device  0 [0x07] NVIDIA A100-SXM4-80GB
#  Rank  1 Group  0 Pid  31963 on     node-a device  1 [0x0b] NVIDIA A100-SXM4-80GB
#  Rank  2 Group  0 Pid  40001 on     node-b device  0 [0x07] NVIDIA A100-SXM4-80GB
#  Rank  3 Group  0 Pid  40002 on     node-b device  1 [0x0b] NVIDIA A100-SXM4-80GB
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576        262144     float    none      -1    90.31   11.61    8.71      0    89.92   11.66    8.75      0
     2097152        524288     float    none      -1   150.10   13.97   10.48      0   149.87   13.99   10.49      0
"""  # noqa: E501 (nccl-tests' output, verbatim)


def test_vtrain_tables(tmp_path):
    src = tmp_path / "a100"
    src.mkdir()
    for n in (2, 8):
        shutil.copy(VTRAIN / f"AR_GPU{n}_1M_1024M_LUT.csv", src)
    store = tmp_path / "store"
    result = runner.invoke(app, ["import", str(src), "--format", "nccl-tests", "--hardware", "A100-SXM4-40GB",
                                 "--store", str(store), "--json"])
    assert result.exit_code == 0, result.output
    samples = SampleStore(store).read()
    for n in (2, 8):
        with open(VTRAIN / f"AR_GPU{n}_1M_1024M_LUT.csv", newline="") as handle:
            rows = list(csv.reader(handle))[1:]
        mine = samples[samples["group_size"] == n]
        assert len(mine) == len(rows)
        # out-of-place time (first time(ns) column) in µs; size is the all-reduce buffer
        expected = sorted((float(r[0]), float(r[3]) / 1000) for r in rows)
        assert sorted(zip(mine["bytes"], mine["duration_us"])) == expected
    assert set(samples["primitive"]) == {"all_reduce"} and set(samples["nodes"]) == {1.0}
    assert set(samples["dtype"]) == {"fp32"} and set(samples["hardware"]) == {"A100-SXM4-40GB"}


def test_table_without_hardware_is_refused(tmp_path):
    result = runner.invoke(app, ["import", str(VTRAIN / "AR_GPU2_1M_1024M_LUT.csv"), "--format", "nccl-tests",
                                 "--store", str(tmp_path / "s")])
    assert result.exit_code == 2
    assert "AR_GPU2_1M_1024M_LUT.csv: the file names no device" in result.stderr


def test_corrupted_table_names_the_line(tmp_path):
    bad = tmp_path / "AR_GPU4_1M_1024M_LUT.csv"
    lines = (VTRAIN / bad.name).read_text().splitlines()
    fields = lines[9].split(",")
    fields[3] = "-"  # time(ns) of line 10
    lines[9] = ",".join(fields)
    bad.write_text("\n".join(lines) + "\n")
    store = tmp_path / "s"
    result = runner.invoke(app, ["import", str(bad), "--format", "nccl-tests", "--hardware", "A100-SXM4-40GB",
                                 "--store", str(store)])
    assert result.exit_code == 2
    assert "AR_GPU4_1M_1024M_LUT.csv: line 10: column 'time(ns)'" in result.stderr
    assert SampleStore(store).read().empty


def test_nccl_tests_stdout(tmp_path):
    out = tmp_path / "all_gather_perf.out"
    out.write_text(STDOUT)
    store = tmp_path / "s"
    result = runner.invoke(app, ["import", str(out), "--format", "nccl-tests", "--store", str(store), "--json"])
    assert result.exit_code == 0, result.output
    samples = SampleStore(store).read().sort_values("bytes")
    assert set(samples["hardware"]) == {"A100-SXM4-80GB"} and set(samples["primitive"]) == {"all_gather"}
    assert set(samples["nodes"]) == {2.0} and set(samples["ranks_per_node"]) == {2.0}
    assert set(samples["group_size"]) == {4.0}
    # nccl-tests' size is the gathered buffer; tracekit stores each rank's shard
    assert samples["bytes"].tolist() == [1048576 / 4, 2097152 / 4]
    assert samples["duration_us"].tolist() == [90.31, 150.10]
    assert json.loads(result.stdout)["files"][0]["rows"] == 2


def test_collective_option_is_validated(tmp_path):
    out = tmp_path / "perf.out"
    out.write_text(STDOUT.replace("all_gather", "x"))
    bad = runner.invoke(app, ["import", str(out), "--format", "nccl-tests", "--collective", "gossip",
                              "--store", str(tmp_path / "s")])
    assert bad.exit_code == 2 and "unknown collective 'gossip'" in bad.stderr
    unnamed = runner.invoke(app, ["import", str(out), "--format", "nccl-tests", "--store", str(tmp_path / "s")])
    assert unnamed.exit_code == 2 and "cannot tell which collective" in unnamed.stderr
    good = runner.invoke(app, ["import", str(out), "--format", "nccl-tests", "--collective", "reducescatter",
                               "--store", str(tmp_path / "s")])
    assert good.exit_code == 0
    assert set(SampleStore(tmp_path / "s").read()["primitive"]) == {"reduce_scatter"}
