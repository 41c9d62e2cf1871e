"""`tracekit validate --published` and `tracekit predict --batch` are one code path (`predictor.predict_rows`): on
every e2e file of the corpus they predict the same rows, row for row, and fail the same ones."""
from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from tests.conftest import E2E
from tracekit.cli import app

runner = CliRunner()


@pytest.mark.parametrize("name", sorted(p.name for p in E2E.glob("*.csv")))
def test_validate_published_predicts_every_row_as_predict_batch_does(name, tmp_path):
    path = E2E / name
    out = tmp_path / "predicted.csv"
    batch = runner.invoke(app, ["predict", "--batch", str(path), "--csv-out", str(out), "--json"])
    assert batch.exit_code in (0, 1), batch.output  # 1: some rows are not predicted (named in the output)
    with open(out, newline="") as fh:
        written = list(csv.DictReader(fh))
    predicted = {i + 2: float(r["predicted_iteration_time_s"]) for i, r in enumerate(written) if not r["error"]}
    refused = {i + 2 for i, r in enumerate(written) if r["error"]}
    scored = runner.invoke(app, ["validate", "--published", str(path), "--json"])
    assert scored.exit_code in (0, 1), scored.output
    doc = json.loads(scored.stdout)
    assert {r["line"]: r["predicted_s"] for r in doc["rows"]} == pytest.approx(predicted, rel=1e-5)  # CSV: 6 digits
    assert {f["line"] for f in doc["failed"]} == refused
    assert doc["calibration"] == json.loads(batch.stdout)["calibration"] == "stack profiles"
    # the error arithmetic is against the measured column, row by row
    measured = {i + 2: float(r["iteration_time_s"]) for i, r in enumerate(written)}
    for row in doc["rows"]:
        assert row["measured_s"] == measured[row["line"]]
        assert row["ape"] == pytest.approx(abs(row["predicted_s"] - row["measured_s"]) / row["measured_s"], rel=1e-12)
