"""Write files so that readers never see a half-written one: temp file in the same folder, then rename. The temp
files and folders `tempfile` makes are private (0600/0700); what is published gets the mode the user's umask gives a
new file or folder, as `open` and `mkdir` would."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def umask_mode(folder: bool = False) -> int:
    """The mode a new file (0666) or folder (0777) gets under this process's umask."""
    mask = os.umask(0)  # the only way to read it; set straight back
    os.umask(mask)
    return (0o777 if folder else 0o666) & ~mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically (the old content stays until the new one is complete)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
