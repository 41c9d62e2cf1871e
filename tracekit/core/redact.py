"""Keep process environments and credentials out of everything tracekit stores or prints: structures (`redact`),
command lines (`redact_argv`) and lines of text such as a captured log (`redact_text`, `redact_line` on bytes).

A name says "credential" when one of its words (split at `-`, `_`, case changes) is secret, password, passwd, pwd,
credential(s), auth, authorization, cookie or passphrase, when its last word is token (`HF_TOKEN`, `--hf-token`,
`access_token`: a token elsewhere in a name is what a setting counts or routes, `--calculate-per-token-loss`,
`--moe-token-dispatcher-type`), or when its last word is key/keys after another word (`api_key`, `WANDB_API_KEY`,
`access_key`, `--wandb-key`). Names that merely contain those letters are not: `--tokenizer-type`, `--num-tokens`,
`max_tokens`, `--key-size`. A true/false or empty value is never a credential. Values are replaced by `<redacted>` where
such a name assigns them (`NAME=VALUE`, `--flag VALUE`, `--flag=VALUE`, `name: value` in text), and anywhere they have a
known token shape (Hugging Face, GitHub, OpenAI-style, AWS access key ids, Slack), are a long hex key (≥ 32 digits, e.g.
W&B's 40), a URL's `user:password@`, or a `Bearer` header value. A `bash -c "..."` string is redacted inside.
"""
from __future__ import annotations

import re
import shlex
from typing import Any

_SECRET_WORDS = frozenset({"secret", "password", "passwd", "pwd", "credential", "credentials", "auth",
                           "authorization", "cookie", "passphrase", "apikey", "accesskey", "privatekey"})
#: Words that say "credential" only at the end of a name.
_SECRET_LAST_WORDS = frozenset({"token", "key", "keys"})
_SECRET_VALUE = re.compile(
    r"(hf_[A-Za-z0-9]{8,}|gh[pousr]_[A-Za-z0-9]{8,}|github_pat_[A-Za-z0-9_]{8,}|sk-[A-Za-z0-9_-]{8,}|"
    r"AKIA[0-9A-Z]{16}|xox[abpr]-[A-Za-z0-9-]{10,})"
)
_LONG_HEX = re.compile(r"\b[0-9a-fA-F]{32,}\b")
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^\s:/@]+):(?P<password>[^\s@/]+)@")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")
#: inside a line of text: `--flag=VALUE` / `--flag VALUE`, and `NAME=VALUE`, `name: value`, `name ...... value`
_TEXT_FLAG = re.compile(r"(?P<name>(?<![\w-])--?[A-Za-z][\w-]*)(?P<sep>=|\s+)(?P<value>[^\s-]\S*)")
_TEXT_ASSIGNMENT = re.compile(r"(?P<name>\b[A-Za-z_][\w.-]*)(?P<sep>\s*[=:]\s*|\s+\.{2,}\s*)(?P<value>\S+)")
#: Top-level trace keys that carry a process environment and are never kept.
ENVIRONMENT_KEYS = frozenset({"metadata", "env", "environment", "environ"})
REDACTED = "<redacted>"


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", str(name).lstrip("-"))
    return [w for w in re.split(r"[\s_\-.]+", spaced.lower()) if w]


def secret_name(name: str) -> bool:
    """True when a variable, key or flag name says it holds a credential (see the module docstring)."""
    words = _words(name)
    if any(w in _SECRET_WORDS for w in words):
        return True
    if not words or words[-1] not in _SECRET_LAST_WORDS:
        return False
    return words[-1] == "token" or len(words) >= 2


def _scrub(text: str) -> str:
    """Token shapes, long hex keys, URL credentials and bearer values replaced in a string."""
    text = _URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{m.group('user')}:{REDACTED}@", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    return _LONG_HEX.sub(REDACTED, _SECRET_VALUE.sub(REDACTED, text))


def redact(obj: Any) -> Any:
    """Copy of `obj` with environment blocks dropped and credential-like values replaced by '<redacted>'."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if str(key).lower() in ENVIRONMENT_KEYS:
                continue
            hidden = secret_name(str(key)) and value is not None and not isinstance(value, (dict, list, bool))
            out[key] = REDACTED if hidden else redact(value)
        return out
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return _scrub(obj)
    return obj


def redact_argv(words: list[str]) -> list[str]:
    """A command line with its credentials replaced by '<redacted>' and everything else kept as typed."""
    out: list[str] = []
    hide_next = False
    shell_next = False
    for word in map(str, words):
        if hide_next and not word.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        if shell_next:  # the script of `bash -c "..."`
            out.append(_redact_shell(word))
            shell_next = False
            continue
        name, eq, _ = word.partition("=")
        if word.startswith("-") and secret_name(name):
            if eq:
                out.append(f"{name}={REDACTED}")
            else:
                out.append(word)
                hide_next = True
            continue
        if eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and secret_name(name):
            out.append(f"{name}={REDACTED}")
            continue
        shell_next = word == "-c" and bool(out) and out[-1].rsplit("/", 1)[-1] in ("bash", "sh", "zsh", "dash")
        out.append(_scrub(word))
    return out


def _redact_shell(script: str) -> str:
    try:
        return shlex.join(redact_argv(shlex.split(script)))
    except ValueError:  # unbalanced quotes: fall back to the text rules
        return redact_text(script)


def redact_text(line: str) -> str:
    """One line of text (a log line) with credentials replaced: values a credential name assigns (`KEY=VALUE`,
    `key: value`, `--flag value`) and credential shapes anywhere."""
    def assignment(match: re.Match) -> str:
        if secret_name(match.group("name")) and match.group("value") != REDACTED:
            return f"{match.group('name')}{match.group('sep')}{REDACTED}"
        return match.group(0)

    return _TEXT_ASSIGNMENT.sub(assignment, _TEXT_FLAG.sub(assignment, _scrub(line)))


#: Cheap test of a raw log line before the full rules (training logs are long; few lines hold anything secret).
_MAYBE_SECRET = re.compile(rb"(?i)token|secret|pass|pwd|auth|cookie|key|credential|hf_|gh[pousr]_|github_pat|sk-|"
                           rb"akia|xox|://|bearer|basic|[0-9a-f]{32}")


def redact_line(line: bytes) -> bytes:
    """`redact_text` of one raw output line (bytes in, bytes out), skipping lines that cannot hold a credential."""
    if not _MAYBE_SECRET.search(line):
        return line
    return redact_text(line.decode("utf-8", "replace")).encode()
