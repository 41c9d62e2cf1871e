"""Keep process environments and credentials out of everything tracekit stores or prints."""
from __future__ import annotations

import re
from typing import Any

_SECRET_KEY = re.compile(r"(token|secret|passw|api[_-]?key|credential|auth|private[_-]?key|session)", re.I)
_SECRET_VALUE = re.compile(
    r"(hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|xox[abpr]-[A-Za-z0-9-]{10,})"
)
#: Top-level trace keys that carry a process environment and are never kept.
ENVIRONMENT_KEYS = frozenset({"metadata", "env", "environment", "environ"})


def looks_secret(key: str, value: Any) -> bool:
    """True when a key/value pair looks like a credential."""
    if _SECRET_KEY.search(str(key)):
        return True
    return isinstance(value, str) and bool(_SECRET_VALUE.search(value))


def redact(obj: Any) -> Any:
    """Copy of `obj` with environment blocks dropped and credential-like values replaced by '<redacted>'."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if str(key).lower() in ENVIRONMENT_KEYS:
                continue
            out[key] = "<redacted>" if looks_secret(key, value) and not isinstance(value, (dict, list)) else redact(value)
        return out
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    if isinstance(obj, str) and _SECRET_VALUE.search(obj):
        return _SECRET_VALUE.sub("<redacted>", obj)
    return obj
