"""What the shipped fitted files were fitted from, and whether this tree still is that: `tracekit/data/fitted.json`.

`make profiles` (tools/fit_profiles.py) writes every fitted file (OUTPUTS) from three kinds of input, and records a
SHA-256 (16 hex digits) of each in the manifest:
- **code**: every module of this repository the fits imported (predictor/, tracekit/core/, extractors/, tools/, the
  fitting benchmarks), read without comments and docstrings, so that a change of wording needs no refit but any
  change of code does: the fitted numbers are a function of the predictor, and a predictor change may move them;
- **data**: every file under tracekit/data that the command does not write (datasheets, host CPUs, Megatron flags,
  stack profiles without fitted constants), and the bundled models as one entry (`tracekit/data/models/`);
- **corpus**: the corpus files the fits read (`$TRACEKIT_CORPUS`, else ../shared/corpus), by their path there.
The fingerprint is the digest of all three; each fitted file carries it (`fingerprint`), and the manifest holds the
digest of each fitted file as written.

`problems()` is the suite's check (tests/test_fitted_files.py): an input whose digest changed, a data file added or
removed, a fitted file edited since, or one whose fingerprint is not the manifest's. It reads files and hashes them
(about a second): it does not refit. Any of them means the shipped numbers may no longer be what the command makes
from this tree, and the remedy is always the same: `make profiles`, then commit what it rewrites.
"""
from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import tokenize
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tracekit" / "data"
MANIFEST = DATA / "fitted.json"
MODELS = DATA / "models"
#: Every file the command writes, relative to the repository root.
OUTPUTS = (
    "tracekit/data/gemm_rates.json",
    "tracekit/data/kernel_paths.json",
    "tracekit/data/transfer.json",
    "tracekit/data/sustained_gemm.json",
    "tracekit/data/stacks/megatron-deepspeed-2023.json",
    "tracekit/data/stacks/megatron-core.json",
    "tracekit/data/stacks/megatron-bridge.json",
    "tracekit/data/stacks/composer.json",
)
COMMAND = "make profiles"
#: This module: it checks the fitted files and changes none of their numbers, so it is not among the inputs.
CHECKER = Path(__file__).resolve().relative_to(ROOT).as_posix()
DIGITS = 16


def corpus_root() -> Path:
    """The corpus, as the test suite finds it (tests/conftest.py): `TRACEKIT_CORPUS`, else ../shared/corpus."""
    return Path(os.environ.get("TRACEKIT_CORPUS") or ROOT.parent / "shared" / "corpus")


def code_text(source: str) -> str:
    """A module's source without comments, docstrings, trailing spaces and blank lines: what its code is, whatever
    its wording (lines are kept as written, so the result does not depend on the Python version)."""
    drop: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                drop.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    cut = {tok.start[0]: tok.start[1] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
           if tok.type == tokenize.COMMENT}
    lines = []
    for number, line in enumerate(source.splitlines(), 1):
        if number in drop:
            continue
        line = line[:cut[number]].rstrip() if number in cut else line.rstrip()
        if line:
            lines.append(line)
    return "\n".join(lines)


def file_digest(path: Path) -> str:
    """Digest of a file (a module by its code, `code_text`), of a folder by its files' names and bytes; "missing"
    when there is none."""
    if path.is_dir():
        h = hashlib.sha256()
        for child in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(child.relative_to(path).as_posix().encode() + b"\0" + child.read_bytes() + b"\0")
        return h.hexdigest()[:DIGITS]
    if not path.is_file():
        return "missing"
    if path.suffix == ".py":
        return hashlib.sha256(code_text(path.read_text()).encode()).hexdigest()[:DIGITS]
    return hashlib.sha256(path.read_bytes()).hexdigest()[:DIGITS]


def data_inputs(root: Path = ROOT) -> list[str]:
    """The files under tracekit/data the command reads and does not write, the models folder as one entry."""
    data, models = root / DATA.relative_to(ROOT), root / MODELS.relative_to(ROOT)
    skip = {*OUTPUTS, MANIFEST.relative_to(ROOT).as_posix()}
    files = [p.relative_to(root).as_posix() for p in data.rglob("*") if p.is_file() and models not in p.parents]
    return sorted([f for f in files if f not in skip]) + [MODELS.relative_to(ROOT).as_posix() + "/"]


def digests(code: list[str], data: list[str], corpus: list[str], root: Path = ROOT) -> dict[str, dict[str, str]]:
    """The digest of every input: code and data by their path in the repository at `root`, corpus files by their
    path in the corpus."""
    where = corpus_root()
    return {"code": {p: file_digest(root / p) for p in sorted(code)},
            "data": {p: file_digest(root / p) for p in sorted(data)},
            "corpus": {p: file_digest(where / p) for p in sorted(corpus)}}


def fingerprint(inputs: dict[str, dict[str, str]]) -> str:
    """One digest of every input's."""
    text = "\n".join(f"{kind}:{p}={d}" for kind in sorted(inputs) for p, d in sorted(inputs[kind].items()))
    return hashlib.sha256(text.encode()).hexdigest()[:DIGITS]


def manifest(inputs: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The manifest of a run (without the fitted files' digests, which the run adds once they carry this one's
    fingerprint)."""
    return {"format": "tracekit-fitted/1", "command": COMMAND, "fingerprint": fingerprint(inputs), "inputs": inputs}


def _change(before: str | None, after: str | None) -> str:
    if before is None:
        return "added"
    return "removed" if after in (None, "missing") else "edited"


def problems(root: Path = ROOT) -> list[str]:
    """Why the fitted files of the tree at `root` may not be what `make profiles` makes from it; [] when they are."""
    manifest_path = root / MANIFEST.relative_to(ROOT)
    try:
        recorded = json.loads(manifest_path.read_text())
        inputs = recorded["inputs"]
        print_ = recorded["fingerprint"]
    except (OSError, ValueError, KeyError) as exc:
        return [f"{MANIFEST.relative_to(ROOT)}: unreadable ({exc})"]
    out = []
    now = digests(list(inputs["code"]), data_inputs(root), list(inputs["corpus"]), root)
    for kind in ("code", "data", "corpus"):
        changed = sorted(p for p in set(inputs[kind]) | set(now[kind])
                         if inputs[kind].get(p, "missing") != now[kind].get(p, "missing"))
        where = "in the corpus " if kind == "corpus" else ""
        if changed:
            out.append(f"{kind} changed {where}since the fit: " + ", ".join(
                f"{p} ({_change(inputs[kind].get(p), now[kind].get(p))})" for p in changed))
    for path, digest in sorted(recorded.get("outputs", {}).items()):
        if file_digest(root / path) != digest:
            out.append(f"{path} is not the file the fit wrote (edited since)")
            continue
        stamped = json.loads((root / path).read_text()).get("fingerprint")
        if stamped != print_:
            out.append(f"{path} carries fingerprint {stamped}, the manifest {print_}")
    missing = sorted(set(OUTPUTS) - set(recorded.get("outputs", {})))
    if missing:
        out.append(f"not written by the last fit: {', '.join(missing)}")
    return out
