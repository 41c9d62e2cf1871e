"""The real-GPU kit (`benchmarks/gpu/`, #35) as far as a CPU takes it: its argument checks, the harvest of real CPU
captures (the reference trainer standing in for Megatron, the sampler on this CPU) packed within the bring-back's
limits and unpacked whole, each run validated with its HTML report, and the kit's Megatron runs built and stepped
on this CPU by the vendored Megatron-LM where its import chain is here."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from benchmarks.gpu import configs
from benchmarks.gpu.harvest import files_to_pack
from benchmarks.gpu.pack import INDEX, PackError, pack, unpack
from tests.conftest import ROOT

HARVEST = [sys.executable, str(ROOT / "benchmarks" / "gpu" / "harvest.py")]
UNPACK = [sys.executable, str(ROOT / "benchmarks" / "gpu" / "unpack.py")]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def _run(argv: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=ENV, cwd=ROOT)


@pytest.fixture(scope="module")
def harvest(tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """One CPU harvest: a GEMM held busy for 5 s, both reference runs captured, the sampler for 10 s, packed with the
    bring-back's limits."""
    base = tmp_path_factory.mktemp("harvest")
    done = _run([*HARVEST, "--device", "cpu", "--out", str(base / "out"), "--work", str(base / "work"),
                 "--budget", "150", "--sample-seconds", "10", "--sustained-seconds", "5"])
    return base / "out", base / "work", done


def _log_times(log: Path) -> dict[int, float]:
    """Iteration number → logged time, read straight from the log's lines (not by tracekit's parser)."""
    pattern = r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)"
    return {int(n): float(t) for n, t in re.findall(pattern, log.read_text())}


@pytest.mark.parametrize("flags, says", [
    (["--budget", "600"], "--budget 600"),
    (["--budget", "30"], "--budget 30"),
    (["--runs", "gpt-1.3b"], "not among the cpu runs"),
    (["--stages", "env,train"], "--stages"),
    (["--sample-seconds", "5"], "--sample-seconds 5"),
    (["--sustained-seconds", "300"], "--sustained-seconds 300"),
])
def test_bad_arguments_are_one_line_and_write_nothing(tmp_path, flags, says):
    out = tmp_path / "out"
    done = _run([*HARVEST, "--device", "cpu", "--out", str(out), *flags])
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert not out.exists()


def test_the_gpu_harvest_refuses_a_machine_without_one_and_a_missing_snapshot(tmp_path):
    import torch

    done = _run([*HARVEST, "--out", str(tmp_path / "out"), "--megatron", str(tmp_path / "none.tar.gz")])
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert ("torch sees no CUDA device" if not torch.cuda.is_available() else "--megatron") in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_harvest_holds_every_run_with_its_unprofiled_times(harvest):
    out, work, done = harvest
    assert done.returncode == 0, done.stderr[-2000:]
    index = json.loads((out / INDEX).read_text())
    assert [r["name"] for r in index["runs"]] == ["ref-gpt", "ref-llama"]
    for run in index["runs"]:
        assert run["status"] == "ok" and run["layout"] == "tensorboard" and len(run["traces"]) == 1
        logged = _log_times(work / "runs" / run["name"] / "train.log")
        profiled = set(run["profiled_iterations"])
        assert profiled and run["unprofiled_iteration_times_ms"] == [t for i, t in logged.items() if i not in profiled]
        steady = [t for i, t in logged.items() if i not in profiled and i >= 3]
        assert run["measured_ms"] == pytest.approx(statistics.median(steady), abs=1e-3)
    assert index["sample"]["exit_code"] == 0 and index["sample"]["samples"]["gemm"] > 0
    assert index["sample"]["kernel_clock"] == "host" and index["sample"]["clock_problem"] is None  # a CPU: its clock
    assert index["env"]["hardware"].startswith("cpu-")
    files = sorted(out.iterdir())
    held = index["sustained"]
    assert held["exit_code"] == 0 and held["shape"] == [384, 384, 384] and held["dtype"] == "float32"
    times = [t for t, _ in held["windows"]]
    assert times == sorted(times) and times[-1] == held["seconds"] >= 5 and len(times) >= 5  # [end of window, rate]
    assert all(rate > 0 for _, rate in held["windows"])
    assert held["burst_tflops"] == held["windows"][1][1]  # the first window only sized the others
    assert min(r for _, r in held["windows"][1:]) <= held["sustained_tflops"] <= max(r for _, r in held["windows"])
    assert len(files) <= 8 and all(f.stat().st_size <= 15 * 2**20 for f in files)
    assert not index["pack"]["left_out"]


def test_packing_real_captures_keeps_within_any_limits_and_unpacks_whole(harvest, tmp_path):
    """The same captures packed into volumes of 256 KiB, at most 3 files: traces cut into chunks across volumes,
    what does not fit left out by name, every file back byte for byte, and a lost volume refused in one line."""
    out, work, _ = harvest
    summary = {k: v for k, v in json.loads((out / INDEX).read_text()).items() if k != "pack"}
    files = files_to_pack(work, summary)
    small = tmp_path / "small"
    index = pack(files, small, summary, max_files=3, max_bytes=256 * 2**10)
    written = sorted(small.iterdir())
    assert len(written) <= 3 and all(p.stat().st_size <= 256 * 2**10 for p in written)
    packed = {f["name"]: f for f in index["pack"]["files"]}
    assert any(len(f["chunks"]) > 1 for f in packed.values())  # a trace across volumes
    left = {f["name"] for f in index["pack"]["left_out"]}
    assert left and left | set(packed) == {name for name, _ in files} and not left & set(packed)
    assert list(packed)[0] == "log.txt"  # the most wanted first
    back = unpack(small, tmp_path / "back")
    sources = dict(files)
    for name in packed:
        assert (tmp_path / "back" / name).read_bytes() == sources[name].read_bytes(), name
    assert back["pack"] == index["pack"]
    (small / "harvest-01.tar").unlink()
    with pytest.raises(PackError, match="harvest-01.tar: volume missing"):
        unpack(small, tmp_path / "again")
    assert not (tmp_path / "again").exists()


def test_unpack_writes_the_provenance_and_validates_each_run(harvest, tmp_path):
    out, work, _ = harvest
    dest = tmp_path / "gpu"
    done = _run([*UNPACK, str(out), "--into", str(dest)], timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    index = json.loads((out / INDEX).read_text())
    provenance = (dest / "PROVENANCE.md").read_text()
    for run in index["runs"]:
        folder = dest / "runs" / run["name"]
        (trace,) = run["traces"]
        original = work / "runs" / run["name"] / trace
        assert (folder / trace).read_bytes() == original.read_bytes()  # gzipped for the trip, back as written
        assert (folder / "report.html").stat().st_size > 0
        report = json.loads((folder / "validate.json").read_text())
        assert report["unprofiled"]["iterations"] >= 3 and report["unprofiled"]["predicted_s"] > 0
        assert run["name"] in provenance and " ".join(run["launch"]) in provenance
        assert re.search(rf"{run['name']}\s+{run['measured_ms']}\s+[\d.]+\s+[+-][\d.]+%", done.stdout), done.stdout
    assert (dest / "store" / "sources.json").exists()
    again = _run([*UNPACK, str(out), "--into", str(dest)])
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "already exists" in again.stderr


VENDORED = sorted((ROOT.parent / "shared" / "vendor").glob("megatron-lm-*.tar.gz"))
IMPORTS = all(importlib.util.find_spec(m) is not None for m in ("triton", "einops"))


@pytest.mark.skipif(not VENDORED or not IMPORTS, reason="needs the vendored Megatron-LM snapshot beside the checkout "
                    "and Megatron-core's import chain (triton, einops)")
def test_the_kits_megatron_runs_build_and_step_on_this_cpu(tmp_path):
    """Every run's features through Megatron's own argument checks, model builder and one forward/backward on gloo;
    and without a flag the local implementation needs, Megatron stops as it did on the H200."""
    with tarfile.open(VENDORED[-1]) as tar:
        tar.extractall(tmp_path, filter="data")
    (tree,) = [p.parent for p in tmp_path.glob("*/pretrain_gpt.py")]
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tree), os.environ.get("PYTHONPATH", "")])}
    check = [sys.executable, str(ROOT / "benchmarks" / "gpu" / "megatron_cpu.py")]
    done = subprocess.run(check, capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["run"] for r in results] == [r.name for r in configs.RUNS if not r.te]
    assert done.returncode == 0 and all(r["ok"] and r["loss"] > 0 for r in results), done.stdout[-3000:]
    for flag, stage, says in (("--no-rope-fusion", "model", "apply_rope_fusion"),
                              ("--no-persist-layer-norm", "model", "persist_layer_norm"),
                              ("--no-masked-softmax-fusion", "forward", "scaled_masked_softmax_cuda"),
                              ("--no-gradient-accumulation-fusion", "model", "fused_weight_gradient_mlp_cuda")):
        done = subprocess.run([*check, "llama-1b-gqa" if flag == "--no-rope-fusion" else "gpt-1.3b",
                               f"--without={flag}"], capture_output=True, text=True, timeout=900, env=env,
                              cwd=tmp_path)
        (result,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert done.returncode == 1 and not result["ok"] and result["stage"] == stage and says in result["error"]


def test_every_kit_run_profiles_three_steps_and_logs_each_iteration():
    for run in configs.RUNS:
        flags = run.flags()
        assert flags.count("--num-layers") == 1 and "--log-interval" in flags
        assert flags[flags.index("--log-interval") + 1] == "1"
        if run.te:
            assert flags[flags.index("--transformer-impl") + 1] == "transformer_engine"
        else:  # the local implementation's needs (configs docstring)
            assert {"--no-persist-layer-norm", "--no-masked-softmax-fusion"} <= set(flags)
            assert "--no-rope-fusion" in flags or "rope" not in flags
    start, end = (int(x) for x in configs.STEPS.split("-"))
    assert end - start >= 3 and configs.TRAIN_ITERS > end + 2
