"""The runners' side of the peer protocol (stdlib only; imported by both runners from their own virtualenvs): read a
JSON list of rows from stdin, predict each one apart (a bad row gets its error, the others still run), write the
answers as a JSON list on stdout. Logging goes to stderr."""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Callable


def positive_int(row: dict, key: str) -> int:
    """A row's whole positive number; ValueError naming the key otherwise."""
    v = row.get(key)
    if v is None or v == "":
        raise ValueError(f"missing {key}")
    f = float(v)
    if f != int(f) or f <= 0:
        raise ValueError(f"{key}={v!r} is not a positive integer")
    return int(f)


def serve(name: str, predict_row: Callable[[dict], tuple[float, str]], fatal: str | None = None) -> int:
    """Run the protocol with `predict_row(row) -> (seconds, notes)`; `fatal` is an error every row gets."""
    try:
        rows = json.load(sys.stdin)
        if not isinstance(rows, list):
            raise ValueError("stdin must hold a JSON list of row objects")
    except Exception as e:  # noqa: BLE001
        print(f"{name}: cannot read rows from stdin: {e}", file=sys.stderr)
        return 2
    out = []
    for i, row in enumerate(rows):
        rid = row.get("id") if isinstance(row, dict) else None
        rec = {"id": rid, "iteration_time_s": None, "error": None, "notes": ""}
        t0 = time.perf_counter()
        if fatal:
            rec["error"] = fatal
        elif not isinstance(row, dict):
            rec["error"] = "row is not a JSON object"
        else:
            try:
                rec["iteration_time_s"], rec["notes"] = predict_row(row)
            except Exception as e:  # noqa: BLE001
                rec["error"] = f"{type(e).__name__}: {e}".strip()
                if os.environ.get("PEER_VERBOSE"):
                    traceback.print_exc(file=sys.stderr)
        result = f"{rec['iteration_time_s']:.4f} s" if rec["error"] is None else f"error: {rec['error']}"
        print(f"[{name}] {i + 1}/{len(rows)} {rid}: {result} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr,
              flush=True)
        out.append(rec)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0
