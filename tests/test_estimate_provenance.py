"""What a prediction rests on: one line above the answer, in the tables' names, each kind of operator once, whose
parts add up to the operator time the `operators` table holds; `--json` carries it structured."""
from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from tests.conftest import TRACES
from tracekit.cli import app

DEMO = TRACES / "configs" / "llemma-7b-a100.yaml"
H100_JOB = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --micro-batch-size 1 "
            "--global-batch-size 64 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --bf16 --swiglu "
            "--normalization RMSNorm --position-embedding-type rope")


def run(*argv: str):
    done = CliRunner().invoke(app, ["predict", *argv])
    assert done.exit_code == 0, done.output
    return done


@pytest.fixture(scope="module")
def demo():
    """The demo's prediction (`make demo`): as JSON and as the table people read."""
    args = (str(DEMO), "--hardware", "A100-SXM4-80GB", "--gpus-per-node", "4")
    return json.loads(run(*args, "--json").stdout), run(*args)


@pytest.fixture(scope="module")
def h100():
    args = ("--megatron-args", H100_JOB, "--hardware", "H100-80GB-HBM3", "--gpus", "16")
    return json.loads(run(*args, "--json").stdout), run(*args)


def _module_paths(doc: dict) -> set[str]:
    """Every operator name the tables print (top operators), made kind names (numbered families as `*`)."""
    return {re.sub(r"(?<=bucket)\d+|(?<=\.)\d+(?=\.|$)", "*", op["name"]) for op in doc["top_operators"]}


@pytest.mark.parametrize("case", ["demo", "h100"])
def test_the_parts_add_up_to_the_operator_time_each_kind_once(case, request):
    doc, _ = request.getfixturevalue(case)
    estimates = doc["estimates"]
    # the operator time of an average GPU: the `operators` table's per-stage times, averaged over the stages
    stages = {op["stage"] for op in doc["operators"]}
    total = sum(op["time_s"] for op in doc["operators"]) / len(stages)
    assert estimates["operator_time_s"] == pytest.approx(total, rel=1e-9)
    parts = estimates["parts"]
    assert sum(p["time_s"] for p in parts) == pytest.approx(total, rel=1e-9)
    assert sum(p["share"] for p in parts) == pytest.approx(1.0)
    assert len({(p["path"], p["out_of_range"]) for p in parts}) == len(parts)  # each way of estimating once
    for part in parts:
        assert len(part["operators"]) == len(set(part["operators"]))  # each kind of operator once
        assert not [n for n in part["operators"] if re.fullmatch(r"linear\d|linear_final|flash_atten|allreduce", n)]
    fallen = [p for p in parts if (p["path"], p["out_of_range"]) != ("model", False)]
    # the fallbacks list: one entry per kind, its time the fallback parts' (each spec in exactly one of them)
    kinds = [(f["primitive"], f["pass"], f["variant"], f["path"], f["out_of_range"]) for f in doc["fallbacks"]]
    assert len(kinds) == len(set(kinds))
    assert sum(f["time_s"] for f in doc["fallbacks"]) == pytest.approx(sum(p["time_s"] for p in fallen), rel=1e-9)
    # the tables' own names: the busiest operators that fell back are listed under their module paths
    listed = {n for p in fallen for n in p["operators"]}
    top = {n for n in _module_paths(doc) if any(n == m for m in listed)}
    assert top, "no operator of the top table is named among the fallbacks"


def test_the_demo_names_the_link_model_once_at_the_top(demo):
    doc, table = demo
    physics = [p for p in doc["estimates"]["parts"] if p["path"] == "physics"]
    assert len(physics) == 1 and "loss.report_all_reduce" in physics[0]["operators"]
    lines = table.stdout.splitlines()
    headline = next(i for i, line in enumerate(lines) if line.startswith("32 layers × h4096"))
    line = lines[headline + 1]
    assert line.startswith("estimates: ") and line.count("from the collectives' link model") == 1
    assert "allreduce" not in line and "operator kinds" not in table.output and "fallbacks:" not in table.output
    assert "iteration time" in lines[headline + 2]  # the answer follows the line
    # the warnings of `--json` carry the same line, which the table does not repeat below the answer
    assert line in doc["warnings"] and table.output.count(line) == 1


def test_a_plain_h100_job_says_which_gpus_its_transfer_came_from(h100):
    doc, table = h100
    transfer = next(p for p in doc["estimates"]["parts"] if p["path"] == "transfer")
    assert transfer["sources"] and "H100-80GB-HBM3" not in transfer["sources"]
    from predictor import ModelSet

    assert set(transfer["sources"]) <= set(ModelSet.load(None).hardware_ids())  # GPUs with models of their own
    assert "mlp.linear_fc1" in transfer["operators"]  # the backward GEMMs, which H100's models do not hold
    line = next(line for line in table.stdout.splitlines() if line.startswith("estimates: "))
    assert f"transferred from the models of {', '.join(transfer['sources'])} (mlp." in line
    assert table.stdout.index(line) < table.stdout.index("iteration time")
    assert not re.search(r"\blinear[1-4]\b", line)
