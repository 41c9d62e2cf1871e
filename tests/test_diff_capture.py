"""`tracekit diff` / `tracekit validate` / the HTML report on one real 2-rank capture (reference trainer, TP=2,
gloo on this CPU), against a prediction made from models trained on that capture's own samples.

Facts are read independently of the code under test: ProfilerStep markers straight from the trace JSON, primitive
totals from `tracekit ingest --json`, the prediction from `tracekit predict --json`, the DOM from headless Chromium.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, dump_dom
from tracekit.reference.launch import launch_argv

TRACEKIT = [sys.executable, "-c", "from tracekit.cli import main; main()"]
MODEL = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, micro_batch_size=2,
             global_batch_size=4, vocab_size=1000, train_iters=6, log_interval=1)
TP = 2


def cli(*args, check: bool = True):
    """Run a tracekit command in this process (exit_code, stdout, stderr)."""
    from typer.testing import CliRunner

    from tracekit.cli import app

    done = CliRunner().invoke(app, [str(a) for a in args])
    if check:
        assert done.exit_code == 0, (done.stderr[-3000:], done.exception)
    return done


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    """One capture (ingested into its own store), its prediction and predicted traces. The models are a small real
    set (the seed paper's A100 QKV-GEMM samples): on this CPU the predictor falls back to its roofline of the
    measured CPU rates, which is what a user without CPU models gets."""
    from extractors.ett import read_file
    from predictor.costs.learned.training import train_models

    base = tmp_path_factory.mktemp("diffrun")
    out, store = base / "capture", base / "store"
    done = subprocess.run([*TRACEKIT, "capture", "--out", str(out), "--steps", "2-5", "--store", str(store), "--",
                           *launch_argv(2, **MODEL, tensor_model_parallel_size=TP)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    models = base / "models"
    samples = read_file(SAMPLES / "estimate-train-time" / "Perlmutter" / "operator" /
                        "NVIDIAA100-SXM4-80GB_linear1_fp16.csv")
    train_models(samples[samples["pass"] == "fwd"], models, folds=2)
    log = out / "train.log"
    predicted = base / "predicted"
    args = ["--megatron-log", log, "--hardware", manifest["hardware"], "--gpus-per-node", "2", "--models", models]
    prediction = json.loads(cli("predict", *args, "--trace-out", predicted, "--json").stdout)
    (base / "prediction.json").write_text(json.dumps(prediction))
    return {"base": base, "out": out, "store": store, "models": models, "manifest": manifest, "log": log,
            "predicted": predicted, "prediction": prediction, "prediction_file": base / "prediction.json",
            "traces": [out / t for t in manifest["traces"]], "args": args}


def _raw(path: Path) -> dict:
    import gzip

    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def _steps(path: Path) -> dict[int, float]:
    """ProfilerStep#N → duration (µs), read straight from the trace JSON (CPU annotation)."""
    out = {}
    for e in _raw(path)["traceEvents"]:
        name = str(e.get("name", ""))
        if name.startswith("ProfilerStep#") and e.get("cat") == "user_annotation":
            out[int(name.split("#")[1])] = float(e["dur"])
    return out


def _ingest_totals(paths: list[Path], store: Path) -> dict[str, dict[str, float]]:
    """Per-primitive count and time over the given traces, as `tracekit ingest --json` reports them."""
    doc = json.loads(cli("ingest", *paths, "--store", store, "--json").stdout)
    totals: dict[str, dict[str, float]] = {}
    for trace in doc["traces"]:
        for primitive, value in trace["primitives"].items():
            slot = totals.setdefault(primitive, {"count": 0.0, "time_us": 0.0})
            slot["count"] += value["count"]
            slot["time_us"] += value["time_us"]
    return totals


@pytest.fixture(scope="module")
def diff(run) -> dict:
    html = run["base"] / "report.html"
    done = cli("diff", run["predicted"], *run["traces"], "--json", "--html", html)
    return {"report": json.loads(done.stdout), "html": html}


def test_every_real_iteration_is_matched(run, diff):
    report = diff["report"]
    steps = {}
    for path in run["traces"]:
        rank = _raw(path)["distributedInfo"]["rank"]
        steps[rank] = _steps(path)
    assert sorted(a["rank"] for a in report["alignment"]) == sorted(steps) == [0, 1]
    predicted_steps = _steps(sorted(run["predicted"].glob("*.json.gz"))[0])  # pp = 1: one predicted trace
    for row in report["alignment"]:
        real = sorted(steps[row["rank"]])
        assert sorted(row["real_steps"] + row["dropped_steps"]) == real  # each step kept or named as warm-up
        assert [m[0] for m in row["matched"]] == row["real_steps"]
        assert {m[1] for m in row["matched"]} <= set(predicted_steps)
        assert row["predicted_rank"] == 0  # predicted traces hold the first rank of each stage (pp = 1: rank 0)
        # each matched pair carries both steps' durations, as the files have them
        for (real_step, pred_step), (real_s, pred_s) in zip(row["matched"], row["iteration_s"]):
            assert real_s == pytest.approx(steps[row["rank"]][real_step] / 1e6, rel=1e-6)
            assert pred_s == pytest.approx(predicted_steps[pred_step] / 1e6, rel=1e-6)
    # real iteration time: mean over the kept steps (and ranks) of the ProfilerStep durations in the files
    kept = [steps[a["rank"]][s] for a in report["alignment"] for s in a["real_steps"]]
    assert report["iteration_time_s"]["real"] == pytest.approx(sum(kept) / len(kept) / 1e6, rel=1e-6)
    # predicted iteration time: the predicted traces' steps, which are the prediction's iteration time
    pred = list(predicted_steps.values())
    assert report["iteration_time_s"]["predicted"] == pytest.approx(sum(pred) / len(pred) / 1e6, rel=1e-6)
    assert report["iteration_time_s"]["predicted"] == pytest.approx(run["prediction"]["iteration_time_s"], rel=0.01)


def test_primitive_totals_equal_what_ingest_reports(run, diff):
    report = diff["report"]
    real = _ingest_totals(run["traces"], run["base"] / "store-real")
    predicted = _ingest_totals(sorted(run["predicted"].glob("*.json.gz")), run["base"] / "store-pred")
    for side, expected in (("real", real), ("predicted", predicted)):
        got = report["totals"][side]
        assert set(got) == set(expected), side
        for primitive, value in expected.items():
            assert got[primitive]["count"] == value["count"], (side, primitive)
            assert got[primitive]["time_us"] == pytest.approx(value["time_us"], abs=0.01), (side, primitive)
    # TP=2 with sequence parallelism off: the real run's forward and backward all-reduces are there
    assert real["all_reduce"]["count"] > 0


def test_errors_and_contributors_add_up(run, diff):
    report = diff["report"]
    it = report["iteration_time_s"]
    assert it["error"] == pytest.approx(it["predicted"] - it["real"])
    for row in report["by_primitive"]:
        assert row["error_s"] == pytest.approx(row["predicted_s"] - row["real_s"])
    (stage,) = report["by_stage"]
    assert stage["ranks"] == [0, 1]
    assert stage["real_s"] == pytest.approx(sum(r["real_s"] for r in report["by_primitive"]))
    top = report["largest_contributors"]
    assert top and abs(top[0]["error_s"]) == max(abs(c["error_s"]) for c in top)
    assert re.match(r"^(forward|backward|optimizer|communication) \w+ on stage 0: [+−][\d.]+ (s|ms|µs)",
                    top[0]["text"])
    assert top[0]["share_of_error"] == pytest.approx(top[0]["error_s"] / it["error"])
    parts = ("compute", "exposed_communication", "pipeline_bubble", "optimizer", "other")
    real_parts = sum(report["breakdown"]["real"][p] for p in parts)
    assert real_parts == pytest.approx(it["real"], rel=1e-6)  # the breakdown splits the iteration, nothing else


def test_the_tables_add_up_and_compare_like_with_like(run, diff, tmp_path):
    """Per layer, per primitive and per pass are the same operator time cut three ways, so their rows add up to the
    same totals, the stage's operator time: before, the per-layer rows left out the real run's gloo collectives and
    backward (outside the layer ranges on a CPU run) but kept the prediction's collectives (inside them), so the rows
    were over-predicted while the total was under, and the real `Optimizer.step#Adam.step` range had no predicted
    counterpart (−100%) though the optimizer was predicted. The stage table shows the iteration time beside it."""
    doc = json.loads(cli("validate", run["out"], "--models", run["models"], "--json").stdout)
    (stage,) = doc["by_stage"]
    for side in ("real_s", "predicted_s"):
        for table in ("by_layer", "by_primitive", "by_pass"):
            assert sum(r[side] for r in doc[table]) == pytest.approx(stage[side], rel=1e-9), (table, side)
    optimizer = [r for r in doc["by_layer"] if r["real_s"] > 0 and "ptimizer" in r["layer"]]
    assert len(optimizer) == 1 and optimizer[0]["predicted_s"] > 0
    # a collective is the communication row on both sides, never a layer's
    comm = {p: sum(r[p] for r in doc["by_pass"] if r["pass"] == "comm") for p in ("real_s", "predicted_s")}
    (row,) = [r for r in doc["by_layer"] if r["layer"] == "(communication)"]
    assert row["real_s"] == pytest.approx(comm["real_s"]) and row["predicted_s"] == pytest.approx(comm["predicted_s"])
    out = cli("validate", run["out"], "--models", run["models"]).stdout
    stage_row = re.search(r"^│ 0 +│ +([\d.]+ m?s) +│ +([\d.]+ m?s) +│", out, re.M)
    from tracekit.report.numbers import seconds

    assert stage_row and stage_row.groups() == (seconds(stage["real_iteration_s"]),
                                                seconds(stage["predicted_iteration_s"])), out
    assert stage["real_iteration_s"] == pytest.approx(doc["iteration_time_s"]["real"])


def test_blocking_gloo_collectives_count_as_exposed_communication(run, diff):
    """The reference trainer's gloo collectives are synchronous: its caller op waits on the main thread while gloo's
    thread runs them, so (almost) all their time is exposed. Their union is computed here from the raw JSON."""
    report = diff["report"]
    per_step = []
    for path in run["traces"]:
        raw = _raw(path)
        rank = raw["distributedInfo"]["rank"]
        steps = {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"]) for e in raw["traceEvents"]
                 if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") == "user_annotation"}
        gloo = sorted((e["ts"], e["ts"] + e["dur"]) for e in raw["traceEvents"]
                      if str(e.get("name", "")).startswith("gloo:") and e.get("ph") == "X")
        kept = next(a["real_steps"] for a in report["alignment"] if a["rank"] == rank)
        for step in kept:
            lo, hi = steps[step]
            total, reach = 0.0, lo
            for start, end in gloo:
                start, end = max(start, reach, lo), min(end, hi)
                if end > start:
                    total += end - start
                    reach = end
            per_step.append(total / 1e6)
    union = sum(per_step) / len(per_step)
    exposed = report["breakdown"]["real"]["exposed_communication"]
    assert union > 0
    assert 0.9 * union <= exposed <= union * (1 + 1e-9)


def test_prediction_json_side(run):
    report = json.loads(cli("diff", run["prediction_file"], run["out"] / "tensorboard", "--json").stdout)
    prediction = run["prediction"]
    assert report["iteration_time_s"]["predicted"] == pytest.approx(prediction["iteration_time_s"])
    by_primitive = {r["primitive"]: r["predicted_s"] for r in report["by_primitive"]}
    expected: dict[str, float] = {}
    for op in prediction["operators"]:
        expected[op["primitive"]] = expected.get(op["primitive"], 0.0) + op["time_s"]
    for primitive, seconds in expected.items():
        assert by_primitive[primitive] == pytest.approx(seconds)
    assert report["breakdown"]["predicted"] == pytest.approx(prediction["breakdown"])


def test_html_renders_in_headless_chromium(run, diff, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "headless Chromium is required (Debian package `chromium`; .ci/run installs it)"
    done = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
         diff["html"].resolve().as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    report = diff["report"]
    for svg in ("timeline-real", "timeline-predicted", "chart-primitives", "chart-stages", "chart-breakdown"):
        assert re.search(rf'<svg[^>]*id="{svg}"', dom), svg
    shown = [r for r in report["by_primitive"] if r["real_s"] > 0 or r["predicted_s"] > 0]
    assert len(re.findall(r'<rect class="bar-real"', dom)) == len(shown)
    assert len(re.findall(r'<rect class="bar-predicted"', dom)) == len(shown)
    assert len(re.findall(r'<rect class="bar-stage"', dom)) == len(report["by_stage"]) == 1
    # the real timeline holds rank 0's first kept step: as many device events as ingest sees in it
    from extractors.kineto import read_trace

    rank0 = next(read_trace(p) for p in run["traces"] if _raw(p)["distributedInfo"]["rank"] == 0)
    first = report["alignment"][0]["real_steps"][0]
    expected = int((rank0.device_events["iteration"] == first).sum())
    real_svg = re.search(r'<svg[^>]*id="timeline-real".*?</svg>', dom, re.S).group(0)
    assert real_svg.count('<rect class="ev"') == expected > 0
    # self-contained: nothing fetched from anywhere
    assert not re.search(r'(src|href)="(https?:)?//', dom)


def test_the_largest_named_operators_lead_the_contributors(run, diff, tmp_path):
    """On a CPU run the largest cells of the error are the unclassified operators (`other`: communication, forward,
    backward), and the contributors were all such buckets: the page and the command list the named operators first,
    largest first, and sum the unclassified ones in one line after them."""
    report = diff["report"]
    cells = report["largest_contributors"]
    named = [c for c in cells if c["primitive"] != "other"]
    other = [c for c in cells if c["primitive"] == "other"]
    assert named and other  # this run has both
    dom = dump_dom(diff["html"], tmp_path / "profile")
    section = dom.split('Largest contributors to the error</h2>')[1].split("<h2")[0]
    items = re.findall(r"<li>([^<]+)</li>", section)
    assert items == [c["text"] for c in named]
    from tracekit.report.numbers import signed_seconds

    total = signed_seconds(sum(c["error_s"] for c in other))
    assert re.search(rf'<p id="unclassified-error">Unclassified operators [^<]*{re.escape(total)} of the error',
                     section)
    out = cli("diff", run["predicted"], *run["traces"]).stdout
    listed = out.split("largest contributors to the error:\n")[1].splitlines()
    assert [line.strip() for line in listed[:min(5, len(named))]] == [c["text"] for c in named[:5]]
    assert f"unclassified operators (other: what ingest could not name): {total} of the error" in out


def test_validate_run_is_predict_then_diff(run, diff, tmp_path):
    page = tmp_path / "validate.html"
    doc = json.loads(cli("validate", run["out"], "--models", run["models"], "--json", "--html", page).stdout)
    assert set(diff["report"]) <= set(doc)  # the same report shape as `tracekit diff --json`
    assert doc["iteration_time_s"]["real"] == pytest.approx(diff["report"]["iteration_time_s"]["real"])
    assert doc["totals"]["real"] == diff["report"]["totals"]["real"]
    # the manifest's configuration on its hardware and ranks per node: what `tracekit predict` says for the log
    assert doc["iteration_time_s"]["predicted"] == pytest.approx(run["prediction"]["iteration_time_s"])
    assert doc["breakdown"]["predicted"] == pytest.approx(run["prediction"]["breakdown"])
    assert '<svg id="chart-primitives"' in page.read_text().replace("'", '"')


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_validate_refit_reports_error_before_and_after(run, diff, tmp_path):
    models = tmp_path / "models"
    shutil.copytree(run["models"], models)
    given = _files(models)
    store = tmp_path / "store"
    first = json.loads(cli("validate", run["out"], "--models", models, "--json").stdout)
    doc = json.loads(cli("validate", run["out"], "--models", models, "--refit", "--store", store, "--json").stdout)
    # same shape as diff --json, and the same real side
    assert set(diff["report"]) <= set(doc)
    assert doc["iteration_time_s"]["real"] == pytest.approx(diff["report"]["iteration_time_s"]["real"])
    assert doc["totals"]["real"] == diff["report"]["totals"]["real"]
    refit = doc["refit"]
    assert refit["before"]["predicted_s"] == pytest.approx(doc["iteration_time_s"]["predicted"])
    assert refit["before"]["real_s"] == refit["after"]["real_s"] == doc["iteration_time_s"]["real"]
    # the refit's models go to a folder of their own beside the ones given, which stay byte for byte as they were:
    # validating with them again predicts what it did (the refit overwrote them, and the next run predicted anew)
    refitted = tmp_path / "models-refit"
    assert refit["samples_added"] > 0 and refit["models"] == str(refitted)
    assert _files(models) == given
    again = json.loads(cli("validate", run["out"], "--models", models, "--json").stdout)
    assert again["iteration_time_s"]["predicted"] == first["iteration_time_s"]["predicted"]
    # the run's samples, counted in the store: all new here (a refit after `capture` ingested them: 0 new, as the
    # getting-started test reads)
    assert refit["run_samples"] == refit["samples_added"] <= refit["store_samples"]
    after = json.loads(cli("validate", run["out"], "--models", refitted, "--json").stdout)
    assert not any("no models of" in w for w in after["warnings"])  # the refit made models of the run's hardware
    # --refit-out names the folder; the folder of the models given is refused, in one line, and left as it was
    chosen = tmp_path / "chosen"
    again = json.loads(cli("validate", run["out"], "--models", models, "--refit", "--refit-out", chosen, "--store",
                           tmp_path / "store-f", "--json").stdout)
    assert (chosen / "index.json").is_file() and again["refit"]["models"] == str(chosen)
    refused = cli("validate", run["out"], "--models", models, "--refit", "--refit-out", models, "--store", store,
                  check=False)
    assert refused.exit_code == 2 and len(refused.stderr.strip().splitlines()) == 1 and str(models) in refused.stderr
    assert _files(models) == given
    index = json.loads((refitted / "index.json").read_text())
    assert {m["hardware"] for m in index["models"]} == {json.loads(
        cli("ingest", *run["traces"], "--store", tmp_path / "s2", "--json").stdout)["traces"][0]["hardware"]}
    # "after" is what the retrained models predict for the run's configuration on its cluster
    from predictor.costs.learned.models import ModelSet
    from predictor.predict import predict
    from tracekit.capture.manifest import Manifest
    from tracekit.core.cluster import Cluster

    manifest = Manifest.load(run["out"])
    after = predict(manifest.config(), Cluster(manifest.hardware, gpus_per_node=2), ModelSet.load(refitted))
    assert refit["after"]["predicted_s"] == pytest.approx(after.iteration_time_s)
    printed = cli("validate", run["out"], "--models", models, "--refit", "--store", store).stdout
    assert f"refit models written to {refitted}/" in printed


def test_mismatched_configurations_are_refused(run, tmp_path):
    base = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--micro-batch-size", "2", "--vocab-size", "1000"]
    cases = (
        # TP=4 needs 4 ranks: refused on the world size, for predicted traces and a prediction JSON alike
        (["--tensor-model-parallel-size", "4", "--global-batch-size", "2"], "for 4 ranks, the real run has 2",
         "the prediction has TP=4, world size=4, the real run TP=2, world size=2"),
        # same 2 ranks but TP=1 × DP=2: the real run's process groups say TP=2 × DP=1
        (["--tensor-model-parallel-size", "1", "--global-batch-size", "4", "--world-size", "2"],
         "DP=2, the real run's DATA_PARALLEL_GROUP has 1 rank",
         "the prediction has TP=1, DP=2, the real run TP=2, DP=1"),
    )
    for i, (extra, trace_words, json_words) in enumerate(cases):
        pred = tmp_path / f"pred-{i}"
        argv = " ".join(base + extra)
        doc = cli("predict", "--megatron-args", argv, "--hardware", run["manifest"]["hardware"], "--gpus-per-node",
                  "2", "--models", run["models"], "--trace-out", pred, "--json").stdout
        (tmp_path / f"pred-{i}.json").write_text(doc)
        for predicted, words in ((pred, trace_words), (tmp_path / f"pred-{i}.json", json_words)):
            done = cli("diff", predicted, *run["traces"], check=False)
            assert done.exit_code == 2, done.stdout[-2000:]
            line = done.stderr.strip()
            assert len(line.splitlines()) == 1 and "configurations differ" in line and words in line, line


def test_non_trace_inputs_give_one_line(run, tmp_path):
    notes = tmp_path / "notes.json"
    notes.write_text('{"hello": 1}')
    done = cli("diff", notes, *run["traces"], check=False)
    assert done.exit_code == 2 and str(notes) in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = cli("diff", run["predicted"], run["log"], check=False)
    assert done.exit_code == 2 and str(run["log"]) in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = cli("validate", tmp_path, check=False)
    assert done.exit_code == 2 and "manifest.json" in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def pp_run(run) -> dict:
    """PP=2 on the same 2 ranks (4 micro-batches), predicted with the same models."""
    out = run["base"] / "capture-pp"
    done = subprocess.run([*TRACEKIT, "capture", "--out", str(out), "--steps", "2-5", "--no-ingest", "--",
                           *launch_argv(2, **{**MODEL, "global_batch_size": 8}, pipeline_model_parallel_size=2)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    predicted = run["base"] / "predicted-pp"
    hardware = json.loads((out / "manifest.json").read_text())["hardware"]
    cli("predict", "--megatron-log", out / "train.log", "--hardware", hardware, "--gpus-per-node", "2",
        "--models", run["models"], "--trace-out", predicted)
    return {"out": out, "predicted": predicted}


def test_a_warm_up_step_slow_on_one_rank_is_dropped_on_every_rank(run, tmp_path):
    """Rank 0's first profiled step made 3× longer (its ProfilerStep annotation starts earlier): that step is left
    out on both ranks, so the real iteration time and its breakdown cover the same steps."""
    traces = []
    for path in run["traces"]:
        doc = _raw(path)
        if doc["distributedInfo"]["rank"] == 0:
            steps = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")
                     and e.get("cat") == "user_annotation"]
            first = min(steps, key=lambda e: e["ts"])
            first["ts"] -= 2 * first["dur"]
            first["dur"] *= 3
        traces.append(tmp_path / path.name.replace(".gz", ""))
        traces[-1].write_text(json.dumps(doc))
    report = json.loads(cli("diff", run["predicted"], *traces, "--json").stdout)
    first_step = min(_steps(run["traces"][0]))
    assert [row["dropped_steps"] for row in report["alignment"]] == [[first_step], [first_step]]
    assert all(first_step not in row["real_steps"] for row in report["alignment"])
    parts = ("compute", "exposed_communication", "pipeline_bubble", "optimizer", "other")
    real = report["iteration_time_s"]["real"]
    assert sum(report["breakdown"]["real"][p] for p in parts) == pytest.approx(real, rel=1e-6)


def test_pipeline_stages_are_aligned_stage_by_stage(pp_run):
    # the real traces' folder sits in the capture run, whose manifest says pp = 2
    report = json.loads(cli("diff", pp_run["predicted"], pp_run["out"] / "tensorboard", "--json").stdout)
    assert [(s["stage"], s["ranks"]) for s in report["by_stage"]] == [(0, [0]), (1, [1])]
    assert sorted(p.name for p in pp_run["predicted"].glob("*.json.gz")) == ["rank-0.json.gz", "rank-1.json.gz"]
    assert [(a["rank"], a["predicted_rank"]) for a in report["alignment"]] == [(0, 0), (1, 1)]
    real = report["breakdown"]["real"]
    assert real["pipeline_bubble"] > 0  # stages wait on each other
    assert {c["stage"] for c in report["largest_contributors"]} <= {0, 1}
    # one rank per stage: the stages' times add up to twice the per-primitive means over the two ranks
    for side in ("real_s", "predicted_s"):
        assert sum(s[side] for s in report["by_stage"]) == pytest.approx(
            2 * sum(r[side] for r in report["by_primitive"]))


def _inside(e: dict, outer: dict) -> bool:
    return outer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"]


def _timed_events(events: list[dict], step: int = 1) -> list[dict]:
    """What a CPU run's trace times in one profiled step, read straight from the trace JSON: gloo's collectives and
    the operators no other operator on their thread encloses (the `c10d::` calls that only issue work aside)."""
    window = next(e for e in events if e.get("name") == f"ProfilerStep#{step}" and e.get("cat") == "user_annotation")
    ops = [(i, e) for i, e in enumerate(events) if e.get("cat") == "cpu_op" and _inside(e, window)]
    # o encloses e: it holds e's span on its thread, and is longer or, holding the same span, the one written first
    # (an op that starts where another ends, a zero-length one, is not inside it: the page draws it)
    top = [e for i, e in ops if not e["name"].startswith("c10d::") and not any(
        j != i and o["tid"] == e["tid"] and _inside(e, o) and e["ts"] < o["ts"] + o["dur"]
        and (o["dur"] > e["dur"] or j < i) for j, o in ops)]
    return top + [e for e in events if str(e.get("name", "")).startswith("gloo:") and _inside(e, window)]


def _annotated_op_time(path: Path, step: int = 1) -> dict[str, float]:
    """Per CPU `user_annotation` range of one profiled step (a layer), the time of the timed operators inside it
    (`_timed_events`; the innermost range holding each), read straight from the trace JSON."""
    events = _raw(path)["traceEvents"]
    window = next(e for e in events if e.get("name") == f"ProfilerStep#{step}" and e.get("cat") == "user_annotation")
    ranges = [e for e in events if e.get("cat") == "user_annotation" and not e["name"].startswith(("ProfilerStep#",
                                                                                                     "gloo:"))
              and _inside(e, window)]
    out: dict[str, float] = {}
    for op in _timed_events(events, step):
        holder = [r for r in ranges if r["tid"] == op["tid"] and _inside(op, r)]
        if holder:
            name = min(holder, key=lambda r: r["dur"])["name"]
            out[name] = out.get(name, 0.0) + op["dur"]
    return out


def test_validate_page_draws_the_predicted_timeline_layers_and_traces(run, tmp_path):
    """The validate page: the predicted lane holds what the predicted trace times in one iteration (counted in its
    JSON: a CPU run's operators and gloo collectives, as the predicted hardware is this CPU), the page links that
    trace, and per-layer predicted times are the operators inside the layer ranges."""
    page = tmp_path / "validate.html"
    doc = json.loads(cli("validate", run["out"], "--models", run["models"], "--json", "--html", page).stdout)
    traces = doc["predicted_traces"]
    assert [Path(p).name for p in traces] == ["rank-0.json.gz"] and Path(traces[0]).parent == tmp_path / \
        "validate-predicted"
    raw = _raw(Path(traces[0]))["traceEvents"]
    assert not [e for e in raw if e.get("cat") in ("kernel", "gpu_user_annotation", "cuda_runtime")]
    timed = _timed_events(raw)
    dom = dump_dom(page, tmp_path / "profile")
    lane = re.search(r'<svg[^>]*id="timeline-predicted".*?</svg>', dom, re.S).group(0)
    assert lane.count('<rect class="ev"') == len(timed) > 0
    assert re.search(r'<h2 id="predicted-traces">', dom)
    assert re.findall(r'<a href="([^"]+)"', dom) == ["validate-predicted/rank-0.json.gz"]
    # per layer: each row's predicted time is what the predicted trace's operators inside that range take
    expected = _annotated_op_time(Path(traces[0]))
    # the optimizer step's range (a CPU prediction's, like a CPU run's) is the table's `(optimizer step)` row
    optimizer = sum(v for k, v in expected.items() if k.startswith("Optimizer.step"))
    expected = {k: v for k, v in expected.items() if not k.startswith("Optimizer.step")}
    layers = {r["layer"]: r["predicted_s"] for r in doc["by_layer"] if r["predicted_s"] > 0
              and not r["layer"].startswith("(")}
    assert set(layers) == set(expected) >= {"embedding", "layer_0/attention", "layer_0/mlp", "layer_1/attention",
                                            "layer_1/mlp", "output_layer", "cross_entropy"}
    for name, seconds in layers.items():
        assert seconds == pytest.approx(expected[name] / 1e6, rel=1e-6), name
    step = next(r for r in doc["by_layer"] if r["layer"] == "(optimizer step)")
    assert optimizer > 0 and step["predicted_s"] == pytest.approx(optimizer / 1e6, rel=1e-6)
    # the real run names the same ranges (the reference trainer's record_function, torch's optimizer step range):
    # every one has a prediction
    real = {r["layer"] for r in doc["by_layer"] if r["real_s"] > 0 and not r["layer"].startswith("(")}
    assert real == set(layers)


def test_validate_without_models_of_the_hardware_says_so_in_one_line(run, tmp_path):
    """The run's models hold the A100 only: validate names the missing CPU models and the commands that make them,
    first among the warnings, one line on stderr; models trained on the run's hardware give no such line."""
    done = cli("validate", run["out"], "--models", run["models"])
    hardware = run["manifest"]["hardware"]
    lines = [line for line in done.stderr.splitlines() if f"no models of {hardware}" in line]
    assert len(lines) == 1 and "tracekit sample --device cpu" in lines[0] and "--refit" in lines[0]
    doc = json.loads(cli("validate", run["out"], "--models", run["models"], "--json").stdout)
    assert doc["warnings"][0].startswith(f"no models of {hardware} in {run['models']}")


def test_validate_pipeline_run_predicts_every_layer_the_run_names(pp_run, run, tmp_path):
    """PP=2: the predicted traces number the layers globally along the stages, as the run's ranges do."""
    doc = json.loads(cli("validate", pp_run["out"], "--models", run["models"], "--json", "--trace-out",
                         tmp_path / "pred").stdout)
    assert sorted(Path(p).name for p in doc["predicted_traces"]) == ["rank-0.json.gz", "rank-1.json.gz"]
    # the model's ranges and the optimizer step's; the schedule's own (pipeline/send_forward_recv_backward) are not
    # predicted
    real = {r["layer"] for r in doc["by_layer"] if r["real_s"] > 0 and not r["layer"].startswith(("(", "pipeline/"))}
    predicted = {r["layer"] for r in doc["by_layer"] if r["predicted_s"] > 0 and not r["layer"].startswith("(")}
    assert real == predicted and {"layer_0/attention", "layer_1/mlp"} <= predicted
