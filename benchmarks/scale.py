"""Scale-out: the same work in one local process and as Ray tasks on a local Ray, in one run.

(a) search over ≥ 10⁵ configurations (a GPT-3 175B-shaped job on 1,536 GPUs, sequence 6,144, context parallelism
    opened: 124,188 candidates): one process vs `--executor ray` with 2 workers; configs/s, speedup, peak RSS of
    the process and of each Ray worker. Both rankings must be identical (checked, printed).
(b) ingest of a 256-rank trace set built from a corpus rank (copies of hta/nccl_parser_config_nccl_data with rank
    ids, world size and timestamps rewritten, written to a temporary folder) with `--jobs 1`, `--jobs 2` and
    `--executor ray`, beside HTA's `TraceAnalysis` on the same folder: wall time, CPU time, peak RSS.

Every run is its own subprocess (imports done before the clock starts; Ray's start-up is timed apart). Peak RSS is
the kernel's high-water mark: `wait4` for a process and its children, VmHWM of each Ray worker process.
`--quick` runs a smaller search (175B on 1,024 GPUs, cp closed: 5,466 candidates) and 64 ranks, for development.
`--compare-rev REV` also times the search code of an earlier commit (`git archive`) on a sample of the same
candidates (before/after).

    python benchmarks/scale.py [--quick] [--ranks N] [--compare-rev REV] [--sample N]
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
#: Rank 0 of a 2-rank DDP job on A100s (3 ProfilerSteps, 2,700 kernels, 21 NCCL collectives): ~8 MB of JSON a rank.
SOURCE_RANK = ROOT.parent / "shared" / "corpus" / "kineto" / "hta" / "nccl_parser_config_nccl_data.json.gz"
SEARCH_JOBS = {  # (Megatron arguments, GPUs, context parallelism opened)
    "full": ("--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 6144 "
             "--global-batch-size 1536 --bf16", 1536, True),
    "quick": ("--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 "
              "--global-batch-size 1536 --bf16", 1024, False),
}
CLUSTER = "dgx-a100"
RAY_OPTIONS = {"num_cpus": 2, "object_store_memory": 256 * 1024 * 1024}


# --- workloads, each run as `python benchmarks/scale.py --worker NAME ARG...` ---------------------------------------


def _search_setup(size: str):
    from extractors.jobs.megatron import parse_megatron_argv
    from predictor.costs.learned.models import ModelSet
    from tracekit.core.cluster import preset
    from tracekit.core.stacks import DEFAULT, get_stack

    args, gpus, cp = SEARCH_JOBS[size]
    profile, cluster = get_stack(DEFAULT), preset(CLUSTER)
    base = {**profile.config, **parse_megatron_argv(args)}
    return base, gpus, cp, cluster, ModelSet.load(), profile.calibration(cluster.hardware)


def _ranking_digest(candidates) -> str:
    return hashlib.sha256(orjson.dumps([(c["config"], c["iteration_time_s"]) for c in candidates],
                                       option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def _work_search(size: str, executor: str) -> dict:
    from predictor.sweeps.search import search

    base, gpus, cp, cluster, models, calibration = _search_setup(size)
    runner, started = None, 0.0
    if executor == "ray":
        from predictor.sweeps.ray_executor import RayExecutor
        from tracekit.core.ray_runtime import connect

        t = time.perf_counter()
        connect(**RAY_OPTIONS)
        started = time.perf_counter() - t
        runner = RayExecutor()
    t = time.perf_counter()
    result = search(base, gpus, cluster, models, calibration=calibration, executor=runner, context_parallel=cp)
    seconds = time.perf_counter() - t
    configs = len(result.candidates) + sum(result.pruned.values())
    return {"configs": configs, "seconds": seconds, "ray_start_s": started, "pruned": result.pruned,
            "ranked": len(result.candidates), "digest": _ranking_digest(result.candidates),
            "workers_peak_mb": _ray_workers_peak_mb() if executor == "ray" else []}


def _work_search_sample(size: str, sample: int) -> dict:
    """`evaluate` (this checkout's, or an earlier one's on PYTHONPATH) on a fixed random sample of the candidates,
    given as their settings so that any version can rebuild them."""
    from predictor.sweeps import search as S
    from tracekit.core.config import TrainingConfig

    base, gpus, cp, cluster, models, calibration = _search_setup(size)
    splits = json.loads(Path(os.environ["SCALE_SAMPLE"]).read_text())
    configs = [TrainingConfig.from_mapping({**base, **split, "world_size": gpus}) for split in splits]
    S.evaluate(configs[:8], cluster, models, calibration, gpus)  # warm-up: boosters loaded, imports done
    t = time.perf_counter()
    rows, pruned = S.evaluate(configs, cluster, models, calibration, gpus)
    seconds = time.perf_counter() - t
    rows.sort(key=lambda r: orjson.dumps(r["config"], option=orjson.OPT_SORT_KEYS))
    return {"configs": len(configs), "seconds": seconds, "pruned": pruned,
            "digest": _ranking_digest(rows)}


def _work_ingest(folder: str, mode: str) -> dict:
    from extractors.kineto import ingest_paths
    from tracekit.core.store import SampleStore

    started = 0.0
    if mode == "ray":
        from tracekit.core.ray_runtime import connect

        t = time.perf_counter()
        connect(**RAY_OPTIONS)
        started = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as store:
        t = time.perf_counter()
        if mode == "ray":
            result = ingest_paths([folder], SampleStore(store), executor="ray")
        else:
            result = ingest_paths([folder], SampleStore(store), jobs=int(mode))
        seconds = time.perf_counter() - t
    return {"seconds": seconds, "ray_start_s": started, "ok": len(result.traces), "failed": len(result.errors),
            "samples": sum(r["samples_written"] for r in result.traces), "matched": result.matched_collectives,
            "workers_peak_mb": _ray_workers_peak_mb() if mode == "ray" else []}


def _work_hta(folder: str) -> dict:
    import logging
    import warnings

    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    from hta.trace_analysis import TraceAnalysis

    t = time.perf_counter()
    analysis = TraceAnalysis(trace_dir=folder)
    return {"seconds": time.perf_counter() - t, "ok": len(analysis.t.traces), "failed": 0}


def _ray_workers_peak_mb() -> list[float]:
    """Peak RSS (VmHWM) of each Ray worker process of this session that ran work (the driver's descendants)."""
    import psutil

    peaks = []
    for proc in psutil.Process().children(recursive=True):
        try:
            command = " ".join(proc.cmdline())
            if not (command.startswith("ray::") or "default_worker.py" in command):  # Ray retitles its workers
                continue
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except (psutil.Error, OSError):
            continue
        hwm = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
        peaks.append(hwm / 1024)
    return sorted(peaks, reverse=True)


def _preload(name: str) -> None:
    if name.startswith("search"):
        import predictor.costs.learned.models  # noqa: F401
        import predictor.sweeps.search  # noqa: F401
    elif name == "ingest":
        import extractors.kineto  # noqa: F401
        import tracekit.core.store  # noqa: F401
    else:
        import hta.trace_analysis  # noqa: F401


WORKERS = {"search": _work_search, "search-sample": _work_search_sample, "ingest": _work_ingest, "hta": _work_hta}


def run(name: str, *args, pythonpath: str | None = None) -> dict:
    """One workload in a fresh interpreter: its JSON result + wall, CPU (children included) and peak RSS (MiB)."""
    code = ("import sys, json, resource, time; sys.path.insert(0, %r); import benchmarks.scale as b; "
            "b._preload(%r); u = lambda: sum(getattr(resource.getrusage(w), f) for w in (resource.RUSAGE_SELF, "
            "resource.RUSAGE_CHILDREN) for f in ('ru_utime', 'ru_stime')); c = u(); "
            "r = b.WORKERS[%r](*sys.argv[1:]); r['cpu'] = u() - c; print('RESULT ' + json.dumps(r))"
            % (pythonpath or str(ROOT), name, name))
    env = dict(os.environ, PYTHONPATH=pythonpath or str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, cwd=ROOT, env=env)
    out = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{name} {args} failed (exit {os.waitstatus_to_exitcode(status)})")
    result = json.loads(next(line[7:] for line in out.splitlines() if line.startswith("RESULT ")))
    result["peak_mb"] = usage.ru_maxrss / 1024  # the process or its largest child
    return result


# --- the 256-rank trace set -------------------------------------------------------------------------------------


def build_ranks(target: Path, ranks: int) -> tuple[int, int]:
    """`ranks` copies of the corpus rank SOURCE_RANK with `distributedInfo` rank and world size rewritten and every
    timestamp shifted by r·37 µs (rank r); gzip level 1. Returns (files, uncompressed bytes)."""
    source = orjson.loads(gzip.decompress(SOURCE_RANK.read_bytes()))
    total = 0
    for rank in range(ranks):
        doc = dict(source)
        doc["distributedInfo"] = {**source.get("distributedInfo", {}), "rank": rank, "world_size": ranks}
        shift = rank * 37.0
        doc["traceEvents"] = [{**e, "ts": e["ts"] + shift} if isinstance(e.get("ts"), (int, float)) else e
                              for e in source["traceEvents"]]
        data = orjson.dumps(doc).replace(b'"rank":', b'"rank": ')  # HTA finds a file's rank by '"rank":\s+N'
        total += len(data)
        (target / f"rank{rank:04d}.pt.trace.json.gz").write_bytes(gzip.compress(data, compresslevel=1))
    return ranks, total


# --- the report ---------------------------------------------------------------------------------------------------


def _workers(peaks: list[float]) -> str:
    return ", ".join(f"{p:.0f}" for p in peaks[:4]) or "n/a"


def search_part(size: str, compare_rev: str | None, sample: int) -> None:
    args, gpus, cp = SEARCH_JOBS[size]
    print(f"(a) search: {args} on {gpus} GPUs ({CLUSTER}){', context parallelism opened' if cp else ''}")
    local = run("search", size, "local")
    ray = run("search", size, "ray")
    print(f"    {local['configs']:,} configurations: {local['pruned']['invalid']:,} refused as Megatron would, "
          f"{local['pruned']['memory']:,} pruned for memory, {local['ranked']:,} predicted and ranked")
    print(f"    {'executor':28s} {'wall s':>8s} {'configs/s':>10s} {'CPU s':>8s} {'peak RSS MiB':>13s} "
          f"{'workers MiB':>12s}")
    for label, r in (("local (one process)", local), ("Ray, 2 workers (local Ray)", ray)):
        print(f"    {label:28s} {r['seconds']:8.1f} {r['configs'] / r['seconds']:10.0f} {r['cpu']:8.1f} "
              f"{r['peak_mb']:13.0f} {_workers(r['workers_peak_mb']):>12s}")
    print(f"    speedup Ray / local: {local['seconds'] / ray['seconds']:.2f}x (wall); Ray's start-up "
          f"{ray['ray_start_s']:.1f} s not included; rankings identical: {local['digest'] == ray['digest']}")
    if compare_rev:
        _before_after(size, compare_rev, sample)


def _before_after(size: str, rev: str, sample: int) -> None:
    sys.path.insert(0, str(ROOT))
    from predictor.sweeps.search import SEARCH_KEYS, enumerate_configs

    base, gpus, cp, _, _, _ = _search_setup(size)
    configs, _ = enumerate_configs(base, gpus, set(), cp)
    chosen = random.Random(0).sample(configs, min(sample, len(configs)))
    splits = [{**{k: getattr(c, k) for k in SEARCH_KEYS}, "data_parallel_size": c.dp} for c in chosen]
    with tempfile.TemporaryDirectory() as folder:
        old = Path(folder) / "old"
        old.mkdir()
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        (old / "benchmarks" / "scale.py").write_bytes(Path(__file__).read_bytes())  # this harness, their code
        os.environ["SCALE_SAMPLE"] = str(Path(folder) / "sample.json")
        Path(os.environ["SCALE_SAMPLE"]).write_text(json.dumps(splits))
        before = run("search-sample", size, sample, pythonpath=str(old))
        after = run("search-sample", size, sample)
    print(f"    before/after on {len(chosen):,} sampled candidates, one process: {rev[:10]} "
          f"{before['configs'] / before['seconds']:.0f} configs/s, now {after['configs'] / after['seconds']:.0f} "
          f"configs/s ({before['seconds'] / after['seconds']:.1f}x); "
          f"same results: {before['digest'] == after['digest']}")


def ingest_part(ranks: int) -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        files, size = build_ranks(Path(folder), ranks)
        print(f"(b) ingest: {files} rank traces, copies of the corpus rank {SOURCE_RANK.name} with rank ids, world "
              f"size and timestamps rewritten, written to a temporary folder: {size / 1e6:.0f} MB of JSON")
        results = {"--jobs 1": run("ingest", folder, "1"), "--jobs 2": run("ingest", folder, "2"),
                   "--executor ray (2 workers)": run("ingest", folder, "ray"),
                   "HTA TraceAnalysis": run("hta", folder)}
    print(f"    {'tool':28s} {'ok/failed':>9s} {'wall s':>7s} {'MB/s':>6s} {'CPU s':>7s} {'peak RSS MiB':>13s} "
          f"{'workers MiB':>12s}")
    for label, r in results.items():
        print(f"    {label:28s} {r['ok']:>4d}/{r['failed']:<4d} {r['seconds']:7.1f} {size / 1e6 / r['seconds']:6.1f} "
              f"{r['cpu']:7.1f} {r['peak_mb']:13.0f} {_workers(r.get('workers_peak_mb', [])):>12s}")
    one, hta = results["--jobs 1"], results["HTA TraceAnalysis"]
    print("    ratios (wall time)")
    for label in ("--jobs 2", "--executor ray (2 workers)"):
        print(f"      {label:26s} vs --jobs 1: {one['seconds'] / results[label]['seconds']:5.2f}x faster")
    for label in ("--jobs 1", "--jobs 2", "--executor ray (2 workers)"):
        print(f"      HTA / tracekit {label:14s}: {hta['seconds'] / results[label]['seconds']:5.2f}x (time), "
              f"peak memory tracekit/HTA {results[label]['peak_mb'] / hta['peak_mb']:.2f}x")
    same = {r["samples"] for k, r in results.items() if k != "HTA TraceAnalysis"}
    print(f"    samples written, every tracekit mode: {sorted(same)}; Ray's start-up "
          f"{results['--executor ray (2 workers)']['ray_start_s']:.1f} s not included")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller search (5,466 candidates) and 64 ranks")
    parser.add_argument("--ranks", type=int, default=None, help="ranks of the built trace set (default 256)")
    parser.add_argument("--compare-rev", default=None, help="also time this commit's search code (before/after)")
    parser.add_argument("--sample", type=int, default=2000, help="candidates timed for --compare-rev")
    parser.add_argument("--skip-search", action="store_true")
    parser.add_argument("--skip-ingest", action="store_true")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start")
    if not args.skip_search:
        search_part("quick" if args.quick else "full", args.compare_rev, args.sample)
    if not args.skip_ingest:
        ingest_part(args.ranks or (64 if args.quick else 256))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
