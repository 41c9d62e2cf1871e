"""Ingest speed and memory: tracekit vs HTA's TraceAnalysis vs a bare orjson parse, on the whole Kineto corpus;
then folders of small traces, tracekit vs HTA side by side; then tracekit alone on a ≥ 1 GB trace built by
repeating a corpus trace's iterations.

Each tool runs in its own subprocess (fresh interpreter, imports included in neither timing) and its peak
resident memory is read from the kernel (`wait4` → ru_maxrss). Throughput is MB of uncompressed JSON per second
of wall time, from file path to result (read, gunzip, parse, analyse). The whole corpus is ingested by one
tracekit process (`jobs=1`), so its CPU time and memory compare with HTA's loader of one file at a time.

Small traces (`SMALL_FOLDERS`): a folder of small traces is where start-up and per-file costs show. Each folder is
given whole to each tool, both using every core: tracekit as `ingest_paths([folder])` (this process and forked
workers parse the files, this process commits them to the store), HTA as `TraceAnalysis(trace_dir=folder)` for the
ranks of one job (its loader parses ranks in parallel processes) or one `TraceAnalysis` per trace for a folder of
unrelated traces (HTA reads a folder as one job's ranks). Measured three times per repeat, the tools alternating:
in a fresh process with the imports done before the clock; as the whole command from a fresh interpreter
(`tracekit ingest FOLDER --store S --json` / `python -c` HTA), start-up included, both from cached bytecode as
installed tools run (a first, untimed run of each writes tracekit's caches); and each tool's start-up alone
(`STARTUP`), which bounds what the whole command's ratio can be. Each is timed in wall seconds and in CPU seconds
(user + system, worker processes included), the latter less sensitive to other jobs on a shared machine. The
median over `--repeats` and the range are printed.

    python benchmarks/ingest.py [--corpus DIR] [--repeats 5] [--big-gb 1.0] [--skip-big] [--skip-corpus]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = ROOT.parent / "shared" / "corpus" / "kineto"
BIG_SOURCE = "hta/nccl_parser_config_nccl_data.json.gz"  # 2-rank DDP on A100, 3 ProfilerSteps
#: Folders of small traces: (name, corpus files, whether they are the ranks of one job).
SMALL_FOLDERS = (
    ("dlrm_8rank: one 8-rank job", ["param/dlrm_8rank/" + name for name in (
        "worker0_step_12.1694128201545.pt.trace.json.gz", "worker1_step_12.1694128201556.pt.trace.json.gz",
        "worker2_step_12.1694128201554.pt.trace.json.gz", "worker3_step_12.1694128201557.pt.trace.json.gz",
        "worker4_step_12.1694128201547.pt.trace.json.gz", "worker5_step_12.1694128201549.pt.trace.json.gz",
        "worker6_step_12.1694128201553.pt.trace.json.gz", "worker7_step_12.1694128201553.pt.trace.json.gz")], True),
    ("ten single-rank traces of 0.07-10 MB", [
        "hta/amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz",
        "hta/critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz",
        "hta/with_gpu_user_annotation_step_based_trace_2543932.json.gz",
        "tracelens/h100__gaunernst_bert-small-uncased__1016001.json.gz",
        "hta/trace_filter_sampled_rank-1.json.gz", "hta/timeline_analysis_sampled_rank-0.json.gz",
        "deepseek/train.json", "tracelens/h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
        "tracelens/mi300__ddp_resnet18_no_pool__train_resnet18.json.gz", "hta/nccl_parser_config_nccl_data.json.gz"],
     False),
)

# --- the three workloads, each run as `python benchmarks/ingest.py --worker KIND FILES...` ----------------------


def _work_tracekit(files: list[str]) -> None:
    from extractors.kineto import ingest_paths
    from tracekit.core.store import SampleStore

    with tempfile.TemporaryDirectory() as store:
        result = ingest_paths(files, SampleStore(store), jobs=1)  # one process: CPU time and peak memory compare
    print(json.dumps({"ok": len(result.traces), "failed": len(result.errors)}))


def _work_tracekit_folder(folders: list[str]) -> None:
    """A folder given whole, every core (the command's default)."""
    from extractors.kineto import ingest_paths
    from tracekit.core.store import SampleStore

    with tempfile.TemporaryDirectory() as store:
        result = ingest_paths(folders, SampleStore(store))
    print(json.dumps({"ok": len(result.traces), "failed": len(result.errors)}))


def _work_hta_folder(folders: list[str]) -> None:
    """A folder of one job's ranks, loaded as HTA loads a run (its ranks parsed in parallel processes)."""
    import logging
    import warnings

    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_dir=folders[0], include_last_profiler_step=True)
    print(json.dumps({"ok": len(analysis.t.traces), "failed": 0}))


def _work_hta(files: list[str]) -> None:
    import logging
    import warnings

    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    from hta.trace_analysis import TraceAnalysis

    ok = failed = 0
    for path in files:
        with tempfile.TemporaryDirectory() as folder:
            os.symlink(os.path.abspath(path), os.path.join(folder, os.path.basename(path)))
            try:
                TraceAnalysis(trace_dir=folder, include_last_profiler_step=True)
                ok += 1
            except Exception:
                failed += 1
    print(json.dumps({"ok": ok, "failed": failed}))


def _work_orjson(files: list[str]) -> None:
    import orjson

    for path in files:
        data = Path(path).read_bytes()
        if path.endswith(".gz"):
            data = gzip.decompress(data)
        orjson.loads(data)
        del data
    print(json.dumps({"ok": len(files), "failed": 0}))


WORKERS = {"tracekit": _work_tracekit, "hta": _work_hta, "orjson": _work_orjson,
           "tracekit-folder": _work_tracekit_folder, "hta-folder": _work_hta_folder}


def run_worker(kind: str, files: list) -> dict:
    """Run one workload in a subprocess; wall seconds (excluding interpreter start + imports) and peak RSS."""
    code = (
        "import sys, time, json; sys.path.insert(0, %r); import benchmarks.ingest as b; "
        "b._preload(%r); c = b.cpu_time(); t = time.perf_counter(); b.WORKERS[%r](sys.argv[1:]); "
        "print(json.dumps({'seconds': time.perf_counter() - t, 'cpu': b.cpu_time() - c}))" % (str(ROOT), kind, kind)
    )
    proc = subprocess.Popen([sys.executable, "-c", code, *map(str, files)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, cwd=ROOT)
    out = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} worker failed (exit {proc.returncode})")
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    result = {k: v for line in lines for k, v in line.items()}
    result["peak_rss_mb"] = usage.ru_maxrss / 1024
    return result


def cpu_time() -> float:
    """CPU seconds used by this process and its finished children (HTA may parse in worker processes)."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _preload(kind: str) -> None:
    """Import each tool's modules before the clock starts (interpreter/import time is not ingest time)."""
    if kind.startswith("tracekit"):
        import extractors.kineto  # noqa: F401
        import tracekit.core.store  # noqa: F401
    elif kind.startswith("hta"):
        import hta.trace_analysis  # noqa: F401
    else:
        import orjson  # noqa: F401


def uncompressed_size(path: Path) -> int:
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as handle:
            return sum(len(chunk) for chunk in iter(lambda: handle.read(1 << 24), b""))
    return path.stat().st_size


# --- folders of small traces ----------------------------------------------------------------------------------


#: The whole commands run as an installed tool runs: from cached bytecode (HTA's and the libraries' were compiled when
#: they were installed; tracekit's source tree gets its caches from the untimed first run of each folder).
COMMAND_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run_command(argv: list[str]) -> tuple[float, float]:
    """Wall seconds of a whole command, from exec to exit (interpreter start and imports included), and its CPU
    seconds (user + system, its worker processes included: `wait4` counts the children it waited for)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=COMMAND_ENV)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):  # 1: some files refused (tracekit's exit code for a partial ingest)
        raise RuntimeError(f"{argv[:3]} failed (exit {proc.returncode})")
    return wall, usage.ru_utime + usage.ru_stime


def hta_command(folder: Path, one_job: bool) -> list[str]:
    loader = ("TraceAnalysis(trace_dir=%r, include_last_profiler_step=True)" % str(folder) if one_job else
              "[TraceAnalysis(trace_dir=d, include_last_profiler_step=True) for d in sorted(glob.glob(%r))]"
              % str(folder.parent / "hta-one-each" / "*"))
    return [sys.executable, "-c", "import glob, logging, warnings; logging.disable(logging.CRITICAL); "
            "warnings.simplefilter('ignore'); from hta.trace_analysis import TraceAnalysis; " + loader]


#: Start-up alone, what every command of each tool spends before its first file: the interpreter and the imports
#: (tracekit's CLI, the parser, numpy and pyarrow with its Parquet writer, as `tracekit ingest` imports them; HTA's
#: TraceAnalysis).
STARTUP = {
    "tracekit": [sys.executable, "-c", "from tracekit.cli import main; import pyarrow.parquet, "
                 "extractors.kineto.ingest, tracekit.core.store"],
    "hta": [sys.executable, "-c", "import logging, warnings; from hta.trace_analysis import TraceAnalysis"],
}


def small_folders(corpus: Path, repeats: int) -> None:
    """Each folder of SMALL_FOLDERS, tracekit and HTA alternating, `repeats` times: in-process and whole-command
    wall time, medians and ranges, and their ratios; and each tool's start-up alone, which bounds the whole-command
    ratio: HTA's whole command over tracekit's start-up is the most any tracekit ingest could reach."""
    tracekit_cli = [sys.executable, "-c", "from tracekit.cli import main; main()"]
    for name, members, one_job in SMALL_FOLDERS:
        with tempfile.TemporaryDirectory() as base:
            folder = Path(base) / "traces"
            folder.mkdir()
            for member in members:
                os.symlink(corpus / member, folder / Path(member).name)
            one_each = Path(base) / "hta-one-each"  # HTA: a folder per trace (a folder is the ranks of one job)
            for member in members:
                (one_each / Path(member).name).mkdir(parents=True)
                os.symlink(corpus / member, one_each / Path(member).name / Path(member).name)
            mb = sum(uncompressed_size(corpus / m) for m in members) / 1e6
            print(f"\nsmall traces: {name}, {len(members)} files, {mb:.1f} MB uncompressed JSON")
            times: dict[str, list[float]] = {k: [] for k in ("tk", "hta", "tk-cmd", "hta-cmd", "tk-up", "hta-up",
                                                                 "tk-cpu", "hta-cpu", "tk-cmd-cpu", "hta-cmd-cpu",
                                                                 "tk-up-cpu", "hta-up-cpu")}
            counts = {}
            with tempfile.TemporaryDirectory() as store:  # untimed: caches (bytecode, the OS's file cache) as in use
                run_command([*tracekit_cli, "ingest", str(folder), "--store", store, "--json"])
                run_command(hta_command(folder, one_job))
            for _ in range(repeats):
                tk = run_worker("tracekit-folder", [folder])
                hta = run_worker("hta-folder", [folder]) if one_job else run_worker(
                    "hta", [one_each / Path(m).name / Path(m).name for m in members])
                counts = {"tracekit": (tk["ok"], tk["failed"]), "hta": (hta["ok"], hta["failed"])}
                times["tk"].append(tk["seconds"])
                times["hta"].append(hta["seconds"])
                times["tk-cpu"].append(tk["cpu"])  # the processes' and their workers' CPU time: the work done,
                times["hta-cpu"].append(hta["cpu"])  # less sensitive than wall time to other jobs on the cores
                with tempfile.TemporaryDirectory() as store:
                    timed = {"tk-cmd": run_command([*tracekit_cli, "ingest", str(folder), "--store", store, "--json"])}
                timed["hta-cmd"] = run_command(hta_command(folder, one_job))
                timed["tk-up"] = run_command(STARTUP["tracekit"])
                timed["hta-up"] = run_command(STARTUP["hta"])
                for key, (wall, cpu) in timed.items():
                    times[key].append(wall)
                    times[f"{key}-cpu"].append(cpu)  # CPU time: the work done, less sensitive to other jobs
            print(f"  ok/failed: tracekit {counts['tracekit'][0]}/{counts['tracekit'][1]}, "
                  f"HTA {counts['hta'][0]}/{counts['hta'][1]}")
            for label, tk_key, hta_key in (("in process (imports before the clock)", "tk", "hta"),
                                           ("in process, CPU s (all processes)", "tk-cpu", "hta-cpu"),
                                           ("whole command (start-up included)", "tk-cmd", "hta-cmd"),
                                           ("whole command, CPU s (all processes)", "tk-cmd-cpu", "hta-cmd-cpu"),
                                           ("start-up alone (interpreter, imports)", "tk-up", "hta-up"),
                                           ("start-up alone, CPU s", "tk-up-cpu", "hta-up-cpu")):
                tk_t, hta_t = times[tk_key], times[hta_key]
                ratios = [h / t for h, t in zip(hta_t, tk_t)]
                print(f"  {label:40s} tracekit {statistics.median(tk_t):5.2f} s ({min(tk_t):.2f}-{max(tk_t):.2f})"
                      f"   HTA {statistics.median(hta_t):5.2f} s ({min(hta_t):.2f}-{max(hta_t):.2f})"
                      f"   HTA/tracekit {statistics.median(hta_t) / statistics.median(tk_t):5.2f}x "
                      f"(per repeat {min(ratios):.2f}-{max(ratios):.2f}x)")
            bound = statistics.median(times["hta-cmd"]) / statistics.median(times["tk-up"])
            bound_cpu = statistics.median(times["hta-cmd-cpu"]) / statistics.median(times["tk-up-cpu"])
            print(f"  HTA's whole command / tracekit's start-up alone: {bound:5.2f}x wall, {bound_cpu:5.2f}x CPU (the "
                  f"whole-command ratio of an ingest taking no time)")


# --- the ≥ 1 GB trace -----------------------------------------------------------------------------------------


def build_big_trace(source: Path, target: Path, gigabytes: float) -> tuple[int, int]:
    """Repeat the source trace's events (its iterations) until the JSON is ≥ `gigabytes`; every copy is shifted
    in time by the source's span and gets fresh External id / correlation / flow ids and step numbers."""
    import orjson

    data = orjson.loads(gzip.decompress(source.read_bytes()))
    events = data.pop("traceEvents")
    data.pop("metadata", None)
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - t0
    id_stride = 10 ** 7
    header = orjson.dumps(data)[:-1] + b',"traceEvents":['
    one_copy = len(orjson.dumps(events))
    copies = max(1, int(gigabytes * 1e9 / one_copy) + 1)
    step_names = sorted({e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")})
    with open(target, "wb") as out:
        out.write(header)
        for copy in range(copies):
            shift = copy * (span + 1000.0)
            renamed = {name: f"ProfilerStep#{copy * len(step_names) + i + 1}" for i, name in enumerate(step_names)}
            chunk = []
            for e in events:
                e = dict(e)
                if isinstance(e.get("ts"), (int, float)):
                    e["ts"] = e["ts"] + shift
                if "id" in e and isinstance(e["id"], int):
                    e["id"] += copy * id_stride
                args = e.get("args")
                if isinstance(args, dict):
                    args = dict(args)
                    for key in ("External id", "correlation"):
                        if isinstance(args.get(key), int):
                            args[key] += copy * id_stride
                    e["args"] = args
                if e.get("name") in renamed:
                    e["name"] = renamed[e["name"]]
                chunk.append(orjson.dumps(e))
            out.write((b"," if copy else b"") + b",".join(chunk))
        out.write(b"]}")
    return copies, target.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--big-gb", type=float, default=1.0)
    parser.add_argument("--skip-big", action="store_true")
    parser.add_argument("--skip-corpus", action="store_true", help="only the small-trace folders (and the big trace)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats of the small-trace folders (default 5)")
    args = parser.parse_args()
    print(f"command: python benchmarks/ingest.py {' '.join(sys.argv[1:])}")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start")
    if not args.skip_corpus:
        whole_corpus(args.corpus)
    small_folders(args.corpus, args.repeats)
    print(f"load average {os.getloadavg()[0]:.1f} at the end of the small-trace folders")
    if not args.skip_big:
        big_trace(args.corpus, args.big_gb)


def whole_corpus(corpus: Path) -> None:
    files = sorted(p for p in corpus.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))
    total_mb = sum(uncompressed_size(p) for p in files) / 1e6
    print(f"corpus: {len(files)} Kineto files, {total_mb:.1f} MB uncompressed JSON ({corpus})")
    results = {kind: run_worker(kind, files) for kind in ("orjson", "tracekit", "hta")}
    tk, hta, floor = results["tracekit"], results["hta"], results["orjson"]
    print()
    print(f"{'tool':32s} {'ok/failed':>9s} {'wall s':>7s} {'MB/s':>6s} {'CPU s':>7s} {'MB/CPU-s':>8s} "
          f"{'peak RSS MiB':>12s}")
    labels = {"orjson": "bare orjson parse (floor)", "tracekit": "tracekit ingest (to a store)",
              "hta": "HTA TraceAnalysis load"}
    for kind in ("orjson", "tracekit", "hta"):
        r = results[kind]
        print(f"{labels[kind]:32s} {r['ok']:>4d}/{r['failed']:<4d} {r['seconds']:7.2f} {total_mb / r['seconds']:6.1f} "
              f"{r['cpu']:7.2f} {total_mb / r['cpu']:8.1f} {r['peak_rss_mb']:12.0f}")
    print()
    print("ratios (wall / CPU time)")
    print(f"  throughput  tracekit / HTA        : {hta['seconds'] / tk['seconds']:5.2f}x / "
          f"{hta['cpu'] / tk['cpu']:5.2f}x   (goal >= 5x)")
    print(f"  time        tracekit / bare parse : {tk['seconds'] / floor['seconds']:5.2f}x / "
          f"{tk['cpu'] / floor['cpu']:5.2f}x   (goal <= 3x)")
    print(f"  peak memory tracekit / HTA        : {tk['peak_rss_mb'] / hta['peak_rss_mb']:5.2f}x   (goal <= 1x)")


def big_trace(corpus: Path, gigabytes: float) -> None:
    source = corpus / BIG_SOURCE
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        big = Path(folder) / "big.pt.trace.json"
        copies, size = build_big_trace(source, big, gigabytes)
        print()
        print(f"big trace: built by repeating all {copies}x the iterations of {BIG_SOURCE} "
              f"(3 ProfilerSteps each, ids and times shifted): {size / 1e9:.2f} GB uncompressed JSON")
        # no bare-parse run here: orjson's Python objects for 1 GB of events need several times the file in RAM
        tk_big = run_worker("tracekit", [big])
        print(f"{'tracekit ingest (to a store)':32s} {tk_big['seconds']:7.2f} s wall "
              f"{size / 1e6 / tk_big['seconds']:6.1f} MB/s {tk_big['cpu']:7.2f} s CPU "
              f"{size / 1e6 / tk_big['cpu']:6.1f} MB/CPU-s "
              f"{tk_big['peak_rss_mb']:8.0f} MiB peak RSS")
        print(f"  tracekit peak RSS / file size     : {tk_big['peak_rss_mb'] * 2**20 / size:5.2f}x   (goal < 2x)")


if __name__ == "__main__":
    main()
