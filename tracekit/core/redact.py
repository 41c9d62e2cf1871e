"""Keep process environments and credentials out of everything tracekit stores or prints: structures (`redact`)
and command lines (`redact_argv`: `NAME=VALUE` environment assignments, `--flag VALUE` / `--flag=VALUE` whose name
says credential, and values that look like one, in any position)."""
from __future__ import annotations

import re
from typing import Any

_SECRET_KEY = re.compile(r"(token|secret|passw|pwd|api[_-]?key|access[_-]?key|credential|auth|private[_-]?key|"
                         r"session|cookie)", re.I)
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


_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_LONG_HEX = re.compile(r"\b[0-9a-fA-F]{32,}\b")  # API keys printed as long hex strings (e.g. W&B's 40)


def redact_argv(words: list[str]) -> list[str]:
    """A command line with its credentials replaced by '<redacted>': the value of a `NAME=VALUE` word or of a
    `--flag VALUE` / `--flag=VALUE` whose name looks like a credential (`WANDB_API_KEY=`, `--hf-token`,
    `--password`), and any word holding a known token shape or a long hex key."""
    out: list[str] = []
    hide_next = False
    for word in words:
        text = str(word)
        if hide_next and not text.startswith("-"):
            out.append("<redacted>")
            hide_next = False
            continue
        hide_next = False
        flag, eq, value = text.partition("=")
        if text.startswith("-") and _SECRET_KEY.search(flag):
            if eq:
                out.append(f"{flag}=<redacted>")
            else:
                out.append(text)
                hide_next = True
            continue
        assignment = _ASSIGNMENT.match(text)
        if assignment and _SECRET_KEY.search(assignment.group(1)):
            out.append(f"{assignment.group(1)}=<redacted>")
            continue
        out.append(_LONG_HEX.sub("<redacted>", _SECRET_VALUE.sub("<redacted>", text)))
    return out
