"""The real-GPU kit: one command, run first whenever a GPU machine is at hand for a few minutes, under 8 minutes.

    python3 benchmarks/gpu/harvest.py --megatron .gpu/megatron-lm-<commit>.tar.gz --out "$OUT" [--budget 450]

In one overall budget (`--budget`, seconds, at most 480) it
1. records the machine (`env`): GPU, driver, clocks, torch, CUDA, cuDNN, Transformer Engine, flash-attn, apex;
2. holds one large GEMM busy (`sustained`, `--sustained-seconds`, 40 s by default): bf16 8192³ back to back, its rate
   in windows of ~0.25 s and the GPU's SM clock, power and temperature each second (nvidia-smi) — what the GPU
   sustains under its power limit against the burst the sampler times (`predictor.costs.physics.sustained_gemm`: the
   A100's ceiling is fitted on end-to-end runs; this measures a GPU's);
3. captures real Megatron-core runs (`megatron`) of the vendored Megatron-LM snapshot under `tracekit capture`
   (`benchmarks/gpu/configs.py`: a dense GPT, a GQA Llama, an MoE, full recompute, and the Transformer Engine runs
   where the machine has Transformer Engine), each bounded, in that order, while the sampler's share of the budget
   is kept: traces of 3 profiled steps, the log, the manifest with every logged iteration time and the unprofiled
   ones (`Manifest.unprofiled_iteration_times_ms`: the iterations the profiler did not touch);
4. samples every primitive (`sample`): `tracekit sample --device cuda` (collectives where the machine has 2 GPUs);
5. packs traces (gzipped), samples, logs and the summary (`benchmarks/gpu/pack.py`): at most 8 files of at most
   15 MiB, written as each stage ends, so a run cut short still brings back what it made.

`benchmarks/gpu/unpack.py` then unpacks the bring-back here, with its provenance, and validates each captured run.
It needs the project's source tree (run from its root; nothing is installed), torch, pyarrow and pandas: no typer
(the CLI is not used), no package registry. `--device cpu` runs the same stages on a CPU (the reference trainer
stands in for Megatron): how the kit is tested without a GPU. docs/gpu-kit.md says how to run it on a lent machine.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu import configs  # noqa: E402
from benchmarks.gpu.pack import MAX_BYTES, MAX_FILES, PackError, pack  # noqa: E402

MAX_BUDGET = 480  # the kit is one command of under 8 minutes (a device call may run 10)
MIN_RUN = 45  # seconds a Megatron run needs at least (its start-up alone is ~40 s on an H200)
PACK_SECONDS = 15  # kept at the end for the last pack
STAGES = ("env", "sustained", "megatron", "sample")
#: The GEMM the sustained stage holds busy: (size of the square, dtype) per device (a CPU: a dry run).
HELD_GEMM = {"cuda": (8192, "bfloat16"), "cpu": (384, "float32")}
WINDOW_S = 0.25  # seconds per timed window of the held GEMM
#: The reference trainer's runs for `--device cpu`: the kit's stages on real CPU captures (tests, a dry run).
CPU_RUNS = {
    "ref-gpt": ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
                "--micro-batch-size", "2", "--global-batch-size", "4", "--vocab-size", "1000"],
    "ref-llama": ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
                  "--micro-batch-size", "2", "--global-batch-size", "4", "--vocab-size", "1000", "--swiglu",
                  "--normalization", "RMSNorm", "--disable-bias-linear", "--untie-embeddings-and-output-weights"],
}
CPU_STEPS, CPU_ITERS = "3-6", 10  # 4 unprofiled iterations after the first


class KitError(Exception):
    """A bad argument or a machine the kit cannot run on, in one line."""


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
                     help="folder the bring-back is written to (default $OUT)")
    cli.add_argument("--budget", type=float, default=450.0, help=f"seconds for everything (at most {MAX_BUDGET})")
    cli.add_argument("--megatron", type=Path, help="the Megatron-LM snapshot: its .tar.gz or its unpacked folder")
    cli.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    cli.add_argument("--stages", default=",".join(STAGES), help=f"comma list of {', '.join(STAGES)}")
    cli.add_argument("--runs", help="comma list of runs, in the order to run them (default: every run the device "
                     "takes: " + ", ".join(configs.BY_NAME) + "; on --device cpu: " + ", ".join(CPU_RUNS) + ")")
    cli.add_argument("--sample-seconds", type=float, default=110.0, help="the sampler's budget (seconds)")
    cli.add_argument("--sustained-seconds", type=float, default=40.0,
                     help="how long the sustained stage holds its GEMM busy (seconds, 5 to 120)")
    cli.add_argument("--work", type=Path, help="scratch folder (default: a new temporary one)")
    cli.add_argument("--max-files", type=int, default=MAX_FILES, help=argparse.SUPPRESS)
    cli.add_argument("--max-bytes", type=int, default=MAX_BYTES, help=argparse.SUPPRESS)
    return cli.parse_args(argv)


def check(args: argparse.Namespace) -> argparse.Namespace:
    """Refuse, in one line each, what would waste the machine's minutes."""
    if args.out is None:
        raise KitError("--out: no output folder (give --out, or set OUT as the GPU machine does)")
    if args.out.exists() and any(args.out.glob("harvest*")):
        raise KitError(f"--out {args.out}: already holds a harvest; give an empty folder")
    if not 60 <= args.budget <= MAX_BUDGET:
        raise KitError(f"--budget {args.budget:g}: between 60 and {MAX_BUDGET} seconds (one command under 8 minutes)")
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        raise KitError(f"--stages {args.stages!r}: choose from {', '.join(STAGES)}")
    args.stage_list = stages
    names = list(CPU_RUNS) if args.device == "cpu" else list(configs.BY_NAME)
    runs = [r.strip() for r in args.runs.split(",") if r.strip()] if args.runs else names
    bad = [r for r in runs if r not in names]
    if bad or not runs:
        raise KitError(f"--runs: {', '.join(bad) or 'none given'} not among the {args.device} runs "
                       f"({', '.join(names)})")
    args.run_list = runs
    if "sample" in stages and not 10 <= args.sample_seconds <= args.budget - 30:
        raise KitError(f"--sample-seconds {args.sample_seconds:g}: between 10 and the budget less 30 s")
    if "sustained" in stages and not 5 <= args.sustained_seconds <= 120:
        raise KitError(f"--sustained-seconds {args.sustained_seconds:g}: between 5 and 120")
    if args.max_files < 2 or args.max_bytes < 2**20:
        raise KitError("--max-files/--max-bytes: at least 2 files of 1 MiB")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise KitError("--device cuda: torch sees no CUDA device here (use --device cpu for a dry run)")
        if "megatron" in stages:
            if args.megatron is None or not args.megatron.exists():
                raise KitError(f"--megatron {args.megatron}: the Megatron-LM snapshot (.tar.gz or folder) is needed "
                               "for the megatron stage (copy ../shared/vendor/megatron-lm-*.tar.gz into .gpu/)")
            if args.megatron.is_file() and not tarfile.is_tarfile(args.megatron):
                raise KitError(f"--megatron {args.megatron}: not a tar archive")
    return args


class Clock:
    def __init__(self, budget: float, log: Path):
        self.t0, self.end, self.log = time.time(), time.time() + budget, log

    def left(self) -> float:
        return self.end - time.time()

    def say(self, text: str) -> None:
        line = f"[{time.time() - self.t0:5.0f}s] {text}"
        print(line, flush=True)
        with open(self.log, "a") as handle:
            handle.write(line + "\n")


def environment(device: str) -> dict:
    """What the runs ran on."""
    env: dict = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()}
    import torch

    env["torch"] = torch.__version__
    env["cuda"] = torch.version.cuda
    if device == "cuda":
        env["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        env["capability"] = list(torch.cuda.get_device_capability())
        env["cudnn"] = torch.backends.cudnn.version()
        env["memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / 1e9, 1)
    from tracekit.core.hardware import cpu_hardware_id, normalize_hardware

    env["hardware"] = normalize_hardware(env["devices"][0]) if device == "cuda" else cpu_hardware_id()
    for module in ("transformer_engine", "flash_attn", "apex", "triton", "einops"):
        env[module] = _version(module)
    if shutil.which("nvidia-smi"):
        query = "name,memory.total,driver_version,clocks.sm,clocks.max.sm,power.limit,pcie.link.gen.max"
        env["nvidia_smi"] = _run(["nvidia-smi", f"--query-gpu={query}", "--format=csv"])
        env["nvidia_smi_topology"] = _run(["nvidia-smi", "topo", "-m"])
    env["tracekit_commit"] = _run(["git", "-C", str(ROOT), "rev-parse", "HEAD"]).strip() or "unknown"
    return env


def _version(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    try:
        from importlib import metadata

        return metadata.version(module.replace("_", "-"))
    except Exception:  # noqa: BLE001 - present, version unknown
        return "present"


def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def megatron_tree(source: Path, work: Path) -> Path:
    """The Megatron-LM folder (`pretrain_gpt.py` at its root), unpacked into `work` from a tarball."""
    if source.is_dir():
        tree = source
    else:
        with tarfile.open(source) as tar:
            tar.extractall(work, filter="data")
        found = sorted(work.glob("*/pretrain_gpt.py"))
        if not found:
            raise KitError(f"--megatron {source}: no pretrain_gpt.py at the top of the archive")
        tree = found[0].parent
    if not (tree / "pretrain_gpt.py").is_file():
        raise KitError(f"--megatron {source}: no pretrain_gpt.py in {tree}")
    return tree


def launch(args: argparse.Namespace, name: str, tree: Path | None, seconds: int) -> tuple[list[str], str]:
    """(the launch command of a run, bounded by `timeout`; its profiled steps)."""
    bound = ["timeout", "-k", "10", str(seconds)]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    if args.device == "cpu":
        flags = CPU_RUNS[name] + ["--train-iters", str(CPU_ITERS), "--log-interval", "1"]
        return bound + torchrun + ["-m", "tracekit.reference", *flags], CPU_STEPS
    assert tree is not None
    return bound + torchrun + [str(tree / "pretrain_gpt.py"), *configs.BY_NAME[name].flags()], configs.STEPS


def capture_run(args: argparse.Namespace, name: str, tree: Path | None, seconds: int, work: Path) -> dict:
    """One run under `tracekit capture` (no ingest: the traces come back whole); its record for the summary."""
    from tracekit.capture import capture

    argv, steps = launch(args, name, tree, seconds)
    out = work / "runs" / name
    start = time.time()
    manifest = capture(out, argv, steps=steps, ingest=False, echo=False)
    times = manifest.unprofiled_iteration_times_ms()
    steady = [t for i, t in zip([i for i in manifest.iterations if i not in set(manifest.profiled_iterations)],
                                times) if i >= 3]
    record = {
        "name": name, "status": manifest.status, "exit_code": manifest.exit_code, "seconds": round(time.time() - start),
        "time_limit_s": seconds, "launch": argv[4:], "steps": steps, "layout": manifest.layout,
        "layout_source": manifest.layout_source, "hardware": manifest.hardware,
        "iterations": manifest.iterations, "iteration_times_ms": manifest.iteration_times_ms,
        "profiled_iterations": manifest.profiled_iterations, "unprofiled_iteration_times_ms": times,
        "measured_ms": round(statistics.median(steady), 3) if steady else None,
        "traces": {t: (out / t).stat().st_size for t in manifest.traces},
    }
    if manifest.exit_code == 124:
        record["note"] = f"stopped at its time limit of {seconds} s"
    if manifest.status != "ok":
        log = (out / "train.log").read_text(errors="replace").splitlines() if (out / "train.log").exists() else []
        record["log_tail"] = log[-30:]
    return record


def sample_stage(args: argparse.Namespace, seconds: float, work: Path) -> dict:
    """`tracekit sample` in a child process bounded by `timeout` (a hung CUDA call cannot eat the pack's time)."""
    store = work / "store"
    gpus = 1
    if args.device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
    code = ("import json, sys; from tracekit.sampling.run import sample; from tracekit.sampling.shapes import "
            "COMPUTE, COLLECTIVES, SSM; from tracekit.core.store import SampleStore; "
            "gpus = int(sys.argv[3]); prims = list(COMPUTE) + list(SSM) + (list(COLLECTIVES) if gpus > 1 else []); "
            "r = sample(device=sys.argv[1], primitives=prims, budget_s=float(sys.argv[2]), ranks=max(gpus, 2), "
            "store=SampleStore(sys.argv[4]), rounds=2); "
            "print(json.dumps({'hardware': r.hardware, 'dtype': r.dtype, 'source': r.source, 'seconds': "
            "round(r.seconds, 1), 'stopped_by_budget': r.stopped_by_budget, 'samples': r.counts(), "
            "'kernel_clock': r.kernel_clock, 'clock_problem': r.clock_problem}))")
    argv = ["timeout", "-k", "10", str(int(seconds + 60)), sys.executable, "-c", code, args.device, str(seconds),
            str(gpus), str(store)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    (work / "sample.err").write_text(done.stderr)
    record: dict = {"exit_code": done.returncode, "budget_s": seconds}
    try:
        record.update(json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        record["stderr_tail"] = done.stderr.splitlines()[-20:]
    return record


def held_gemm(device: str, seconds: float) -> dict:
    """One square GEMM (HELD_GEMM) back to back for `seconds`: its rate (TFLOP/s) per window of ~WINDOW_S, timed by
    CUDA events on a GPU (the host's clock on a CPU). Run in the sustained stage's child process."""
    import torch

    size, dtype = HELD_GEMM[device]
    a, b = (torch.randn(size, size, device=device, dtype=getattr(torch, dtype)) for _ in range(2))
    out = torch.empty_like(a)
    flops = 2.0 * size**3
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.mm(a, b, out=out)  # the library's first call (handles, heuristics) is no burst
    sync()
    reps, windows, start = 1, [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(reps):
                torch.mm(a, b, out=out)
            end.record()
            end.synchronize()
            elapsed = begin.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                torch.mm(a, b, out=out)
            elapsed = time.perf_counter() - t0
        windows.append([round(time.perf_counter() - start, 3), float(f"{reps * flops / elapsed / 1e12:.4g}")])
        reps = max(1, round(reps * WINDOW_S / max(elapsed, 1e-6)))
    rates = [r for _, r in windows[1:]] or [r for _, r in windows]  # the first window sized the others
    last = rates[-max(1, len(rates) // 3):]
    burst, held = rates[0], float(f"{statistics.median(last):.4g}")
    return {"device": device, "shape": [size, size, size], "dtype": dtype, "seconds": windows[-1][0],
            "windows": windows, "burst_tflops": burst, "sustained_tflops": held,
            "sustained_over_burst": round(held / burst, 4)}


def sustained_stage(args: argparse.Namespace, seconds: float, work: Path) -> dict:
    """`held_gemm` in a child process bounded by `timeout`, beside nvidia-smi's SM clock, power, temperature and
    throttle reasons each second (on a machine that has it)."""
    monitor = None
    if shutil.which("nvidia-smi") and args.device == "cuda":
        query = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
        monitor = subprocess.Popen(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-lms",
                                    "1000"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    code = ("import json, sys; from benchmarks.gpu.harvest import held_gemm; "
            "print(json.dumps(held_gemm(sys.argv[1], float(sys.argv[2]))))")
    argv = ["timeout", "-k", "10", str(int(seconds + 60)), sys.executable, "-c", code, args.device, str(seconds)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=ROOT)
    record: dict = {"exit_code": done.returncode, "budget_s": seconds}
    try:
        record.update(json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        record["stderr_tail"] = done.stderr.splitlines()[-20:]
    if monitor is not None:
        monitor.terminate()
        try:
            lines, _ = monitor.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            monitor.kill()
            lines = ""
        record["nvidia_smi"] = {"columns": query.split(","), "rows": [line.strip() for line in lines.splitlines()
                                                                      if line.strip()]}
    return record


def files_to_pack(work: Path, summary: dict) -> list[tuple[str, Path]]:
    """What comes back, most wanted first: the log, each run's manifest and log (gzipped), the sample store, then
    each run's traces in the runs' order."""
    files: list[tuple[str, Path]] = []
    if (work / "log.txt").exists():
        files.append(("log.txt", work / "log.txt"))
    runs = [r["name"] for r in summary.get("runs", [])]
    for name in runs:
        folder = work / "runs" / name
        for item in ("manifest.json", "train.log"):
            path = folder / item
            if item == "train.log" and path.exists():
                packed = folder / "train.log.gz"
                packed.write_bytes(gzip.compress(path.read_bytes(), 6, mtime=0))
                path, item = packed, "train.log.gz"
            if path.exists():
                files.append((f"runs/{name}/{item}", path))
    store = work / "store"
    if store.exists():
        archive = work / "store.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(store, arcname="store")
        files.append(("store.tar.gz", archive))
    if (work / "sample.err").exists():
        files.append(("sample.err", work / "sample.err"))
    for run in summary.get("runs", []):
        for trace in sorted(run["traces"]):
            path = work / "runs" / run["name"] / trace
            if not trace.endswith(".gz"):  # Megatron ≤ 0.16 and the reference trainer write plain JSON: gzip it
                packed = path.with_name(path.name + ".gz")
                if not packed.exists():
                    with open(path, "rb") as source, gzip.open(packed, "wb", 6) as target:
                        shutil.copyfileobj(source, target)
                path, trace = packed, trace + ".gz"
            files.append((f"runs/{run['name']}/{trace}", path))
    return files


def write_back(args: argparse.Namespace, work: Path, summary: dict, clock: Clock) -> dict:
    """Pack what is there now into --out (replacing an earlier pack of this harvest)."""
    for old in list(args.out.glob("harvest*")):
        old.unlink()
    index = pack(files_to_pack(work, summary), args.out, summary, args.max_files, args.max_bytes)
    sizes = {p.name: p.stat().st_size for p in sorted(args.out.glob("harvest*"))}
    clock.say(f"packed {len(index['pack']['files'])} files into {len(sizes)} ({sum(sizes.values()) / 2**20:.1f} MiB); "
              f"left out: {len(index['pack']['left_out'])}")
    return index


def harvest(args: argparse.Namespace) -> dict:
    args.out.mkdir(parents=True, exist_ok=True)
    # the launched runs import tracekit (the capture hook, the reference trainer) from this source tree
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    work = args.work or Path(tempfile.mkdtemp(prefix="tracekit-harvest-"))
    work.mkdir(parents=True, exist_ok=True)
    clock = Clock(args.budget, work / "log.txt")
    summary: dict = {"format": "tracekit-gpu-harvest/1", "device": args.device, "budget_s": args.budget,
                     "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": [], "skipped": []}
    reserve = PACK_SECONDS + (args.sample_seconds + 15 if "sample" in args.stage_list else 0)
    if "env" in args.stage_list:
        summary["env"] = environment(args.device)
        env = summary["env"]
        clock.say(f"env: {env.get('devices') or env['hardware']}, torch {env['torch']}, "
                  f"transformer_engine {env['transformer_engine']}")
    if "sustained" in args.stage_list:  # first: the GPU starts cool, so the burst is a burst
        seconds = min(args.sustained_seconds, clock.left() - reserve - 15)
        if seconds >= 5:
            held = summary["sustained"] = sustained_stage(args, seconds, work)
            clock.say(f"sustained: exit {held['exit_code']}, {held.get('dtype')} {held.get('shape')}: burst "
                      f"{held.get('burst_tflops')} TFLOP/s, held {held.get('sustained_tflops')} TFLOP/s")
        else:
            summary["skipped"].append({"name": "sustained", "reason": f"{seconds:.0f} s left for it"})
    if "megatron" in args.stage_list:
        tree = None
        if args.device == "cuda":
            tree = megatron_tree(args.megatron, work)
            from tracekit.capture.megatron_version import read_package_info

            summary["megatron"] = {"source": args.megatron.name, "tree": tree.name,
                                   "version": read_package_info(tree / "megatron" / "core" / "package_info.py")}
            os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
        has_te = importlib.util.find_spec("transformer_engine") is not None
        for name in args.run_list:
            if args.device == "cuda" and configs.BY_NAME[name].te and not has_te:
                summary["skipped"].append({"name": name, "reason": "no Transformer Engine on this machine"})
                continue
            cap = configs.BY_NAME[name].seconds if args.device == "cuda" else 120
            seconds = int(min(cap, clock.left() - reserve))
            if seconds < (MIN_RUN if args.device == "cuda" else 20):
                summary["skipped"].append({"name": name, "reason": f"{max(seconds, 0)} s left for it"})
                clock.say(f"{name} skipped: {max(seconds, 0)} s left for it")
                continue
            record = capture_run(args, name, tree, seconds, work)
            summary["runs"].append(record)
            clock.say(f"{name}: {record['status']} (exit {record['exit_code']}) in {record['seconds']} s, "
                      f"measured {record['measured_ms']} ms/iteration, {len(record['traces'])} traces")
            write_back(args, work, summary, clock)
    if "sample" in args.stage_list:
        seconds = min(args.sample_seconds, clock.left() - PACK_SECONDS - 15)
        if seconds >= 10:
            summary["sample"] = sample_stage(args, seconds, work)
            clock.say(f"sample: exit {summary['sample']['exit_code']}, {summary['sample'].get('samples')}")
        else:
            summary["skipped"].append({"name": "sample", "reason": f"{seconds:.0f} s left for it"})
    summary["seconds"] = round(time.time() - clock.t0, 1)
    clock.say(f"done in {summary['seconds']} s of {args.budget:g}")
    return write_back(args, work, summary, clock)


def main(argv: list[str] | None = None) -> int:
    try:
        args = check(parse(argv))
        index = harvest(args)
    except (KitError, PackError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failed = [r["name"] for r in index["runs"] if r["status"] != "ok"]
    return 1 if failed or index["pack"]["left_out"] else 0


if __name__ == "__main__":
    sys.exit(main())
