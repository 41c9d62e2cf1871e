"""Input files of the sample-file extractors: a file itself, or the matching files under a folder tree."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from tracekit.core.errors import InputError


def list_files(root: str | Path, accept: Callable[[Path], bool]) -> list[Path]:
    """`root` itself when it is a file, else every file under it that `accept` takes, sorted."""
    root = Path(root)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise InputError(root, "no such file or directory")
    return sorted(p for p in root.rglob("*") if p.is_file() and accept(p))
