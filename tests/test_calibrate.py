"""`tracekit calibrate` on real 2-rank reference-trainer captures (gloo on this CPU): the measured times it fits to
are the log's unprofiled iterations, the fit lowers the error on those runs as `tracekit predict` reports it, the
written calibration predicts the same through `predict --calibration FILE`, and bad inputs fail with one line."""
from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tracekit.reference.launch import launch_argv

TRACEKIT = [sys.executable, "-c", "from tracekit.cli import main; main()"]
COMMON = dict(num_layers=2, seq_length=32, vocab_size=1000, train_iters=10, log_interval=1)
STEPS = "2-5"  # profiled: iterations 1-5 (profiler warm-up from 1); 6-10 run without it
RUNS = {
    "tp2": dict(hidden_size=64, num_attention_heads=4, micro_batch_size=2, global_batch_size=4,
                tensor_model_parallel_size=2),
    "pp2": dict(hidden_size=128, num_attention_heads=8, micro_batch_size=2, global_batch_size=8,
                pipeline_model_parallel_size=2),
    "dp2": dict(hidden_size=64, num_attention_heads=4, micro_batch_size=4, global_batch_size=8),
}


def cli(*args, check: bool = True):
    """Run a tracekit command in this process."""
    from typer.testing import CliRunner

    from tracekit.cli import app

    done = CliRunner().invoke(app, [str(a) for a in args])
    if check:
        assert done.exit_code == 0, (done.stderr[-3000:], done.exception)
    return done


def _capture(out: Path, store: Path, argv: list[str], steps: str = STEPS) -> None:
    done = subprocess.run([*TRACEKIT, "capture", "--out", str(out), "--steps", steps, "--store", str(store), "--",
                           *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _unprofiled_median_s(log: Path) -> float:
    """Median of the log's iterations 6.. (the ones after the profiled 1-5), read straight from the log lines."""
    times = {int(n): float(t) for n, t in re.findall(
        r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)", log.read_text())}
    assert sorted(times) == list(range(1, 11))
    return statistics.median(times[i] for i in range(6, 11)) / 1e3


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> dict:
    """Three captures (TP, PP, DP over 2 ranks) ingested into one store, models trained on it, calibration fitted."""
    base = tmp_path_factory.mktemp("calibrate")
    store, models = base / "store", base / "models"
    dirs = []
    for name, model in RUNS.items():
        dirs.append(base / name)
        _capture(dirs[-1], store, launch_argv(2, **COMMON, **model))
    cli("train", "--store", store, "--models-out", models, "--folds", "2", "--json")
    out = base / "cpu-cal.json"
    doc = json.loads(cli("calibrate", *dirs, "--models", models, "--calibration-out", out, "--json").stdout)
    return {"base": base, "dirs": dirs, "models": models, "out": out, "doc": doc}


def _predict_s(run_dir: Path, models: Path, *extra) -> float:
    manifest = json.loads((run_dir / "manifest.json").read_text())
    done = cli("predict", "--megatron-log", run_dir / "train.log", "--hardware", manifest["hardware"],
               "--gpus-per-node", "2", "--models", models, "--json", *extra)
    return json.loads(done.stdout)["iteration_time_s"]


def test_fits_to_the_unprofiled_iterations_of_each_log(fitted):
    rows = fitted["doc"]["fit"]["rows"]
    assert [r["label"] for r in rows] == [str(d) for d in fitted["dirs"]]
    for row, run_dir in zip(rows, fitted["dirs"]):
        assert row["measured_s"] == pytest.approx(_unprofiled_median_s(run_dir / "train.log"), rel=1e-9)


def test_calibration_lowers_the_error_predict_reports_and_loads_back(fitted):
    models, out = fitted["models"], fitted["out"]
    written = json.loads(out.read_text())
    assert written["fit"]["params"] == fitted["doc"]["fit"]["params"]
    before, after, measured = [], [], []
    for row, run_dir in zip(fitted["doc"]["fit"]["rows"], fitted["dirs"]):
        measured.append(_unprofiled_median_s(run_dir / "train.log"))
        before.append(_predict_s(run_dir, models))
        after.append(_predict_s(run_dir, models, "--calibration", out))
        # the file predicts what the fit computed in process
        assert after[-1] == pytest.approx(row["predicted_after_s"], rel=1e-9)
        assert before[-1] == pytest.approx(row["predicted_before_s"], rel=1e-9)

    def mape(pred):
        return statistics.mean(abs(p - m) / m for p, m in zip(pred, measured))

    if written["fit"]["params"]:
        # constants were fitted: the fit starts from a grid that holds the uncalibrated point and keeps its best
        # round, so on the runs it was fitted on it can only lower the error (by how much depends on the captures)
        assert mape(after) <= mape(before)
    else:  # the one-standard-error rule kept the models as they are (noisy captures): nothing changes
        assert after == before
    assert mape(after) == pytest.approx(written["fit"]["mape_in_sample"], rel=1e-9)


def test_auto_chooses_the_constants_by_their_real_held_out_error(fitted, tmp_path):
    """--params auto (the default): each candidate set's leave-one-out MAPE is what fitting it on two captures and
    predicting the third gives; the chosen set has the fewest constants among those within one standard error of
    the lowest; with three runs no set has more than two constants."""
    from predictor.sweeps.calibration_fit import CANDIDATE_PARAMS

    fit = fitted["doc"]["fit"]
    tried = fit["selection"]["candidates"]
    assert [row["params"] for row in tried] == [list(c) for c in CANDIDATE_PARAMS if len(c) <= 2]
    best = min(tried, key=lambda row: row["loo_mape"])
    chosen = next(row for row in tried if row["params"] == fit["params"])
    assert chosen["loo_mape"] <= best["loo_mape"] + best["loo_se"]
    assert all(len(row["params"]) >= len(chosen["params"]) for row in tried
               if row["loo_mape"] <= best["loo_mape"] + best["loo_se"])
    check = next(row for row in tried if len(row["params"]) == 2)
    dirs, errors = fitted["dirs"], []
    for out in range(len(dirs)):
        cal = tmp_path / f"loo-{out}.json"
        cli("calibrate", *[d for i, d in enumerate(dirs) if i != out], "--models", fitted["models"],
            "--params", ",".join(check["params"]), "--calibration-out", cal, "--json")
        measured = _unprofiled_median_s(dirs[out] / "train.log")
        errors.append(abs(_predict_s(dirs[out], fitted["models"], "--calibration", cal) - measured) / measured)
    assert statistics.mean(errors) == pytest.approx(check["loo_mape"], rel=1e-6)
    # no constants: the held-out error is the models' own error on each run
    none = next(row for row in tried if row["params"] == [])
    uncalibrated = [abs(_predict_s(d, fitted["models"]) - _unprofiled_median_s(d / "train.log"))
                    / _unprofiled_median_s(d / "train.log") for d in dirs]
    assert none["loo_mape"] == pytest.approx(statistics.mean(uncalibrated), rel=1e-6)


def test_auto_keeps_the_models_as_they_are_when_no_constant_predicts_better(fitted):
    """Runs the models already predict exactly: no candidate set beats none, so none is fitted."""
    from predictor.costs.learned.models import ModelSet
    from predictor.predict import prepare_many
    from predictor.sweeps.calibration_fit import fit_calibration, iteration_times_s
    from tracekit.cli.calibrate import measured_run
    from tracekit.core.calibration import NONE

    runs = [measured_run(d) for d in fitted["dirs"]]
    models = ModelSet.load(fitted["models"])
    configs, clusters = [r[0] for r in runs], [r[1] for r in runs]
    exact = iteration_times_s(prepare_many(configs, clusters, models), NONE)
    cal = fit_calibration(configs, clusters, exact, models, params="auto")
    assert cal.fit["params"] == [] and cal.fit["constants"] == {}
    assert cal.values() == NONE.values()
    assert cal.fit["mape_in_sample"] == pytest.approx(0.0, abs=1e-12)


def test_auto_fits_the_constant_that_explains_the_runs(fitted):
    """Runs that take the models' times plus 50 µs per compute operator: only op_overhead_us predicts every run
    left out exactly, so it is chosen (alone) and fitted to 50."""
    from predictor.costs.learned.models import ModelSet
    from predictor.predict import prepare_many
    from predictor.sweeps.calibration_fit import fit_calibration, iteration_times_s
    from tracekit.cli.calibrate import measured_run
    from tracekit.core.calibration import NONE

    runs = [measured_run(d) for d in fitted["dirs"]]
    models = ModelSet.load(fitted["models"])
    configs, clusters = [r[0] for r in runs], [r[1] for r in runs]
    slower = iteration_times_s(prepare_many(configs, clusters, models), NONE.with_values(op_overhead_us=50.0))
    cal = fit_calibration(configs, clusters, slower, models, params="auto")
    assert cal.fit["params"] == ["op_overhead_us"]
    assert cal.op_overhead_us == pytest.approx(50.0, rel=1e-3)


def test_per_operator_overhead_is_paid_once_per_compute_operator(fitted, tmp_path):
    """op_overhead_us (framework time between operators that nothing hides on a CPU) lengthens a DP run's iteration
    by exactly its value × the forward and backward operator instances `predict` lists for it."""
    run_dir = fitted["dirs"][2]  # dp2: one stage, no pipeline to overlap the added time
    cal = tmp_path / "per-op.json"
    cal.write_text(json.dumps({"name": "per-op", "op_overhead_us": 100.0}))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    args = ["predict", "--megatron-log", run_dir / "train.log", "--hardware", manifest["hardware"], "--gpus-per-node",
            "2", "--models", fitted["models"], "--json"]
    before = json.loads(cli(*args).stdout)
    after = json.loads(cli(*args, "--calibration", cal).stdout)
    instances = sum(op["count"] for op in before["operators"] if op["pass"] in ("fwd", "bwd"))
    assert instances > 20
    assert after["iteration_time_s"] - before["iteration_time_s"] == pytest.approx(instances * 100e-6, rel=1e-6)


def test_table_output_names_every_run(fitted):
    done = cli("calibrate", *fitted["dirs"], "--models", fitted["models"], "--params", "comm_scale,host_op_us")
    for run_dir in fitted["dirs"]:
        assert run_dir.name in done.stdout
    assert "MAPE" in done.stdout and "comm_scale" in done.stdout


def test_bad_inputs_fail_with_one_line(fitted, tmp_path):
    dirs, models = fitted["dirs"], fitted["models"]
    # fewer runs than constants, or too few to choose them
    done = cli("calibrate", *dirs[:2], "--models", models, "--params", "host_op_us,comm_scale,microbatch_overhead_us",
               check=False)
    assert done.exit_code == 2 and "2 measured run(s) cannot determine 3 constants" in done.stderr
    assert done.stderr.count("\n") == 1
    done = cli("calibrate", *dirs[:2], "--models", models, check=False)
    assert done.exit_code == 2 and "needs at least 3 measured runs (have 2)" in done.stderr
    assert done.stderr.count("\n") == 1
    # not a capture folder
    done = cli("calibrate", tmp_path, "--models", models, check=False)
    assert done.exit_code == 2 and str(tmp_path) in done.stderr and "not a capture folder" in done.stderr
    # an unknown constant
    done = cli("calibrate", *dirs, "--params", "comm_scale,warp_factor", check=False)
    assert done.exit_code == 2 and "warp_factor" in done.stderr
    # a failed run (the launch command exits 3)
    failed = tmp_path / "failed"
    subprocess.run([*TRACEKIT, "capture", "--out", str(failed), "--no-ingest", "--", sys.executable, "-c",
                    "import sys; sys.exit(3)"], capture_output=True, text=True, timeout=120)
    done = cli("calibrate", failed, "--models", models, "--params", "comm_scale", check=False)
    assert done.exit_code == 2 and "failed (exit code 3)" in done.stderr
    # every iteration profiled: nothing measured without the profiler
    profiled = tmp_path / "profiled"
    _capture(profiled, tmp_path / "store", launch_argv(2, **{**COMMON, "train_iters": 5}, **RUNS["dp2"]))
    done = cli("calibrate", dirs[0], profiled, "--models", models, "--params", "comm_scale", "--calibration-out",
               tmp_path / "never.json", check=False)
    assert done.exit_code == 2 and "no measured iteration times" in done.stderr and str(profiled) in done.stderr
    assert not (tmp_path / "never.json").exists()
