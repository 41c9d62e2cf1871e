"""`tracekit import` of published performance tables: XLA's GEMM and collective tables and aiter's tuning files from
the corpus. Known rows keep their shapes, dtypes and times exactly; suspect rows are refused by name (counted and
listed, never dropped silently); the byte conventions of XLA's collective table become tracekit's."""
from __future__ import annotations

import csv
import json
import shutil

import pytest
from typer.testing import CliRunner

from extractors import aiter_fmoe, aiter_gemm, xla_collectives, xla_gemm
from tests.conftest import SAMPLES
from tracekit.cli import app
from tracekit.core.errors import InputError
from tracekit.core.hardware import SPECS
from tracekit.core.store import SampleStore

MATMUL = SAMPLES / "xla-matmul"
COLLECTIVES = SAMPLES / "xla-collectives" / "h100_sm90.csv"
AITER = SAMPLES / "rocm-aiter"
runner = CliRunner()


def table_rows(path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def imported(tmp_path, paths, fmt, *extra) -> tuple[dict, SampleStore]:
    store = tmp_path / "store"
    result = runner.invoke(app, ["import", *map(str, paths), "--format", fmt, "--store", str(store), "--json",
                                 *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), SampleStore(store)


@pytest.mark.parametrize("name, b, m, n, k, key", [
    ("h100_sm90.csv", 1, 4096, 4096, 4096, "bf16xbf16->bf16"),
    ("b200_sm100.csv", 1, 4096, 4096, 4096, "bf16xbf16->bf16"),
    ("b200_sm100.csv", 4, 4096, 4096, 4096, "f8e4m3fnxf8e5m2->bf16"),
    ("mi300x_gfx942.csv", 2, 256, 1024, 2048, "bf16xbf16->f32"),
])
def test_a_known_table_row_round_trips_exactly(tmp_path, name, b, m, n, k, key):
    source = MATMUL / name
    row = next(r for r in table_rows(source) if (int(r["b"]), int(r["m"]), int(r["n"]), int(r["k"])) == (b, m, n, k)
               and r["dtype_key"] == key)
    flops = int(row["flops_per_s"])
    work = 2 * b * m * n * k
    t_ns = round(work * 1e9 / flops)  # XLA stores work · 1e9 / t_ns of an integer kernel time t_ns
    _, store = imported(tmp_path, [source], "xla-gemm")
    samples = store.read()
    mine = samples[(samples["batch"] == b) & (samples["m"] == m) & (samples["n"] == n) & (samples["k"] == k)
                   & (samples["variant"] == f"xla {key}")]
    assert len(mine) == 1
    got = mine.iloc[0]
    assert got["primitive"] == ("gemm" if b == 1 else "bmm")
    assert got["dtype"] == {"bf16": "bf16", "f8e4m3fn": "fp8"}[row["lhs_dtype"]]
    assert got["hardware"] == {"h100": "H100-80GB-HBM3", "b200": "B200-180GB", "mi300x": "MI300X"}[name.split("_")[0]]
    assert got["duration_us"] == t_ns / 1000  # the measured nanoseconds, exactly
    assert abs(work * 1e9 / (got["duration_us"] * 1000) - flops) < 1  # and the table's rate back
    assert got["source_path"] == name and "not stated" in got["kernel"]


def test_every_row_is_imported_or_refused_by_name(tmp_path):
    report, store = imported(tmp_path, [MATMUL], "xla-gemm")
    samples = store.read()
    for name in ("h100_sm90.csv", "h100_sm90_openxla.csv", "b200_sm100.csv", "mi300x_gfx942.csv"):
        refused = [r for r in report["refused"] if r["path"].endswith(name)]
        assert (samples["source_path"] == name).sum() + len(refused) == len(table_rows(MATMUL / name))
        assert all(r["row"].startswith(f"{name} line {r['line']}: ") for r in refused)


def test_h100_fp8_above_the_dense_peak_and_the_implausible_rest_are_refused(tmp_path):
    source = MATMUL / "h100_sm90_openxla.csv"
    rows = table_rows(source)
    peak = SPECS["H100-80GB-HBM3"].peak_tflops_fp8 * 1e12
    above = {i + 2 for i, r in enumerate(rows) if r["lhs_dtype"].startswith("f8") and int(r["flops_per_s"]) > peak}
    fp8 = {i + 2 for i, r in enumerate(rows) if r["lhs_dtype"].startswith("f8")}
    report, store = imported(tmp_path, [source], "xla-gemm")
    by_line = {r["line"]: r["reason"] for r in report["refused"]}
    assert len(above) == 87 and {line for line in above if "dense peak" in by_line[line]} == above
    assert set(by_line) == fp8  # every fp8 row, by name: the table's fp8/bf16 speed-up exceeds the peak ratio
    assert all("implausible" in by_line[line] for line in fp8 - above)
    assert set(store.read()["dtype"]) == {"bf16", "tf32"}
    counts = {(c["file"], c["reason"][:20]): c["rows"] for c in report["refused_by_reason"]}
    assert sum(counts.values()) == len(fp8)


def test_gfx942_fp8_is_refused_as_a_fallback_and_its_repeated_shape_once(tmp_path):
    report, store = imported(tmp_path, [MATMUL / "mi300x_gfx942.csv"], "xla-gemm")
    reasons = [r["reason"] for r in report["refused"]]
    assert sum("fallback" in r for r in reasons) == 375
    repeated = [r for r in report["refused"] if "listed again" in r["reason"]]
    assert [r["line"] for r in repeated] == [2]  # the section's extra opening block; the regular entry is kept
    assert "fp8" not in set(store.read()["dtype"])


def test_a_mistyped_digit_is_refused_by_name_and_the_rest_imported(tmp_path):
    source = tmp_path / "h100_sm90.csv"
    lines = (MATMUL / "h100_sm90.csv").read_text().splitlines()
    fields = lines[9].split(",")
    flops = fields[10]
    fields[10] = flops[:5] + str((int(flops[5]) + 1) % 10) + flops[6:]  # one digit off: line 10
    lines[9] = ",".join(fields)
    source.write_text("\n".join(lines) + "\n")
    result = runner.invoke(app, ["import", str(source), "--format", "xla-gemm", "--store", str(tmp_path / "s")])
    assert result.exit_code == 0, result.output
    assert "refused 1 row(s) of h100_sm90.csv: checksum" in result.stdout
    assert "h100_sm90.csv line 10: b=" in result.stdout
    assert len(SampleStore(tmp_path / "s").read()) == len(lines) - 2


def test_collective_bytes_follow_tracekit_conventions(tmp_path):
    rows = table_rows(COLLECTIVES)
    read = xla_collectives.read_file(COLLECTIVES)
    assert not read.refused  # every row an integer number of ns on XLA's whole buffer, HARVEST's suspect one too
    samples = read.samples
    assert set(samples["hardware"]) == {"H100-80GB-HBM3"} and set(samples["nodes"]) == {1.0}
    for kind, primitive in xla_collectives.KINDS.items():
        for row in (r for r in rows if r["collective"] == kind):
            n, elements = int(row["replica_group_size"]), int(row["message_elements"])
            result_bytes = elements * 4
            whole = result_bytes * (n if kind == "reduce-scatter" else 1)  # reduce-scatter's shape is its output
            mine = samples[(samples["primitive"] == primitive) & (samples["group_size"] == n)
                           & (samples["variant"].str.contains(f"iota\\[{8 // n}x{n}\\]"))
                           & (samples["numel"] == (whole // n if primitive in ("all_gather", "reduce_scatter")
                                                   else whole) / 4)]
            assert len(mine) == 1
            per_rank = whole / n if primitive in ("all_gather", "reduce_scatter") else whole
            assert mine["bytes"].iat[0] == per_rank
            # XLA's throughput: whole buffer · 1e9 / t_ns, truncated; t_ns is what it gives back, to within 1 ns
            implied_ns = whole * 1e9 / int(row["network_throughput_bytes_per_sec"])
            assert mine["duration_us"].iat[0] == round(implied_ns) / 1000
            assert abs(mine["duration_us"].iat[0] * 1000 - implied_ns) < 1
    suspect = samples[(samples["primitive"] == "reduce_scatter") & (samples["group_size"] == 8)
                      & (samples["bytes"] == 67108864 * 4)]
    assert suspect["duration_us"].iat[0] == 5710.015  # 8 × the per-device output over the throughput: integer ns


def test_a_corrupted_collective_row_is_refused_by_name(tmp_path):
    source = tmp_path / "h100_sm90.csv"
    lines = COLLECTIVES.read_text().splitlines()
    fields = lines[30].split(",")
    fields[9] = str(int(fields[9]) + 7)
    lines[30] = ",".join(fields)
    source.write_text("\n".join(lines) + "\n")
    read = xla_collectives.read_file(source)
    assert [r["line"] for r in read.refused] == [31] and "checksum" in read.refused[0]["reason"]
    assert len(read.samples) == len(lines) - 2


def test_aiter_rows_keep_their_kernels_and_unknown_parts_are_refused(tmp_path):
    report, store = imported(tmp_path, [AITER], "aiter-gemm")
    samples = store.read()
    assert set(samples["hardware"]) == {"MI355X"}
    assert set(samples.loc[samples["source_path"] == "a8w8_blockscale_tuned_gemm.csv", "dtype"]) == {"fp8_block"}
    rows = table_rows(AITER / "a8w8_blockscale_tuned_gemm.csv")
    first = rows[0]
    mine = samples[(samples["m"] == float(first["M"])) & (samples["n"] == float(first["N"]))
                   & (samples["k"] == float(first["K"])) & (samples["dtype"] == "fp8_block")]
    assert mine["duration_us"].iat[0] == float(first["us"]) and mine["kernel"].iat[0] == first["kernelName"]
    gfx1250 = [r for r in table_rows(AITER / "bf16_tuned_gemm.csv") if r["gfx"] == "gfx1250"]
    refused = [r for r in report["refused"] if "gfx1250" in r["reason"]]
    assert len(refused) == len(gfx1250) == 120 and all("gfx1250 M=" in r["row"] for r in refused)


def test_fused_moe_rows_need_a_part_and_become_two_grouped_gemms(tmp_path):
    source = AITER / "tuned_fmoe.csv"
    with pytest.raises(InputError, match="cu_num 80 names no single AMD part"):
        aiter_fmoe.read_file(source)
    read = aiter_fmoe.read_file(source, hardware="MI300X")
    rows = table_rows(source)
    one_stage = [i + 2 for i, r in enumerate(rows) if r["run_1stage"] == "1"]
    assert {r["line"] for r in read.refused if "one fused kernel" in r["reason"]} == set(one_stage)
    first = rows[0]
    stage1 = read.samples[read.samples["variant"].str.startswith("aiter fmoe stage1")].iloc[0]
    assert stage1["batch"] == float(first["expert"])
    assert stage1["m"] == float(first["token"]) * float(first["topk"]) / float(first["expert"])
    assert stage1["n"] == 2 * float(first["inter_dim"]) and stage1["k"] == float(first["model_dim"])
    assert stage1["duration_us"] == float(first["us1"])
    assert len(read.samples) == 2 * (len(rows) - len(read.refused))


def test_importing_again_adds_nothing_and_still_names_the_refused_rows(tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    shutil.copy(MATMUL / "mi300x_gfx942.csv", source)
    first, _ = imported(tmp_path, [source], "xla-gemm")
    again, store = imported(tmp_path, [source], "xla-gemm")
    assert first["files"][0]["written"] == 1125 and again["files"][0]["written"] == 0
    assert len(again["refused"]) == len(first["refused"]) == 376
    assert len(store.read()) == 1125


def test_readers_refuse_files_that_are_not_theirs(tmp_path):
    with pytest.raises(InputError, match="not an XLA GEMM table"):
        xla_gemm.read_file(COLLECTIVES)
    with pytest.raises(InputError, match="not an aiter tuned-GEMM file"):
        aiter_gemm.read_file(COLLECTIVES)
    result = runner.invoke(app, ["import", str(MATMUL), "--format", "xla-gem", "--store", str(tmp_path / "s")])
    assert result.exit_code == 2 and "did you mean 'xla-gemm'" in result.stderr
