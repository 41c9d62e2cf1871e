"""The GPU kit's second command, here: unpack a harvest brought back from the GPU machine, with its provenance, and
validate each captured run against its prediction.

    python benchmarks/gpu/unpack.py BRING_BACK --into benchmarks/data/gpu/<date>-<gpu> [--models DIR] [--no-validate]

BRING_BACK is the folder the device tool copied `$OUT` into (`harvest.json` and `harvest-NN.tar`). The volumes are
checked and unpacked into the new folder `--into` (`benchmarks/gpu/pack.py`: nothing is written unless every file is
whole), then it gets
- `PROVENANCE.md`: the machine (GPU, driver, torch, CUDA, Transformer Engine), the Megatron-LM snapshot and its
  version, tracekit's commit, per run its launch line, its status and the measured iteration time (median of
  the unprofiled iterations from the third on), and the held GEMM's burst and sustained rates (`harvest.json` keeps
  every window and nvidia-smi's clocks and power);
- `runs/<name>/`: each run as `tracekit capture` left it (manifest, log, traces), `store/` the sampler's store;
- per captured run, `tracekit validate runs/<name> --html runs/<name>/report.html --json` (its output in
  `runs/<name>/validate.json`) and one table: measured against predicted iteration time, per run.
Exit code 0 when every run validated, 1 when some did not, 2 when the harvest cannot be unpacked.
"""
from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu.pack import PackError, unpack  # noqa: E402


def provenance(index: dict) -> str:
    """PROVENANCE.md of an unpacked harvest."""
    env = index.get("env", {})
    megatron = index.get("megatron", {})
    lines = [
        "# GPU harvest", "",
        f"Made by `benchmarks/gpu/harvest.py` on {index.get('started', '?')} in {index.get('seconds', '?')} s of a "
        f"{index.get('budget_s', '?')} s budget; tracekit commit {env.get('tracekit_commit', 'unknown')}.", "",
        f"- device: {', '.join(env.get('devices') or [env.get('hardware', '?')])} (hardware id {env.get('hardware')}, "
        f"{env.get('memory_gb', '?')} GB, compute capability {env.get('capability')})",
        f"- torch {env.get('torch')}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}, Python {env.get('python')}; "
        f"Transformer Engine {env.get('transformer_engine')}, flash-attn {env.get('flash_attn')}, apex "
        f"{env.get('apex')}, triton {env.get('triton')}",
        f"- Megatron-LM: {megatron.get('source', 'not run')} (Megatron-core {megatron.get('version')})",
    ]
    if env.get("nvidia_smi"):
        lines += ["", "```", env["nvidia_smi"].strip(), "```"]
    lines += ["", "| run | status | measured ms/iteration | unprofiled iterations | launch |", "|---|---|---|---|---|"]
    for run in index.get("runs", []):
        launch = " ".join(run.get("launch", []))
        lines.append(f"| {run['name']} | {run['status']} (exit {run['exit_code']}) | {run.get('measured_ms')} | "
                     f"{len(run.get('unprofiled_iteration_times_ms', []))} | `{launch}` |")
    for skipped in index.get("skipped", []):
        lines.append(f"| {skipped['name']} | skipped: {skipped['reason']} | | | |")
    sample = index.get("sample")
    if sample:
        lines += ["", f"Sampler: exit {sample.get('exit_code')}, {sample.get('samples')} in {sample.get('seconds')} s "
                      f"({sample.get('dtype')}, hardware {sample.get('hardware')})."]
    held = index.get("sustained")
    if held:
        smi = held.get("nvidia_smi", {}).get("rows", [])
        lines += ["", f"Sustained GEMM: exit {held.get('exit_code')}, {held.get('dtype')} {held.get('shape')} held "
                      f"{held.get('seconds')} s: burst {held.get('burst_tflops')} TFLOP/s, held "
                      f"{held.get('sustained_tflops')} TFLOP/s ({held.get('sustained_over_burst')} of the burst); "
                      f"nvidia-smi each second (timestamp, SM MHz, W, °C, throttle reasons): first "
                      f"{smi[0] if smi else '—'}, last {smi[-1] if smi else '—'}."]
    left = index["pack"]["left_out"]
    if left:
        lines += ["", "Left out for room: " + ", ".join(f"{f['name']} ({f['bytes']} bytes)" for f in left)]
    return "\n".join(lines) + "\n"


def validate_run(run_dir: Path, models: Path | None) -> dict:
    """`tracekit validate` of one captured run, with its HTML report beside it; the JSON it printed."""
    argv = [sys.executable, "-m", "tracekit", "validate", str(run_dir), "--html", str(run_dir / "report.html"),
            "--json"]
    if models is not None:
        argv += ["--models", str(models)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False)
    (run_dir / "validate.json").write_text(done.stdout)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        return {"exit_code": done.returncode, "error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return {"exit_code": done.returncode, "report": report}


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("bring_back", type=Path, help="folder holding harvest.json and harvest-NN.tar")
    cli.add_argument("--into", type=Path, required=True, help="new folder for the unpacked harvest")
    cli.add_argument("--models", type=Path, help="model folder validate predicts with (default: the bundled set)")
    cli.add_argument("--no-validate", action="store_true", help="unpack and write the provenance only")
    args = cli.parse_args(argv)
    try:
        index = unpack(args.bring_back, args.into)
    except PackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    store = args.into / "store.tar.gz"
    if store.exists():
        with tarfile.open(store) as tar:
            tar.extractall(args.into, filter="data")
        store.unlink()
    for run in index.get("runs", []):  # traces the kit gzipped for the trip, as the run wrote them
        for trace in run.get("traces", {}):
            folder = args.into / "runs" / run["name"]
            packed = folder / (trace + ".gz")
            if not (folder / trace).exists() and packed.exists() and not trace.endswith(".gz"):
                with gzip.open(packed, "rb") as source, open(folder / trace, "wb") as target:
                    shutil.copyfileobj(source, target)
                packed.unlink()
    (args.into / "PROVENANCE.md").write_text(provenance(index))
    print(f"unpacked {len(index['pack']['files'])} files into {args.into}")
    if args.no_validate:
        return 0
    failed = 0
    print(f"{'run':24} {'measured ms':>12} {'predicted ms':>13} {'error':>8}  report")
    for run in index.get("runs", []):
        run_dir = args.into / "runs" / run["name"]
        if run["status"] != "ok" or not run.get("traces"):
            print(f"{run['name']:24} {'':>12} {'':>13} {'':>8}  not validated: {run['status']}, "
                  f"{len(run.get('traces', {}))} traces")
            failed += 1
            continue
        result = validate_run(run_dir, args.models)
        if result["exit_code"] not in (0, 1) or "report" not in result:
            print(f"{run['name']:24} validate failed: {result.get('error')}")
            failed += 1
            continue
        unprofiled = result["report"].get("unprofiled") or {}
        predicted = unprofiled.get("predicted_s")
        measured = run.get("measured_ms")
        error = f"{(predicted * 1e3 - measured) / measured:+.1%}" if predicted and measured else ""
        shown = f"{predicted * 1e3:.1f}" if predicted else "?"
        print(f"{run['name']:24} {measured or '':>12} {shown:>13} {error:>8}  {run_dir / 'report.html'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
