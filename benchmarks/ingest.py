"""Ingest speed and memory: tracekit vs HTA's TraceAnalysis vs a bare orjson parse, on the whole Kineto corpus;
then tracekit alone on a ≥ 1 GB trace built by repeating a corpus trace's iterations.

Each tool runs in its own subprocess (fresh interpreter, imports included in neither timing) and its peak
resident memory is read from the kernel (`wait4` → ru_maxrss). Throughput is MB of uncompressed JSON per second
of wall time, from file path to result (read, gunzip, parse, analyse).

    python benchmarks/ingest.py [--corpus DIR] [--big-gb 1.0] [--skip-big]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = ROOT.parent / "shared" / "corpus" / "kineto"
BIG_SOURCE = "hta/nccl_parser_config_nccl_data.json.gz"  # 2-rank DDP on A100, 3 ProfilerSteps

# --- the three workloads, each run as `python benchmarks/ingest.py --worker KIND FILES...` ----------------------


def _work_tracekit(files: list[str]) -> None:
    from extractors.kineto import ingest_paths
    from tracekit.core.store import SampleStore

    with tempfile.TemporaryDirectory() as store:
        result = ingest_paths(files, SampleStore(store), jobs=1)  # one process: CPU time and peak memory compare
    print(json.dumps({"ok": len(result.traces), "failed": len(result.errors)}))


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


WORKERS = {"tracekit": _work_tracekit, "hta": _work_hta, "orjson": _work_orjson}


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
    if kind == "tracekit":
        import pandas  # noqa: F401

        import extractors.kineto  # noqa: F401
        import tracekit.core.store  # noqa: F401
    elif kind == "hta":
        import hta.trace_analysis  # noqa: F401
    else:
        import orjson  # noqa: F401


def uncompressed_size(path: Path) -> int:
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as handle:
            return sum(len(chunk) for chunk in iter(lambda: handle.read(1 << 24), b""))
    return path.stat().st_size


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
    args = parser.parse_args()

    files = sorted(p for p in args.corpus.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))
    total_mb = sum(uncompressed_size(p) for p in files) / 1e6
    print(f"corpus: {len(files)} Kineto files, {total_mb:.1f} MB uncompressed JSON ({args.corpus})")
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

    if args.skip_big:
        return
    source = args.corpus / BIG_SOURCE
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        big = Path(folder) / "big.pt.trace.json"
        copies, size = build_big_trace(source, big, args.big_gb)
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
