"""Run a user's launch command unchanged with profiling added, tee its output to the capture directory, write the
manifest, then ingest the traces.

Library entry point: `capture(out_dir, argv, steps=...) -> Manifest`.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO, Callable

from tracekit.core.errors import ConfigError
from tracekit.core.redact import redact_line

from .manifest import (
    LOG_NAME,
    MANIFEST_NAME,
    Manifest,
    build,
    launcher_world,
    split_launch,
)
from .megatron_flags import (
    LAYOUTS,
    StepRange,
    expected_trace_globs,
    parse_ranks,
    profiling_flags,
)
from .megatron_version import megatron_version

HOOK_DIR = Path(__file__).resolve().parent / "hook"
HOOK_TRACES = "traces"
MODES = ("auto", "megatron", "hook")
#: `--layout`: Megatron's trace layout, or `auto`: from the Megatron-core version the launch runs.
LAYOUT_CHOICES = ("auto", *LAYOUTS)


def detect_mode(argv: list[str]) -> str:
    """`megatron` when the command line itself carries Megatron's model flags (so its profiling flags can be
    appended), else `hook` (e.g. a shell script, or a script that is not Megatron)."""
    _, script_args = split_launch(argv)
    return "megatron" if "--num-layers" in script_args else "hook"


def run_teed(argv: list[str], log_path: Path, env: dict[str, str] | None = None, echo: bool = True) -> int:
    """Run `argv`; copy its stdout/stderr line by line to ours and, with credentials redacted
    (`tracekit.core.redact.redact_line`), to `log_path`. Returns its exit code (128 + N when killed by signal N,
    127 when the command does not exist)."""
    lock = threading.Lock()
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        except OSError as exc:
            message = f"tracekit capture: cannot start {argv[0]!r}: {exc.strerror or exc}\n".encode()
            log.write(message)
            if echo:
                sys.stderr.buffer.write(message)
            return 127

        def pump(stream: BinaryIO, target: BinaryIO) -> None:
            for line in iter(stream.readline, b""):
                kept = redact_line(line)
                with lock:
                    log.write(kept)  # the log kept in the capture folder holds no credential
                    log.flush()
                if echo:
                    target.write(line)
                    target.flush()

        threads = [threading.Thread(target=pump, args=(proc.stdout, sys.stdout.buffer), daemon=True),
                   threading.Thread(target=pump, args=(proc.stderr, sys.stderr.buffer), daemon=True)]
        for thread in threads:
            thread.start()
        try:
            code = proc.wait()
        except KeyboardInterrupt:  # the terminal's SIGINT reached the child too; wait for it to wind down
            code = proc.wait()
        for thread in threads:
            thread.join()
    return 128 - code if code < 0 else code


def choose_layout(argv: list[str], layout: str, env: dict[str, str]) -> tuple[str | None, str]:
    """(the layout whose flags to append — None when the Megatron version is unknown: the flags every version takes,
    no shapes flag —, where that choice comes from)."""
    if layout not in LAYOUT_CHOICES:
        raise ConfigError(f"layout must be one of {', '.join(LAYOUT_CHOICES)}, not {layout!r}")
    if layout != "auto":
        return layout, "--layout"
    found = megatron_version(argv, env)
    if found is None:
        return None, ("Megatron-core version not found (no megatron/core/package_info.py beside the script, in the "
                      "working directory or on PYTHONPATH, no megatron-core installed)")
    return found.layout, f"Megatron-core {found.version} ({found.where})"


def find_traces(out_dir: Path, mode: str, layout: str | None) -> tuple[list[Path], str | None]:
    """The run's trace files and the Megatron layout they were found in (None for the hook's). Megatron's are looked
    for in both layouts, `layout`'s first: the first that holds any is the run's."""
    if mode == "hook":
        return _glob(out_dir, [f"{HOOK_TRACES}/rank-*.pt.trace.json"]), None
    order = sorted(LAYOUTS, key=lambda name: name != layout)
    for name in order:
        traces = _glob(out_dir, expected_trace_globs(name))
        if traces:
            return traces, name
    return [], layout


def _glob(out_dir: Path, globs: list[str]) -> list[Path]:
    return sorted({p for pattern in globs for p in out_dir.glob(pattern) if p.is_file()})


def capture(out_dir: str | Path, argv: list[str], steps: str | StepRange = "10-13", ranks: str = "all",
            layout: str = "auto", shapes: bool = True, mode: str = "auto", store: str | Path | None = None,
            ingest: bool = True, echo: bool = True, progress: Callable | None = None) -> Manifest:
    """Profile one run of `argv` into `out_dir` and return its manifest (also saved as `out_dir/manifest.json`).

    Megatron-style commands (their own argv has `--num-layers`) get Megatron's profiling flags appended, for the
    trace layout `layout` (`auto`: the one the launch's Megatron-core version writes, `tracekit.capture.
    megatron_version`); its traces are then looked for in both layouts, and the manifest says which held them and
    why that one was asked for. Anything else is profiled by the import hook around optimizer steps. With `ingest`
    and a `store`, a successful run's traces are ingested into that store and the result is recorded in
    `manifest.ingest`. Raises ConfigError for unusable options or a directory that already holds a capture.
    """
    if not argv:
        raise ConfigError("no launch command given (put it after --)")
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    out = Path(out_dir)
    if (out / MANIFEST_NAME).exists():
        raise ConfigError(f"{out} already holds a capture (manifest.json); choose a new --out directory")
    step_range = steps if isinstance(steps, StepRange) else StepRange.parse(steps)
    mode = detect_mode(argv) if mode == "auto" else mode
    env = dict(os.environ)
    asked: str | None = None  # Megatron's trace layout whose flags were appended (none for the import hook)
    why = ""
    if mode == "megatron":
        asked, why = choose_layout(argv, layout, env)
        per_node, nodes = launcher_world(argv)
        if per_node is None and ranks.strip().lower() == "all":
            raise ConfigError("cannot tell the world size from the launch command (torchrun --nproc-per-node N); "
                              "give --ranks 0,1,... explicitly")
        rank_list = parse_ranks(ranks, per_node * nodes if per_node else None)
        run_argv = list(argv) + profiling_flags(out.resolve(), step_range, rank_list, asked or "tensorboard",
                                                shapes and asked is not None)
    else:
        if layout not in LAYOUT_CHOICES:
            raise ConfigError(f"layout must be one of {', '.join(LAYOUT_CHOICES)}, not {layout!r}")
        if step_range.start < 2:
            raise ConfigError("the import hook profiles optimizer steps from 2 on (step 1 warms up); use START ≥ 2")
        if ranks.strip().lower() != "all":
            parse_ranks(ranks)  # validate the list
        run_argv = list(argv)
        env.update(TRACEKIT_HOOK_DIR=str((out / HOOK_TRACES).resolve()), TRACEKIT_HOOK_STEPS=str(step_range),
                   TRACEKIT_HOOK_RANKS=ranks)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOK_DIR), env.get("PYTHONPATH", "")) if p)
    out.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    code = run_teed(run_argv, out / LOG_NAME, env=env, echo=echo)
    traces, found = find_traces(out, mode, asked)
    manifest = build(out, list(argv), code, mode, found, step_range, traces, started,
                     time.perf_counter() - t0)
    if mode == "megatron":
        manifest.layout_source = layout_note(asked, found, why, bool(traces), shapes)
        manifest.notes.append("profiling flags appended: " + " ".join(run_argv[len(argv):]))
    if not traces:
        manifest.notes.append(f"no traces were written (did the run reach step {step_range.end}?)")
    manifest.write(out)
    if ingest and store is not None and traces and manifest.status == "ok":
        manifest.ingest = ingest_traces(traces, store, progress)
        manifest.write(out)
    return manifest


def layout_note(asked: str | None, found: str | None, why: str, any_traces: bool, shapes: bool) -> str:
    """Which layout the traces were taken from, and why that one was asked for."""
    if asked is None:
        text = f"{why}: the flags every Megatron takes, without --pytorch-profiler-collect-shapes"
    else:
        text = f"{asked} asked for, from {why}"
    if not any_traces:
        return text + "; no traces in either layout"
    if found != asked:
        text += f"; traces found in the {found} layout"
    if found == "torch_profile" and shapes and asked != "torch_profile":
        text += ("; shapes not recorded (Megatron-core ≥ 0.17 records them only with "
                 "--pytorch-profiler-collect-shapes: give --layout torch_profile)")
    return text


def ingest_traces(traces: list[Path], store: str | Path, progress: Callable | None = None) -> dict:
    """Ingest the run's traces with the Kineto extractor; the outcome as a JSON-able summary."""
    try:
        from extractors.kineto import ingest_paths
    except ImportError as exc:
        return {"status": "unavailable", "error": f"the Kineto extractor cannot be imported ({exc})"}
    from tracekit.core.store import SampleStore

    try:
        result = ingest_paths([str(p) for p in traces], SampleStore(store), progress=progress)
    except Exception as exc:  # noqa: BLE001 - the capture stays usable; the failure is recorded
        return {"status": "failed", "store": str(store), "error": f"{type(exc).__name__}: {exc}"}
    return {"status": "ok", "store": str(store), "result": _jsonable(result)}


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "to_dict"):
        return _jsonable(value.to_dict())
    if hasattr(value, "__dict__"):
        return _jsonable({k: v for k, v in vars(value).items() if not k.startswith("_")})
    return str(value)
