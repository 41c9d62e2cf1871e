"""`tracekit import --format ett` on the seed paper's real CSVs: shapes per the corpus README's formulas (computed
here independently from the raw rows), idempotence, and all-or-nothing rejection of corrupted copies."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import SAMPLES
from tracekit.cli import app
from tracekit.core.store import SampleStore

ETT = SAMPLES / "estimate-train-time"
A100_OP = ETT / "Perlmutter" / "operator"
runner = CliRunner()


def raw_rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(handle)]


def run_import(*args: str):
    return runner.invoke(app, ["import", *args])


@pytest.fixture()
def tree(tmp_path) -> Path:
    """A small copy of the seed paper's tree: a few operator files, one NCCL file and a fit summary."""
    root = tmp_path / "ett"
    for rel in ("Perlmutter/operator/NVIDIAA100-SXM4-80GB_linear1_fp16.csv",
                "Perlmutter/operator/NVIDIAA100-SXM4-80GB_linear_final_fp16.csv",
                "Perlmutter/operator/NVIDIAA100-SXM4-80GB_flash_atten_fp16.csv",
                "Perlmutter/operator/NVIDIAA100-SXM4-80GB.csv",
                "Vista/operator/NVIDIAGH200120GB_firstStage_optimizer_fp16.csv",
                "Vista/nccl/NVIDIAGH200120GB_allgather_large_fp16_4_1.csv"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ETT / rel, root / rel)
    return root


def test_shapes_follow_the_readme_formulas(tree, tmp_path):
    store = tmp_path / "store"
    result = run_import(str(tree), "--format", "ett", "--store", str(store), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert len(report["skipped_fit_summaries"]) == 1 and report["errors"] == []
    samples = SampleStore(store).read()

    linear1 = samples[samples["variant"] == "linear1"]
    raw = raw_rows(tree / "Perlmutter/operator/NVIDIAA100-SXM4-80GB_linear1_fp16.csv")
    assert len(linear1) == 2 * len(raw)  # one forward and one backward sample per row
    expected = sorted((r["l"] * r["b"], 3 * r["dim"] / r["mp"], r["dim"], r["F_dur(us)"]) for r in raw)
    fwd = linear1[linear1["pass"] == "fwd"]
    assert sorted(zip(fwd["m"], fwd["n"], fwd["k"], fwd["duration_us"])) == expected
    assert set(linear1["hardware"]) == {"A100-SXM4-80GB"} and set(linear1["primitive"]) == {"gemm"}

    final = samples[(samples["variant"] == "linear_final") & (samples["pass"] == "bwd")]
    raw = raw_rows(tree / "Perlmutter/operator/NVIDIAA100-SXM4-80GB_linear_final_fp16.csv")
    padded = [-(-50257 // (128 * int(r["mp"]))) * 128 * int(r["mp"]) for r in raw]
    assert sorted(zip(final["n"], final["duration_us"])) == sorted(
        (p / r["mp"], r["B_dur(us)"]) for p, r in zip(padded, raw))

    attn = samples[(samples["variant"] == "flash_atten") & (samples["pass"] == "fwd")]
    raw = raw_rows(tree / "Perlmutter/operator/NVIDIAA100-SXM4-80GB_flash_atten_fp16.csv")
    assert sorted(zip(attn["batch"], attn["heads"], attn["seq"], attn["head_dim"])) == sorted(
        (r["b"], r["h"] / r["mp"], r["l"], r["dim"] / r["h"]) for r in raw)
    assert set(attn["primitive"]) == {"attention"}

    opt = samples[samples["variant"] == "firstStage_optimizer"]
    assert set(opt["pass"]) == {"optimizer"} and set(opt["hardware"]) == {"GH200-120GB"}

    coll = samples[samples["primitive"] == "all_gather"]
    raw = raw_rows(tree / "Vista/nccl/NVIDIAGH200120GB_allgather_large_fp16_4_1.csv")
    assert sorted(coll["bytes"]) == sorted(2 * r["shape"] for r in raw)
    assert set(coll["group_size"]) == {4.0} and set(coll["nodes"]) == {4.0} and set(coll["ranks_per_node"]) == {1.0}
    assert set(coll["pass"]) == {"comm"} and set(coll["variant"]) == {"allgather_large"}


def test_import_is_idempotent(tree, tmp_path):
    store = tmp_path / "store"
    first = run_import(str(tree), "--format", "ett", "--store", str(store), "--json")
    rows = len(SampleStore(store).read())
    second = run_import(str(tree), "--format", "ett", "--store", str(store), "--json")
    assert first.exit_code == second.exit_code == 0
    assert sum(f["written"] for f in json.loads(second.stdout)["files"]) == 0
    assert len(SampleStore(store).read()) == rows


def test_a_malformed_row_rejects_the_whole_file(tree, tmp_path):
    bad = tree / "Perlmutter/operator/NVIDIAA100-SXM4-80GB_linear1_fp16.csv"
    lines = bad.read_text().splitlines()
    fields = lines[6].split(",")
    fields[3] = "n/a"  # line 7 of the file: dim = n/a
    lines[6] = ",".join(fields)
    bad.write_text("\n".join(lines) + "\n")
    store = tmp_path / "store"
    result = run_import(str(tree), "--format", "ett", "--store", str(store))
    assert result.exit_code == 1  # the other files were imported
    assert "NVIDIAA100-SXM4-80GB_linear1_fp16.csv: line 7" in result.stderr
    assert "linear1" not in set(SampleStore(store).read()["variant"])

    only_bad = tmp_path / "only"
    only_bad.mkdir()
    shutil.copy(bad, only_bad / bad.name)
    store2 = tmp_path / "store2"
    result = run_import(str(only_bad), "--format", "ett", "--store", str(store2))
    assert result.exit_code == 2
    assert SampleStore(store2).read().empty


def test_missing_column_and_bad_name_are_reported(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "NVIDIAA100-SXM4-80GB_gelu_fp16.csv").write_text("mp,b,l,F_dur(us),B_dur(us)\n1,2,1024,10,20\n")
    (src / "notes_about_runs.csv").write_text("a,b\n1,2\n")
    result = run_import(str(src), "--format", "ett", "--store", str(tmp_path / "s"))
    assert result.exit_code == 2
    assert "missing column(s) ['dim']" in result.stderr
    assert "notes_about_runs.csv: not a sample file name" in result.stderr
