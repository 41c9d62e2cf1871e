"""`tracekit sample` on this CPU: real timings (torch, gloo over 2 processes) land in the store with sane features."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tracekit.core.hardware import cpu_hardware_id
from tracekit.core.store import SampleStore

TRACEKIT = [sys.executable, "-c", "from tracekit.cli import main; main()"]
ASKED_BYTES = {2 ** e for e in range(10, 25)}  # 1 KiB … 16 MiB, the CPU message sizes


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TRACEKIT, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    store = tmp_path_factory.mktemp("sample") / "store"
    done = _cli("sample", "--device", "cpu", "--budget", "20", "--primitives", "gemm,framework,all_reduce",
                "--processes", "2", "--store", str(store), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout), SampleStore(store)


def test_samples_are_stored_under_this_cpu(sampled):
    summary, store = sampled
    frame = store.read()
    assert set(frame["hardware"]) == {cpu_hardware_id()} == {summary["hardware"]}
    assert set(frame["primitive"]) == {"gemm", "framework", "all_reduce"}
    assert summary["samples"] == frame["primitive"].value_counts().to_dict()
    assert list(store.sources()) == [summary["source"]]


def test_gemm_rates_are_plausible_for_a_cpu(sampled):
    _, store = sampled
    gemm = store.read(primitive="gemm")
    gemm = gemm[gemm["dtype"] == "fp32"]  # the run's dtype (fp8 GEMMs beside them: tests/test_sample_cases.py)
    fwd = gemm[gemm["pass"] == "fwd"]
    assert len(fwd) >= 10 and (fwd["batch"] >= 1).all()
    gflops = 2 * fwd["batch"] * fwd["m"] * fwd["n"] * fwd["k"] / fwd["duration_us"] / 1e3
    # any CPU in fp32, however busy: above 0.1 GFLOP/s, far below 5 TFLOP/s (bounds a unit error would break, not
    # noise: a µs/ms mix-up is a factor 1000)
    assert 0.1 < gflops.median() < 5000, gflops.describe()
    # every forward shape also has its backward (dgrad + wgrad: twice the FLOPs, so not several times quicker,
    # whatever the machine's noise)
    keys = ["variant", "m", "n", "k", "batch"]
    merged = fwd.merge(gemm[gemm["pass"] == "bwd"], on=keys, suffixes=("_f", "_b"))
    assert len(merged) == len(fwd)
    assert (merged["duration_us_b"] / merged["duration_us_f"]).median() > 0.5


def test_all_reduce_samples_carry_the_asked_message_sizes(sampled):
    _, store = sampled
    comm = store.read(primitive="all_reduce")
    assert len(comm) >= 5
    assert set(comm["bytes"]) <= ASKED_BYTES
    assert (comm["numel"] * 4 == comm["bytes"]).all()  # fp32 elements
    assert set(comm["group_size"]) == {2.0} and set(comm["ranks_per_node"]) == {2.0} and set(comm["nodes"]) == {1.0}
    assert set(comm["pass"]) == {"comm"} and (comm["duration_us"] > 0).all()


def test_framework_overhead_is_sampled_on_small_single_rank_layers(sampled):
    """The reference layer's time beyond its operators', per operator: sampled on the CPU grid's small one-rank
    layers, forward and backward; eager PyTorch spends tens of µs per operator between them (module calls, views,
    the tensor-parallel mappings' autograd functions). It is a difference of two timings, so on a busy machine it
    can come out near zero or below: the test asserts its scale (well under a millisecond per operator), not its
    sign. FSDP2's hooks per unit are sampled beside it, on the same layers."""
    from tracekit.core.samples import FSDP2_UNIT
    from tracekit.sampling.shapes import FRAMEWORK_MAX_ELEMENTS, GRIDS

    _, store = sampled
    frame = store.read(primitive="framework")
    hidden, seq, micro, _, _ = GRIDS["cpu"]
    small = {(s * b, h) for h in hidden for s in seq for b in micro if s * b * h <= FRAMEWORK_MAX_ELEMENTS}
    assert set(zip(frame["rows"], frame["width"])) <= small
    assert set(frame["variant"]) == {"reference_layer", FSDP2_UNIT}
    for (variant, _), rows in frame.groupby(["variant", "pass"]):
        # per operator: tens of µs; FSDP2's hooks per unit (Python around each unit's forward and backward, issuing
        # and waiting for its collectives): about a millisecond on a CPU; a µs/ms mix-up is a factor 1000
        limit = 1000 if variant == "reference_layer" else 20_000
        assert abs(rows["duration_us"].median()) < limit, rows["duration_us"].describe()
    assert set(frame["pass"]) == {"fwd", "bwd"}


def test_a_cpu_forward_is_timed_into_fresh_memory_before_any_backward():
    """A step keeps a pass's activations for its backward, so on a CPU the sampler runs every forward of a shape
    before the first backward and keeps each result: no forward writes where an earlier repeat's output was, and
    each backward runs on its own forward's graph."""
    import torch

    from tracekit.sampling.compute import Timer

    x = torch.randn(64, 256, requires_grad=True)
    events: list[str] = []
    outputs: list[int] = []

    def forward():
        y = torch.nn.functional.gelu(x)
        events.append("fwd")
        outputs.append(y.data_ptr())
        y.register_hook(lambda grad: events.append("bwd"))
        return y

    forward_us, backward_us = Timer(torch.device("cpu"), warmup=1, repeats=3).fwd_bwd([x], forward)
    assert events == ["fwd"] * 4 + ["bwd"] * 4
    assert len(set(outputs)) == 4
    assert forward_us > 0 and backward_us > 0


def _has_malloc_trim() -> bool:
    import ctypes
    import ctypes.util

    try:
        return hasattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "malloc_trim")
    except OSError:
        return False


@pytest.mark.skipif(not (sys.platform.startswith("linux") and _has_malloc_trim()),
                    reason="glibc's malloc_trim; /proc/self/statm")
def test_freed_memory_is_returned_to_the_system_before_a_forward_is_timed():
    """The pages a step's forward activations land in were returned to the system when the last iteration freed
    them; the sampler returns what the process has freed before timing forwards, so they are touched afresh too."""
    import os

    import torch

    from tracekit.sampling.compute import return_freed_memory

    def resident_mib() -> float:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20

    before = resident_mib()
    chunks = [torch.ones(16 * 1024) for _ in range(1024)]  # 64 MiB in 64 KiB tensors: heap, not mmap
    held = resident_mib()
    last = chunks[-1]  # the heap's top stays in use: freeing the rest does not shrink it by itself
    del chunks
    assert resident_mib() > held - 8
    return_freed_memory()
    assert resident_mib() < before + 0.25 * (held - before)
    assert last.sum() == 16 * 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads thread names from /proc/self/task")
def test_the_compute_phase_leaves_at_most_one_gloo_transport_behind():
    """The framework and DTensor optimizer samples need a one-rank process group. Set up per shape, each left a gloo
    transport thread behind (DTensor keeps a reference), and dozens of them waking on their own made the collectives
    sampled after them ~1.5× quicker than a training step's; the compute phase now holds one group throughout."""
    import os

    from tracekit.core.samples import DTENSOR_SUFFIX
    from tracekit.sampling.run import sample

    def transports() -> int:
        names = []
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/comm") as comm:
                names.append(comm.read().strip())
        return names.count("gloo_tcp_loop")

    before = transports()
    run = sample("cpu", ["framework", "optimizer"], budget_s=8, store=None, warmup=1, repeats=1, rounds=1)
    # before the fix each of these set up a group: a framework case (2 rows, forward and backward) or a DTensor step
    groups = sum(0.5 if row["primitive"] == "framework" else 1 for row in run.rows
                 if row["primitive"] == "framework" or str(row["variant"]).endswith(DTENSOR_SUFFIX))
    assert groups >= 3, run.counts()
    assert transports() - before <= 1


def test_train_keeps_the_framework_overhead_and_predict_pays_it_per_operator(sampled, tmp_path):
    """`tracekit train` keeps the median per pass (no regressor: it does not grow with the shape); `predict` adds
    it once per forward / backward compute operator instance it lists, the same as a calibration's op_overhead_us."""
    from tracekit.core.samples import FSDP2_UNIT

    _, store = sampled
    frame = store.read(primitive="framework")
    unit = frame["variant"] == FSDP2_UNIT
    expected = {p: max(0.0, rows["duration_us"].median()) for p, rows in frame[~unit].groupby("pass")}
    expected_unit = {p: max(0.0, rows["duration_us"].median()) for p, rows in frame[unit].groupby("pass")}
    with_fw, without = tmp_path / "with", tmp_path / "without"
    train = ("train", "--store", str(store.root), "--folds", "2", "--json")
    assert _cli(*train, "--models-out", str(with_fw)).returncode == 0
    only = ("--primitive", "gemm", "--primitive", "all_reduce")
    assert _cli(*train, "--models-out", str(without), *only).returncode == 0
    index = json.loads((with_fw / "index.json").read_text())
    kept = {e["pass"]: e["per_op_us"] for e in index["framework"] if "per_unit_us" not in e}
    kept_unit = {e["pass"]: e["per_unit_us"] for e in index["framework"] if "per_unit_us" in e}
    assert kept == pytest.approx(expected, abs=1e-3) and kept_unit == pytest.approx(expected_unit, abs=1e-3)
    assert all(e["hardware"] == cpu_hardware_id() for e in index["framework"])
    assert "framework" not in {m["primitive"] for m in index["models"]}
    listed = json.loads(_cli("models", "--models", str(with_fw), "--json").stdout)
    assert [e for e in listed["framework"] if "per_unit_us" not in e] == \
        [e for e in index["framework"] if "per_unit_us" not in e]
    model = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, micro_batch_size=2,
                 global_batch_size=8, world_size=2, vocab_size=1000, precision="fp32")
    # DDP pays the time per operator only; FSDP2 also its hooks per unit: 2 layers and the root, 2 micro-batches
    for job, units in ((model, 0), ({**model, "use_torch_fsdp2": True}, 3 * 2)):
        config = tmp_path / "cfg.json"
        config.write_text(json.dumps(job))
        predicted = {}
        for name, models in (("with", with_fw), ("without", without)):
            done = _cli("predict", str(config), "--hardware", cpu_hardware_id(), "--gpus-per-node", "2", "--models",
                        str(models), "--json")
            assert done.returncode == 0, done.stderr
            predicted[name] = json.loads(done.stdout)
        assert predicted["with"]["framework_us_per_op"] == kept and predicted["without"]["framework_us_per_op"] == {}
        assert predicted["with"]["fsdp2_us_per_unit"] == (kept_unit if units else {})
        assert predicted["without"]["fsdp2_us_per_unit"] == {}
        ops = predicted["without"]["operators"]
        added = sum(op["count"] * kept[op["pass"]] for op in ops if op["pass"] in ("fwd", "bwd"))
        added += units * sum(kept_unit.values())
        gap = predicted["with"]["iteration_time_s"] - predicted["without"]["iteration_time_s"]
        assert gap == pytest.approx(added / 1e6, rel=1e-6, abs=1e-12)  # 0 when this machine measured no overhead


def test_bad_requests_fail_with_one_line(tmp_path):
    for args in (["--primitives", "gemm,warp_drive"], ["--device", "tpu"], ["--budget", "0"],
                 ["--primitives", "all_reduce", "--processes", "1"]):
        done = _cli("sample", "--store", str(tmp_path / "s"), *args)
        assert done.returncode == 2 and done.stderr.startswith("error:") and done.stderr.count("\n") == 1, args
    assert not (tmp_path / "s").exists()


def test_the_optimizer_step_is_sampled_over_plain_and_dtensor_parameters_of_each_stage():
    """Each pipeline stage's Adam step is timed twice at the same sizes: over plain tensors (Megatron's DDP) and over
    DTensor shards on a one-rank mesh (torch FSDP2), which makes and removes its own process group."""
    import torch
    import torch.distributed as dist

    from tracekit.core.samples import DTENSOR_SUFFIX, FUSED_SUFFIX
    from tracekit.sampling.compute import Timer, time_case
    from tracekit.sampling.shapes import compute_cases, points

    point = min(points("cpu"), key=lambda p: p.hidden * p.rows)
    cases = compute_cases(point, {"optimizer"})
    by_variant = {(case.variant, case.feature("layers")): case for case in cases}
    # a job without pipelining is one first stage of all its layers: those are timed at 1, 2 and 4 layers
    assert {layers for (variant, layers) in by_variant if variant == "firstStage_optimizer"} == {1, 2, 4}
    for (variant, layers), plain in by_variant.items():
        if variant.endswith((DTENSOR_SUFFIX, FUSED_SUFFIX)):  # the fused AdamW step: tests/test_sample_cases.py
            continue
        dtensor = by_variant[(f"{variant}{DTENSOR_SUFFIX}", layers)]
        # the DTensor step is rank 0's shards over 2 ranks (the larger half of each tensor): its own elements
        # (every dimension of this even hidden size splits evenly but the embeddings' rows, by half a row at most)
        f_plain, f_dtensor = dict(plain.features), dict(dtensor.features)
        full, shard = f_plain.pop("params"), f_dtensor.pop("params")
        assert f_plain == f_dtensor and full / 2 <= shard <= full / 2 + point.hidden / 2
    timer = Timer(torch.device("cpu"), warmup=1, repeats=1)
    step = time_case(by_variant[(f"middleStage_optimizer{DTENSOR_SUFFIX}", 2)], "fp32", timer)
    assert set(step) == {"optimizer"} and step["optimizer"] > 0
    assert not dist.is_initialized()


def test_fsdp2_copies_are_sampled_over_a_sweep_of_units_with_the_elements_they_copy():
    """FSDP2's three copies are timed on one GPT layer's parameters (12h² + 13h: QKV, projection and the two MLP
    linears with their biases, two LayerNorms) over two shard ranks, at enough sizes for a model of their own; the
    copy in moves rank 0's shard (half of each tensor's rows), the copy out and the gradients' copy the whole layer.
    Each is the same op in forward and backward, so one timing serves both passes."""
    import torch

    from predictor.costs.learned.model_keys import MIN_GROUP_ROWS
    from tracekit.core.samples import FSDP_COPIES, FSDP_COPY_IN
    from tracekit.sampling.compute import Timer, time_case
    from tracekit.sampling.shapes import fsdp_copy_cases

    cases = fsdp_copy_cases("cpu")
    for variant in FSDP_COPIES:
        mine = [c for c in cases if c.variant == variant]
        assert len({c.feature("numel") for c in mine}) >= MIN_GROUP_ROWS
        for c in mine:
            h = c.get("hidden")
            layer = 12 * h * h + 13 * h
            expected = layer / 2 if variant == FSDP_COPY_IN and h % 2 == 0 else layer
            if variant != FSDP_COPY_IN or h % 2 == 0:
                assert c.feature("numel") == expected == c.feature("rows") and c.feature("width") == 1
            else:  # odd rows split 2 ways: rank 0 holds the larger half of each
                assert layer / 2 < c.feature("numel") < layer / 2 + 4 * h + 8
    timer = Timer(torch.device("cpu"), warmup=1, repeats=3)
    for variant in FSDP_COPIES:
        mine = sorted((c for c in cases if c.variant == variant), key=lambda c: c.feature("numel"))
        small, big = (time_case(c, "fp32", timer) for c in (mine[0], mine[-1]))
        assert small["fwd"] == small["bwd"] > 0
        # 4,000 times the elements: a copy that copied nothing, or a µs/ms mix-up, breaks this on any machine
        assert big["fwd"] > 10 * small["fwd"]


def test_off_a_terminal_sampling_says_what_it_has_timed_as_it_goes(tmp_path):
    """Piped (no progress bar), a 2-minute `sample` printed nothing until its table: now a line on stderr every
    tenth of the budget, each naming every primitive timed so far with its count of timings, the counts growing."""
    done = _cli("sample", "--budget", "4", "--primitives", "gemm,norm", "--store", str(tmp_path / "s"))
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("sampling: ")]
    assert len(lines) >= 3, done.stderr
    counts = [dict(re.findall(r"(\w+) (\d+)", line.split("timings so far: ")[1])) for line in lines]
    assert set(counts[-1]) == {"gemm", "norm"}
    gemm = [int(c.get("gemm", 0)) for c in counts]
    assert gemm == sorted(gemm) and gemm[-1] > gemm[0]
