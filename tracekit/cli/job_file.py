"""A job given as a file (predict's CONFIG, search's CONFIG): the files that are something else are refused in one
line that says what they are and which command takes them, before any parser sees them (a trace given as a
configuration was a 43-line UnicodeDecodeError)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from extractors.jobs.megatron import ARGS_BEGIN
from tracekit.core.errors import InputError

GZIP = b"\x1f\x8b"
#: How far into a file a Kineto trace's top-level keys are looked for.
HEAD = 1 << 20
#: A NUL byte in a file's first bytes: binary, not text.
BINARY_PROBE = 8192


def job_text(path: Path, command: str) -> str:
    """The file's text; InputError for a folder, a compressed or binary file, a Kineto trace or a CSV table."""
    takes = f"{command} reads a YAML/JSON of Megatron settings" + (" or a Megatron log" if command == "predict" else "")
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise InputError(path, f"a folder, not a job file ({takes}; a capture run folder goes to "
                               "`tracekit validate RUN_DIR`)") from None
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from exc
    if data[:2] == GZIP:
        raise InputError(path, f"gzip-compressed (a Kineto trace?), not a job file: {takes}; traces go to "
                               "`tracekit ingest` or `tracekit diff`")
    if b"\x00" in data[:BINARY_PROBE]:
        raise InputError(path, f"not a text file: {takes}")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        text = data.decode("utf-8-sig", errors="replace")
        if command != "predict" or not ARGS_BEGIN.search(text):  # a Megatron log with a stray byte is still a log
            raise InputError(path, f"not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start}): save it "
                                   "as UTF-8") from None
    head = text[:HEAD]
    if '"traceEvents"' in head or head.lstrip().startswith('{"schemaVersion"'):
        raise InputError(path, f"a Kineto trace, not a job file: {takes}; traces go to `tracekit ingest` or "
                               "`tracekit diff`")
    first = head.lstrip().split("\n", 1)[0]
    if first.count(",") >= 3 and ":" not in first and "num_layers" in first:
        batch = ("predict every row with `tracekit predict --batch FILE --csv-out OUT.csv`" if command == "predict"
                 else "search takes one job; `tracekit predict --batch` takes a table")
        raise InputError(path, f"a CSV table of runs, not a job file: {batch}")
    return text


def job_mapping(path: Path, text: str, or_log: bool = False) -> dict[str, Any]:
    """The YAML/JSON mapping of a job file; InputError in one line (where and what) for a syntax error or a
    document that is not a mapping (`or_log`: the command would have taken a Megatron log too, and says so)."""
    import yaml

    try:
        data = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).split("\n")[0]
        log = " nor a Megatron log (no arguments block)" if or_log else ""
        raise InputError(path, f"not valid YAML/JSON ({where}{problem}){log}") from exc
    if not isinstance(data, dict):
        log = " or a Megatron log with its arguments block" if or_log else ""
        raise InputError(path, f"a job file is a mapping of Megatron argument names to values{log}")
    return data
