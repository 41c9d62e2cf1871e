"""Run the third-party "peer" predictors on end-to-end rows, each in its own virtualenv (stdlib only).

    from benchmarks.peers import client          # repo root on sys.path
    if client.available("llm-analysis"):
        preds = client.predict("llm-analysis", rows, timeout_s=120)

A row is a dict with keys id, num_layers, hidden_size, ffn_hidden_size, num_attention_heads, seq_length,
vocab_size, global_batch_size, micro_batch_size, tp, pp, dp, num_gpus, gpus_per_node, precision,
recompute ("none"|"selective"|"full"), intra_node_gbs, inter_node_gbs (GB/s per GPU per direction); optional
sequence_parallel (bool), and for Megatron-core rows cp, GQA, MoE, MLA, attention kind and the GPU's id and datasheet
figures (keys in benchmarks/peers/README.md). The caller builds them. `predict` returns, in the same order, one
dict per row: {"id", "iteration_time_s" (float or None), "error" (str or None), "notes" (str)}; a row the peer
cannot predict carries an error instead of stopping the others.

The peers are installed by `bash benchmarks/peers/setup.sh` under benchmarks/.peers/ (or $TRACEKIT_PEERS_DIR);
nothing of theirs is imported into this process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PEERS = ("llm-analysis", "estimate-train-time")

HERE = Path(__file__).resolve().parent
SETUP_HINT = "run `bash benchmarks/peers/setup.sh`"

# peer name -> (venv folder under the peers dir, runner script, extra folder the runner needs)
_LAYOUT = {
    "llm-analysis": ("llm-analysis", "run_llm_analysis.py", None),
    "estimate-train-time": ("ett", "run_ett.py", "ett-data/Perlmutter"),
}


class PeerError(RuntimeError):
    """A peer ran but gave no usable answer (crash, timeout, unreadable output)."""

    def __init__(self, name: str, reason: str):
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason


class PeerUnavailable(PeerError):
    """A peer is not installed (or unknown); `reason` is one line and says how to set it up."""


def peers_dir() -> Path:
    env = os.environ.get("TRACEKIT_PEERS_DIR")
    return Path(env) if env else HERE.parent / ".peers"


def _python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def unavailable_reason(name: str) -> str | None:
    """None when `name` can run here, else a one-line reason."""
    if name not in _LAYOUT:
        return f"unknown peer {name!r} (known: {', '.join(PEERS)})"
    venv_name, script, extra = _LAYOUT[name]
    venv = peers_dir() / venv_name
    if not _python(venv).exists():
        return f"no virtualenv at {venv}: {SETUP_HINT}"
    if not (venv / ".ready").is_file():
        return f"virtualenv at {venv} is incomplete (setup did not finish): {SETUP_HINT}"
    if extra and not (peers_dir() / extra).is_dir():
        return f"missing {peers_dir() / extra}: {SETUP_HINT}"
    if not (HERE / script).is_file():
        return f"runner {HERE / script} is missing from the checkout"
    return None


def available(name: str) -> bool:
    return unavailable_reason(name) is None


def _tail(text: str, n: int = 400) -> str:
    text = " | ".join(line.strip() for line in (text or "").strip().splitlines()[-4:] if line.strip())
    return text[-n:]


def predict(name: str, rows: list[dict], timeout_s: float) -> list[dict]:
    """Predict `rows` with peer `name` in a subprocess of its own venv's python; see the module doc.

    Raises PeerUnavailable when the peer is not set up, PeerError when its runner fails as a whole
    (timeout, crash, output that is not one record per row)."""
    reason = unavailable_reason(name)
    if reason:
        raise PeerUnavailable(name, reason)
    rows = list(rows)
    if not rows:
        return []
    venv_name, script, _ = _LAYOUT[name]
    cmd = [str(_python(peers_dir() / venv_name)), str(HERE / script)]
    env = dict(os.environ)
    env["TRACEKIT_PEERS_DIR"] = str(peers_dir())
    for k in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):  # keep the project's environment out of the peer's
        env.pop(k, None)
    stderr_to = None if os.environ.get("PEER_VERBOSE") else subprocess.PIPE
    try:
        proc = subprocess.run(cmd, input=json.dumps(rows, default=str), stdout=subprocess.PIPE, stderr=stderr_to,
                              text=True, timeout=timeout_s, env=env, cwd=str(HERE))
    except subprocess.TimeoutExpired:
        raise PeerError(name, f"no answer within {timeout_s:g} s for {len(rows)} rows") from None
    except OSError as e:
        raise PeerUnavailable(name, f"cannot start {cmd[0]}: {e}; {SETUP_HINT}") from None
    if proc.returncode != 0:
        raise PeerError(name, f"runner exited {proc.returncode}: {_tail(proc.stderr or '')}")
    try:
        out = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise PeerError(name, f"runner printed no JSON: {_tail(proc.stdout)} {_tail(proc.stderr or '')}") from None
    if not isinstance(out, list) or len(out) != len(rows):
        raise PeerError(name, f"runner returned {len(out) if isinstance(out, list) else type(out).__name__} "
                              f"records for {len(rows)} rows")
    result = []
    for row, rec in zip(rows, out):
        t = rec.get("iteration_time_s")
        result.append({
            "id": rec.get("id", row.get("id")),
            "iteration_time_s": float(t) if isinstance(t, (int, float)) else None,
            "error": rec.get("error") or (None if isinstance(t, (int, float)) else "no prediction"),
            "notes": rec.get("notes") or "",
        })
    return result


if __name__ == "__main__":  # quick check: python benchmarks/peers/client.py
    for peer in PEERS:
        print(f"{peer}: {'ready' if available(peer) else unavailable_reason(peer)}")
    sys.exit(0)
