"""`tracekit capture` on real 2-rank reference-trainer runs (gloo on this CPU): manifest, trace locations for both
Megatron layouts, exit-code pass-through, and the collectives ingest finds (sizes computed from the configuration)."""
from __future__ import annotations

import gzip
import json
import re
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tracekit.capture import Manifest, capture
from tracekit.capture.manifest import LOG_NAME
from tracekit.capture.megatron_version import MegatronVersion, megatron_version
from tracekit.reference.launch import launch_argv, megatron_flags

TRACEKIT = [sys.executable, "-c", "from tracekit.cli import main; main()"]
MODEL = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, micro_batch_size=2,
             vocab_size=1000, train_iters=7, log_interval=1)
STEPS = "2-5"  # three active steps


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TRACEKIT, *args], capture_output=True, text=True, timeout=300)


def _load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return json.load(handle)


def _log_times(log: Path) -> list[float]:
    """Iteration times read straight from the log lines (independent of tracekit's parser)."""
    return [float(m) for m in re.findall(r"elapsed time per iteration \(ms\): ([\d.]+)", log.read_text())]


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, Path]:
    """TP=2 (fp32, global batch 4 → 2 micro-batches), Megatron ≤ 0.16 layout, through the CLI, ingesting."""
    out = tmp_path_factory.mktemp("tp") / "capture"
    store = out.parent / "store"
    argv = launch_argv(2, **MODEL, global_batch_size=4, tensor_model_parallel_size=2)
    done = _cli("capture", "--out", str(out), "--steps", STEPS, "--store", str(store), "--", *argv)
    return out, done, store


@pytest.fixture(scope="module")
def pp_run(tmp_path_factory) -> tuple[Path, Manifest]:
    """PP=2 bf16 (4 micro-batches), Megatron ≥ 0.17 layout, through the library function, ingesting."""
    out = tmp_path_factory.mktemp("pp") / "capture"
    argv = launch_argv(2, **MODEL, global_batch_size=8, pipeline_model_parallel_size=2, bf16=True)
    return out, capture(out, argv, steps=STEPS, layout="torch_profile", store=out.parent / "store", echo=False)


def test_tp_manifest_holds_the_configuration_and_the_logged_times(tp_run):
    out, done, _ = tp_run
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["exit_code"] == 0
    config = manifest["configuration"]
    assert manifest["configuration_source"] == "log"
    for name, value in MODEL.items():
        if name in config:
            assert config[name] == value, name
    assert config["tensor_model_parallel_size"] == 2 and config["global_batch_size"] == 4
    assert config["ffn_hidden_size"] == 4 * 64          # Megatron's default 4h
    assert config["data_parallel_size"] == 2 // (2 * 1)  # world / (tp·pp)
    assert config["precision"] == "fp32"
    assert manifest["world_size"] == 2 and manifest["topology"]["ranks_per_node"] == 2
    times = _log_times(out / "train.log")
    assert len(times) == MODEL["train_iters"]
    assert manifest["iteration_times_ms"] == times
    assert manifest["iterations"] == list(range(1, MODEL["train_iters"] + 1))
    assert "elapsed time per iteration" in done.stdout  # the command's output passed through
    assert manifest["software"]["torch"].startswith("2.")


def test_tp_traces_land_where_megatron_016_puts_them(tp_run):
    out, _, _ = tp_run
    traces = sorted((out / "tensorboard").iterdir())
    host = re.escape(socket.gethostname())
    assert len(traces) == 2 and all(re.fullmatch(rf"{host}_\d+\.\d+\.pt\.trace\.json", p.name) for p in traces)
    manifest = Manifest.load(out)
    ranks = set()
    for path in traces:
        trace = _load(path)
        ranks.add(trace["distributedInfo"]["rank"])
        names = {e["name"] for e in trace["traceEvents"]}
        steps = {int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#")}
        assert steps == {2, 3, 4}  # Megatron numbers profiler steps by iteration: START..END-1
        assert steps < set(manifest.profiled_iterations)  # so the manifest knows which times the profiler slowed
        assert {"layer_0/attention", "layer_1/mlp", "embedding", "output_layer"} <= names
        assert trace.get("record_shapes") in (1, True) or any("Input Dims" in e.get("args", {})
                                                             for e in trace["traceEvents"])
    assert ranks == {0, 1}


def test_tp_trace_all_reduces_have_the_activation_size(tp_run):
    """Fact of the trace: each layer's TP all-reduces move [seq, micro_batch, hidden] activations."""
    out, _, _ = tp_run
    trace = _load(next((out / "tensorboard").iterdir()))
    dims = [e["args"]["Input Dims"][0][0] for e in trace["traceEvents"]
            if e.get("name") == "c10d::allreduce_" and e.get("args", {}).get("Input Dims")]
    activation = [MODEL["seq_length"], MODEL["micro_batch_size"], MODEL["hidden_size"]]
    # per micro-batch: 2 layers × 2 row-parallel outputs + embedding = 5 forward, 2 layers × 2 column-parallel
    # inputs + LM head input = 5 backward; 2 micro-batches per step, 3 profiled steps
    assert dims.count(activation) == 3 * 2 * (5 + 5)


def test_tp_ingest_finds_the_tp_collectives_with_bytes_from_the_configuration(tp_run):
    out, done, store_dir = tp_run
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["ingest"]["status"] == "ok", manifest["ingest"]
    assert done.returncode == 0, done.stderr[-2000:]
    from tracekit.core.store import SampleStore

    samples = SampleStore(store_dir).read(primitive="all_reduce")
    activation_bytes = MODEL["seq_length"] * MODEL["micro_batch_size"] * MODEL["hidden_size"] * 4  # fp32
    tp = samples[samples["bytes"] == activation_bytes]
    assert len(tp) == 2 * 3 * 2 * (5 + 5)  # both ranks, see the trace test
    assert set(tp["group_size"]) == {2.0}
    assert set(samples["hardware"]) == {manifest["hardware"]}  # the CPU named in the trace = the manifest's


def test_tp_backward_gemms_carry_the_shapes_of_their_forward_linears(tp_run):
    """A CPU trace's backward nodes (AddmmBackward0, MmBackward0) have no shapes of their own; linked to their
    forward op by the autograd sequence number, each is the whole backward of one linear, keyed by its forward
    [tokens, in] × [in, out] shape (the convention of sampled bwd rows)."""
    from tracekit.core.store import SampleStore

    _, _, store_dir = tp_run
    gemms = SampleStore(store_dir).read(primitive="gemm")
    bwd = gemms[gemms["pass"] == "bwd"]
    tokens, h, tp = MODEL["seq_length"] * MODEL["micro_batch_size"], MODEL["hidden_size"], 2
    ffn, vocab = 4 * h, 1024  # Megatron's defaults: 4h, vocab padded to a multiple of 128 × tp
    linears = {(tokens, h, 3 * h // tp), (tokens, h // tp, h), (tokens, h, ffn // tp), (tokens, ffn // tp, h),
               (tokens, h, vocab // tp)}  # QKV, proj, fc1, fc2 (per layer), LM head
    assert set(zip(bwd["m"], bwd["k"], bwd["n"])) == linears
    # per micro-batch 2 layers × 4 linears + the LM head; 2 micro-batches, 3 profiled steps, 2 ranks
    assert len(bwd) == (2 * 4 + 1) * 2 * 3 * 2


def test_the_optimizer_steps_aten_ops_carry_no_step_shape(tp_run):
    """An optimizer sample is one whole step keyed by its parameter count; the ~3 µs aten ops a CPU trace records
    inside `Optimizer.step` are pieces of it and must not train that model as if each were a step."""
    from tracekit.core.store import SampleStore

    _, _, store_dir = tp_run
    steps = SampleStore(store_dir).read(primitive="optimizer")
    assert len(steps) > 50  # every aten op of Adam's step, both ranks, 3 steps
    assert steps[["params", "layers", "width", "tp", "numel", "rows"]].isna().all().all()


def test_views_move_no_data_and_are_not_elementwise_samples(tp_run):
    """aten::view / t / transpose / permute / expand / slice (and their backward nodes) take a few µs of framework
    time on a CPU trace; they must not train the elementwise model beside real adds and dropouts."""
    from extractors.kineto import read_trace

    out, _, _ = tp_run
    views = re.compile(r"^aten::(view|t|transpose|permute|expand|slice|empty)$|"
                       r"(View|T|Transpose|Permute|Expand)Backward0$")
    seen = 0
    for path in (out / "tensorboard").iterdir():
        events = read_trace(path).device_events
        events = events[events["pass"].isin(["fwd", "bwd"])]  # the optimizer step's ops are all `optimizer`
        is_view = events["name"].map(lambda name: bool(views.search(name)))
        seen += int(is_view.sum())
        assert set(events.loc[is_view, "primitive"]) == {"other"}
        assert set(events.loc[events["name"].isin(["aten::add", "aten::dropout"]), "primitive"]) == {"elementwise"}
    assert seen > 100


def test_gloo_reduce_scatters_are_ingested_as_the_reduce_scatters_issued(tmp_path):
    """With sequence parallelism, each `c10d::_reduce_scatter_base_` runs on gloo's worker thread as a
    `gloo:all_reduce` of the whole [seq, mb, h] buffer; ingest records it as a reduce-scatter of the output shard
    [seq / tp, mb, h], one per issuing call (counted in the raw JSON)."""
    from extractors.kineto import read_trace

    out = tmp_path / "capture"
    argv = launch_argv(2, **dict(MODEL, train_iters=6), global_batch_size=4, tensor_model_parallel_size=2,
                       sequence_parallel=True)
    manifest = capture(out, argv, steps="2-5", ingest=False, echo=False)
    assert manifest.status == "ok"
    seq, mb, h = MODEL["seq_length"], MODEL["micro_batch_size"], MODEL["hidden_size"]
    for name in manifest.traces:
        issued = sum(e.get("name") == "c10d::_reduce_scatter_base_" for e in _load(out / name)["traceEvents"])
        comm = read_trace(out / name).device_events.query("category == 'communication'")
        scatter = comm[comm["primitive"] == "reduce_scatter"]
        assert issued > 0 and len(scatter) == issued
        assert set(scatter["bytes"]) == {seq // 2 * mb * h * 4} and set(scatter["group_size"]) == {2.0}
        assert seq * mb * h * 4 not in set(comm.loc[comm["primitive"] == "all_reduce", "bytes"])


def test_gloo_collective_samples_span_what_the_calling_thread_waited(tp_run):
    """gloo works on its own thread while the c10d:: call's thread waits: each all-reduce is tied to the call that
    issued it (its start is one of the raw JSON's c10d::allreduce_ events, each used once), and its sample spans
    from that call to the caller's next operator — at least the queueing plus the work, as `tracekit sample` times a
    call. A capture folder ingests without complaint about its manifest."""
    from extractors.kineto import read_trace
    from extractors.kineto.ingest import trace_samples

    out, _, _ = tp_run
    for path in (out / "tensorboard").iterdir():
        calls = [e["ts"] for e in _load(path)["traceEvents"] if e.get("name") == "c10d::allreduce_"]
        trace = read_trace(path)
        events, samples = trace.device_events, trace_samples(trace, "test")
        reduce = (events["primitive"] == "all_reduce").to_numpy()
        launch = events.loc[reduce, "launch_ts_us"]
        assert len(launch) == len(calls) and sorted(launch) == pytest.approx(sorted(calls), rel=0, abs=0.01)
        start, work = events.loc[reduce, "ts_us"].to_numpy(), events.loc[reduce, "dur_us"].to_numpy()
        # the sample rows come grouped by primitive, each primitive's in event order (ingest.sample_table)
        spans = samples.loc[samples["primitive"] == "all_reduce", "duration_us"].to_numpy()
        assert len(spans) == len(start)
        assert (spans >= work + (start - launch.to_numpy()) - 1e-6).all() and (start > launch.to_numpy()).all()
    done = _cli("ingest", str(out), "--store", str(out.parent / "again"), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["errors"] == [], done.stdout[-500:]


def test_an_operators_row_leaves_out_the_collectives_it_waited_for(tp_run):
    """Tensor parallelism issues its all-reduces inside autograd functions (`_ReduceFromTP`): the function's row
    leaves out what its thread waited for the gloo work, which is a row of its own. Then the calling thread's time is
    not counted twice: per profiled step, the computation rows plus the all-reduces' work fit in the step (the
    ProfilerStep# span of the raw JSON)."""
    from extractors.kineto import read_trace

    out, _, _ = tp_run
    for path in (out / "tensorboard").iterdir():
        raw = [e for e in _load(path)["traceEvents"] if e.get("ph") == "X"]
        wrappers = [e for e in raw if e["name"] == "_ReduceFromTP"]
        calls = [e for e in raw if e["name"] == "c10d::allreduce_"]
        assert any(w["tid"] == c["tid"] and w["ts"] <= c["ts"] <= w["ts"] + w["dur"] for w in wrappers for c in calls)
        steps = {int(e["name"].split("#")[1]): e["dur"] for e in raw if e["name"].startswith("ProfilerStep#")}
        events = read_trace(path).device_events
        for step, frame in events[events["iteration"] >= 0].groupby("iteration"):
            compute = frame.loc[frame["category"] == "computation", "dur_us"].sum()
            waited = frame.loc[frame["primitive"] == "all_reduce", "dur_us"].sum()
            assert compute + waited <= steps[step], (step, compute, waited, steps[step])
        # each wrapper's row leaves out at least the calls nested in it (the wait after them too, checked above)
        rows = dict(zip(events.loc[events["name"] == "_ReduceFromTP", "ts_us"],
                        events.loc[events["name"] == "_ReduceFromTP", "dur_us"]))
        assert len(rows) == len(wrappers)
        for w in wrappers:
            nested = sum(c["dur"] for c in calls if c["tid"] == w["tid"] and w["ts"] <= c["ts"] <= w["ts"] + w["dur"])
            assert nested > 0 and rows[w["ts"]] <= w["dur"] - nested + 1e-3


def test_a_collective_model_answers_the_mean_of_its_repeats(tp_run, tmp_path):
    """An iteration sums every all-reduce it issues, so the model trained on a capture answers a message size with
    the arithmetic mean of that size's samples, not the geometric mean a log-time fit of the raw rows gives (gloo's
    waits are heavy-tailed). Expected values are numpy's mean and geometric mean of the store's rows. The model is
    trained on that size's all-reduces alone: with a second size (the loss's 256-byte all-reduces) the regressor has
    two points, which it does not split, and answers their geometric mean for both."""
    import numpy as np

    from predictor.costs.learned.models import ModelSet
    from predictor.costs.learned.training import train_models
    from tracekit.core.store import SampleStore

    _, _, store_dir = tp_run
    samples = SampleStore(store_dir).read()
    reduces = samples[samples["primitive"] == "all_reduce"]
    size = reduces["bytes"].value_counts().idxmax()
    rows = reduces[reduces["bytes"] == size]
    times = rows["duration_us"].to_numpy()
    assert len(times) >= 10
    train_models(samples[(samples["primitive"] != "all_reduce") | (samples["bytes"] == size)], tmp_path / "models",
                 folds=2)
    answer = ModelSet.load(tmp_path / "models").predict(rows.head(1))["duration_us"].iloc[0]
    mean, geometric = times.mean(), float(np.exp(np.log(times).mean()))
    assert answer == pytest.approx(mean, rel=0.1)
    if mean > 1.25 * geometric:  # a spread that tells the two apart (gloo's, on most machines)
        assert answer > (mean + geometric) / 2


def test_pp_ingest_finds_the_pipeline_transfers(pp_run):
    out, manifest = pp_run
    assert manifest.ingest["status"] == "ok", manifest.ingest
    from tracekit.core.store import SampleStore

    p2p = SampleStore(out.parent / "store").read(primitive="send_recv")
    activation_bytes = MODEL["seq_length"] * MODEL["micro_batch_size"] * MODEL["hidden_size"] * 2  # bf16
    # per step and micro-batch: one activation forward (0 → 1) and one gradient back (1 → 0), each seen by both
    assert (p2p["bytes"] == activation_bytes).sum() == 3 * 4 * 2 * 2
    assert set(p2p["hardware"]) == {manifest.hardware}


def test_pp_run_uses_the_017_layout_and_derives_the_split(pp_run):
    out, manifest = pp_run
    assert manifest.status == "ok", (out / "train.log").read_text()[-2000:]
    assert sorted(manifest.traces) == ["torch_profile/rank-0.json.gz", "torch_profile/rank-1.json.gz"]
    config = manifest.config()
    assert (config.pp, config.tp, config.dp, config.precision) == (2, 1, 1, "bf16")
    assert config.num_microbatches == 8 // (2 * 1)
    assert manifest.iteration_times_ms == _log_times(out / "train.log")
    assert json.loads((out / "manifest.json").read_text())["layout"] == "torch_profile"


def test_pp_trace_has_the_pipeline_sends_of_one_activation(pp_run):
    """Fact of the trace: stage 0 sends [seq, micro_batch, hidden] bf16 activations once per micro-batch."""
    out, _ = pp_run
    trace = _load(out / "torch_profile" / "rank-0.json.gz")
    assert trace["distributedInfo"]["rank"] == 0
    sends = [e for e in trace["traceEvents"] if e.get("name") == "c10d::send"]
    assert len(sends) == 3 * 4  # 4 micro-batches × 3 profiled steps
    assert all(e["args"]["Input Dims"][0] == [[32, 2, 64]] for e in sends)


def test_a_run_writing_the_017_layout_is_found_without_being_told(tmp_path):
    """Default `--layout auto`, a launch whose Megatron version cannot be read (the reference trainer is no Megatron
    tree): the flags every version takes are appended, the traces are looked for in both layouts and found where the
    run wrote them (#35: they were reported as "no traces were written")."""
    out = tmp_path / "capture"
    argv = launch_argv(1, **MODEL, global_batch_size=2, trace_layout="torch_profile")
    manifest = capture(out, argv, steps=STEPS, ingest=False, echo=False)
    assert manifest.status == "ok", (out / "train.log").read_text()[-2000:]
    assert manifest.traces == ["torch_profile/rank-0.json.gz"] and manifest.layout == "torch_profile"
    assert "version not found" in manifest.layout_source and "found in the torch_profile layout" in \
        manifest.layout_source
    assert "--pytorch-profiler-collect-shapes" not in " ".join(manifest.notes)  # an older Megatron refuses it
    assert not any("no traces" in note for note in manifest.notes)
    events = _load(out / "torch_profile" / "rank-0.json.gz")["traceEvents"]
    assert not any(e.get("cat") == "cpu_op" and "Input Dims" in e["args"] for e in events)  # shapes not asked for
    done = _cli("capture", "--out", str(tmp_path / "bad"), "--layout", "newest", "--", *argv)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and \
        "'newest' is not one of 'auto', 'tensorboard', 'torch_profile'" in done.stderr


VENDORED = sorted((ROOT.parent / "shared" / "vendor").glob("megatron-lm-*.tar.gz"))


@pytest.mark.skipif(not VENDORED, reason="the vendored Megatron-LM snapshot is not beside the checkout")
def test_the_megatron_version_of_the_launch_picks_its_layout_and_its_shapes(tmp_path):
    """A launch from a Megatron-LM tree (the vendored snapshot's own `megatron/core/package_info.py`, core 0.20; its
    `pretrain_gpt.py` is the reference trainer, which runs on this CPU): the torch_profile layout is asked for with
    shapes, and the trace has them."""
    tree = tmp_path / "megatron-lm"
    with tarfile.open(VENDORED[-1]) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("megatron/core/package_info.py"))
        info = tree / "megatron" / "core" / "package_info.py"
        info.parent.mkdir(parents=True)
        info.write_bytes(tar.extractfile(member).read())
    found = megatron_version(["torchrun", str(tree / "pretrain_gpt.py")], env={}, cwd=tmp_path)
    assert found is not None and found.where == str(info) and found.release >= (0, 17)
    assert MegatronVersion("0.16.0", "").layout == "tensorboard" and found.layout == "torch_profile"
    (tree / "pretrain_gpt.py").write_text("from tracekit.reference.train import main\n\nmain()\n")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
            str(tree / "pretrain_gpt.py"), *megatron_flags(**MODEL, global_batch_size=2)]
    out = tmp_path / "capture"
    manifest = capture(out, argv, steps=STEPS, ingest=False, echo=False)
    assert manifest.status == "ok", (out / "train.log").read_text()[-2000:]
    assert manifest.layout == "torch_profile" and manifest.traces == ["torch_profile/rank-0.json.gz"]
    assert manifest.layout_source.startswith(f"torch_profile asked for, from Megatron-core {found.version}")
    assert "--pytorch-profiler-collect-shapes" in " ".join(manifest.notes)
    events = _load(out / "torch_profile" / "rank-0.json.gz")["traceEvents"]
    assert any(e.get("cat") == "cpu_op" and e["args"].get("Input Dims") for e in events)


def test_failing_launch_passes_its_exit_code_and_keeps_what_it_captured(tmp_path):
    """A plain PyTorch script (import-hook mode) that dies after the profiled steps."""
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch\n"
        "model = torch.nn.Linear(16, 16)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(6):\n"
        "    opt.zero_grad(); model(torch.randn(8, 16)).square().mean().backward(); opt.step()\n"
        "print('elapsed time per iteration (ms): 1.5', flush=True)\n"
        "sys.exit(3)\n"
    )
    out = tmp_path / "capture"
    done = _cli("capture", "--out", str(out), "--steps", "2-5", "--no-ingest", "--", sys.executable, str(script))
    assert done.returncode == 3
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["status"], manifest["exit_code"], manifest["mode"]) == ("failed", 3, "hook")
    assert manifest["traces"] == ["traces/rank-0.pt.trace.json"]
    assert manifest["iteration_times_ms"] == [1.5]
    steps = {e["name"] for e in _load(out / "traces" / "rank-0.pt.trace.json")["traceEvents"]
             if e["name"].startswith("ProfilerStep#")}
    assert len(steps) == 3


def test_missing_command_fails_cleanly(tmp_path):
    done = _cli("capture", "--out", str(tmp_path / "c"), "--no-ingest", "--", "no-such-command-xyz",
                "--num-layers", "2")
    assert done.returncode == 127
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())["status"] == "failed"
    again = _cli("capture", "--out", str(tmp_path / "c"), "--", "true")
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "already holds a capture" in again.stderr


def test_hook_gives_one_trace_per_rank_of_a_plain_script(tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))\n"
        "opt = torch.optim.Adam(model.parameters())\n"
        "for step in range(7):\n"
        "    opt.zero_grad(); model(torch.randn(16, 32)).square().mean().backward()\n"
        "    for p in model.parameters(): dist.all_reduce(p.grad)\n"
        "    opt.step()\n"
        "dist.destroy_process_group()\n"
    )
    out = tmp_path / "capture"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    manifest = capture(out, argv, steps="3-6", ingest=False, echo=False)
    log = (out / LOG_NAME).read_text(errors="replace")[-3000:]  # why the launch failed, should it ever
    assert (manifest.status, manifest.mode, manifest.world_size) == ("ok", "hook", 2), log
    assert manifest.configuration is None and manifest.configuration_error
    ranks = set()
    for name in manifest.traces:
        trace = _load(out / name)
        ranks.add(trace["distributedInfo"]["rank"])
        events = trace["traceEvents"]
        assert len({e["name"] for e in events if e["name"].startswith("ProfilerStep#")}) == 3
        grads = [e for e in events if e.get("name") == "c10d::allreduce_"]
        assert len(grads) == 3 * 4  # 4 parameter tensors per step
    assert ranks == {0, 1} and len(manifest.traces) == 2


def test_megatron_args_both_layouts_and_ranks():
    old = _cli("megatron-args", "--steps", "10-13", "--ranks", "0,2", "--out", "runs/a")
    assert old.returncode == 0
    assert old.stdout.split() == ["--profile", "--use-pytorch-profiler", "--profile-step-start", "10",
                                  "--profile-step-end", "13", "--profile-ranks", "0", "2",
                                  "--tensorboard-dir", "runs/a/tensorboard"]
    new = json.loads(_cli("megatron-args", "--layout", "torch_profile", "--ranks", "all", "--world-size", "4",
                          "--out", "runs/b", "--json").stdout)
    assert new["flags"][-1] == "--pytorch-profiler-collect-shapes"
    assert new["flags"][new["flags"].index("--profile-ranks") + 1:][:4] == ["0", "1", "2", "3"]
    assert new["trace_globs"] == ["runs/b/torch_profile/rank-*.json.gz"]
    no_shapes = _cli("megatron-args", "--layout", "torch_profile", "--no-shapes", "--ranks", "0")
    assert "--pytorch-profiler-collect-shapes" not in no_shapes.stdout
    for bad in (["--ranks", "all"], ["--ranks", "0,x"], ["--ranks", "5", "--world-size", "4"], ["--steps", "10-11"]):
        done = _cli("megatron-args", *bad)
        assert done.returncode == 2 and done.stderr.startswith("error:") and done.stderr.count("\n") == 1, bad


def test_the_loop_continues_train_and_predict_on_the_captured_cpu_samples(tp_run):
    out, _, store_dir = tp_run
    manifest = Manifest.load(out)
    models = out.parent / "models"
    done = _cli("train", "--store", str(store_dir), "--models-out", str(models), "--folds", "2", "--json")
    assert done.returncode == 0, done.stderr[-1500:]
    index = json.loads((models / "index.json").read_text())
    trained = {(m["hardware"], m["primitive"], m["pass"]) for m in index["models"]}
    assert {(manifest.hardware, "gemm", "fwd"), (manifest.hardware, "all_reduce", "comm")} <= trained
    config = out.parent / "config.json"
    config.write_text(json.dumps({k: v for k, v in manifest.configuration.items() if k != "extra"}))
    done = _cli("predict", str(config), "--hardware", manifest.hardware, "--gpus-per-node", "2", "--models",
                str(models), "--json")
    assert done.returncode == 0, done.stderr[-1500:]
    assert json.loads(done.stdout)["iteration_time_s"] > 0
