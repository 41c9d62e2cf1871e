"""The CPU loop for FSDP: a 2-rank FSDP2 run of the reference trainer (gloo on this CPU) captured with `tracekit
capture`, ingested with each all-gather and reduce-scatter matched to its unit, and predicted from what was
captured. Expected counts and bytes come from the model's shapes (parameters counted by hand) and from the raw trace
JSON, never from the code under test."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from extractors.jobs.megatron import config_from_log
from tracekit.reference.launch import launch_argv

TRACEKIT = [sys.executable, "-c", "from tracekit.cli import main; main()"]
H, LAYERS, SEQ, MB, GBS, VOCAB, RANKS = 64, 2, 32, 2, 8, 1000, 2
MODEL = dict(num_layers=LAYERS, hidden_size=H, num_attention_heads=4, seq_length=SEQ, micro_batch_size=MB,
             global_batch_size=GBS, vocab_size=VOCAB, train_iters=7, log_interval=1)
STEPS = "2-5"  # three profiled steps
MICRO = GBS // (MB * RANKS)  # micro-batches per rank and step
#: one layer: QKV + bias, projection + bias, FC1 (4h) + bias, FC2 + bias, two LayerNorms (weight and bias)
LAYER = (H * 3 * H + 3 * H) + (H * H + H) + (H * 4 * H + 4 * H) + (4 * H * H + H) + 2 * 2 * H
#: the root unit: word embeddings (vocabulary padded to 1024), positions, the final LayerNorm (tied output layer)
ROOT = 1024 * H + SEQ * H + 2 * H


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TRACEKIT, *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("fsdp") / "capture"
    store = out.parent / "store"
    done = _cli("capture", "--out", str(out), "--steps", STEPS, "--store", str(store), "--",
                *launch_argv(RANKS, **MODEL, use_torch_fsdp2=True))
    return out, store, done


def test_the_capture_reads_the_sharding_from_the_log(fsdp_run):
    out, _, done = fsdp_run
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    config = manifest["configuration"]
    assert config["sharded_data_parallel"] == "torch-fsdp2" and config["data_parallel_size"] == RANKS
    assert config["torch_fsdp2_reshard_after_forward"] is True


def test_fsdp2_ranges_in_the_trace_name_every_unit(fsdp_run):
    """Facts of the raw trace: FSDP2 gathers each layer twice per micro-batch (forward, and again for backward) and
    the root once; it reduce-scatters each unit once."""
    out, _, _ = fsdp_run
    trace = json.loads(next((out / "tensorboard").iterdir()).read_text())
    names = [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = 3
    for layer in range(LAYERS):
        assert names.count(f"FSDP::all_gather (layers.{layer})") == 2 * MICRO * steps
        assert names.count(f"FSDP::post_backward_reduce (layers.{layer})") == MICRO * steps
    assert names.count("FSDP::all_gather") == MICRO * steps  # the root


def test_ingest_matches_each_collective_to_its_unit_with_the_units_bytes(fsdp_run):
    """Each all-gather moves a unit's fp32 parameters from each of the 2 ranks (a shard of params/2 each); each
    reduce-scatter leaves each rank its shard of the unit's gradients: bytes per rank = params · 4 · (N − 1)/N."""
    _, store, _ = fsdp_run
    from tracekit.core.store import SampleStore

    samples = SampleStore(store)
    gathers = samples.read(primitive="all_gather")
    scatters = samples.read(primitive="reduce_scatter")
    steps = 3
    for frame, per_micro in ((gathers, 2), (scatters, 1)):
        assert set(frame["group_size"]) == {float(RANKS)}
        layer = frame[frame["bytes"] == LAYER * 4 * (RANKS - 1) / RANKS]
        root = frame[frame["bytes"] == ROOT * 4 * (RANKS - 1) / RANKS]
        assert len(layer) == LAYERS * per_micro * MICRO * steps * RANKS
        assert len(root) == MICRO * steps * RANKS
        assert len(layer) + len(root) == len(frame)


def test_the_units_are_named_on_the_trace_rows(fsdp_run):
    out, _, _ = fsdp_run
    from extractors.kineto import read_trace

    events = read_trace(next((out / "tensorboard").iterdir())).device_events
    comm = events[events["primitive"].isin(["all_gather", "reduce_scatter"])]
    units = comm.groupby("layer")["bytes"].agg(set).to_dict()
    assert units == {"layers.0": {LAYER * 4 / 2}, "layers.1": {LAYER * 4 / 2}, "root": {ROOT * 4 / 2}}


def test_the_loop_predicts_the_captured_run_with_its_fsdp_collectives(fsdp_run, tmp_path):
    out, store, _ = fsdp_run
    models = tmp_path / "models"
    done = _cli("train", "--store", str(store), "--models-out", str(models), "--folds", "2", "--json")
    assert done.returncode == 0, done.stderr[-1500:]
    manifest = json.loads((out / "manifest.json").read_text())
    done = _cli("predict", "--megatron-log", str(out / "train.log"), "--hardware", manifest["hardware"],
                "--gpus-per-node", "2", "--models", str(models), "--json")
    assert done.returncode == 0, done.stderr[-1500:]
    prediction = json.loads(done.stdout)
    comm = {o["primitive"]: o["count"] for o in prediction["operators"] if o["pass"] == "comm"}
    # per iteration: 2 gathers per layer and micro-batch plus the root's; a reduce-scatter per unit and micro-batch
    assert comm["all_gather"] == (2 * LAYERS + 1) * MICRO and comm["reduce_scatter"] == (LAYERS + 1) * MICRO
    # no DDP all-reduce beside FSDP's reduce-scatters: the all-reduces are the loss report and the logging barrier,
    # once per step each in the raw trace (log interval 1)
    trace = json.loads(next((out / "tensorboard").iterdir()).read_text())
    names = [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert names.count("c10d::allreduce_") == names.count("c10d::barrier") == 3  # three profiled steps
    reports = [o for o in prediction["operators"] if o["pass"] == "comm" and o["primitive"] == "all_reduce"]
    assert sum(o["count"] for o in reports) == 2


def test_fsdp2_copies_are_ingested_as_their_ops_and_predicted_where_they_run(fsdp_run):
    """FSDP2 copies each unit's shard into the gather buffer and the gathered parameters out (per gather: in
    forward, and again before a layer's backward), and the unit's gradients into the reduce-scatter buffer (after its
    backward). The predictor's graph has these copies per variant and pass, as many as the raw trace runs; ingest
    keeps each as an elementwise row of its op with the elements it copies, those of the backward too, which run in
    FSDP2's hooks inside autograd nodes (the nodes' rows then leave the hooks' time out)."""
    from extractors.kineto import read_trace
    from predictor.assembly.graph import build_graph
    from tracekit.core.samples import FSDP_COPIES, FSDP_COPY_IN, FSDP_COPY_OUT, FSDP_GRAD_COPY_IN
    from tracekit.core.store import SampleStore

    out, store, _ = fsdp_run
    steps = 3
    expected = {  # (variant, pass) → elements per copy → copies per step and rank
        (FSDP_COPY_IN, "fwd"): {LAYER / 2: LAYERS * MICRO, ROOT / 2: MICRO},
        (FSDP_COPY_OUT, "fwd"): {LAYER: LAYERS * MICRO, ROOT: MICRO},
        (FSDP_COPY_IN, "bwd"): {LAYER / 2: LAYERS * MICRO},
        (FSDP_COPY_OUT, "bwd"): {LAYER: LAYERS * MICRO},
        (FSDP_GRAD_COPY_IN, "bwd"): {LAYER: LAYERS * MICRO, ROOT: MICRO},
    }
    trace = json.loads(next((out / "tensorboard").iterdir()).read_text())
    names = [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"]
    for variant in FSDP_COPIES:
        per_step = sum(n for (v, _), counts in expected.items() if v == variant for n in counts.values())
        assert names.count(variant) == per_step * steps

    copies = SampleStore(store).read(primitive="elementwise")
    copies = copies[copies["variant"].isin(FSDP_COPIES)]
    found = {key: (frame["numel"].value_counts() / (steps * RANKS)).to_dict()
             for key, frame in copies.groupby(["variant", "pass"])}
    assert found == expected
    assert (copies["rows"] == copies["numel"]).all() and (copies["width"] == 1).all()
    # FSDP2's autograd node for a unit's post-backward hook (its gradients' copy, reduce-scatter and wait) keeps its
    # own time only
    events = read_trace(next((out / "tensorboard").iterdir())).device_events
    hooked = {e["ts"]: e["dur"] for e in trace["traceEvents"] if e.get("ph") == "X"
              and e["name"].startswith("autograd::engine::evaluate_function: RegisterPostBackward")}
    rows = events[events["name"].str.startswith("autograd::engine::evaluate_function: RegisterPostBackward")]
    assert len(rows) and all(row.dur_us < hooked[row.ts_us] for row in rows.itertuples())

    manifest = json.loads((out / "manifest.json").read_text())
    config = config_from_log((out / "train.log").read_text(), "train.log")
    graph = build_graph(config, manifest["hardware"])
    seg = graph.segment(0, 0)
    predicted: dict = {}
    for op in seg.fwd + seg.bwd:
        spec = graph.specs[op.spec]
        if spec["variant"] in FSDP_COPIES:
            per_numel = predicted.setdefault((spec["variant"], spec["pass"]), {})
            per_numel[spec["numel"]] = per_numel.get(spec["numel"], 0) + op.count * MICRO
    assert predicted == expected


def test_the_aten_ops_inside_an_fsdp2_copy_belong_to_the_copy(fsdp_run):
    """On a GPU, an FSDP2 copy's kernels are launched by the aten ops it calls (`all_gather_copy_in` calls
    `_foreach_copy_`, a name optimizers use too): ingest links them to the copy. Here the nesting is read from the
    raw trace's spans on each thread and compared with what the linkage passes down to every op."""
    from extractors.kineto.decode import decode_events
    from extractors.kineto.linkage import op_context
    from extractors.kineto.load import open_trace
    from tracekit.core.samples import FSDP_COPIES

    out, _, _ = fsdp_run
    columns = decode_events(open_trace(next((out / "tensorboard").iterdir())).events_raw)
    context, _ = op_context(columns)
    copies = [(i, columns.op_thread[i], columns.op_ts[i], columns.op_ts[i] + columns.op_dur[i])
              for i, name in enumerate(columns.op_name) if name in FSDP_COPIES]
    assert copies
    inside = {name: 0 for name in ("aten::_foreach_copy_", "aten::split_with_sizes_copy", "aten::_chunk_cat")}
    for i, name in enumerate(columns.op_name):
        around = [c for c, thread, start, end in copies
                  if thread == columns.op_thread[i] and start <= columns.op_ts[i] < end]
        assert context.fsdp_copy[i] == (around[0] if around else -1), name
        if around and name in inside:
            inside[name] += 1
    assert all(inside.values()), inside  # each copy's aten op is in the trace, inside its copy
    optimizer_foreach = [i for i, name in enumerate(columns.op_name)
                         if name.startswith("aten::_foreach_") and context.optimizer[i]]
    assert all(context.fsdp_copy[i] == -1 for i in optimizer_foreach)
