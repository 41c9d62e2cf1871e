"""Reading a YAML (or JSON, which is YAML) input file: one InputError line naming the file for an unreadable file or a
syntax error."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def read_yaml(path: Path, kind: str = "YAML") -> Any:
    """The parsed document of `path` (`kind` names the format in the error line)."""
    import yaml

    from tracekit.core.errors import InputError

    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(path, f"not valid {kind} ({exc})") from exc
