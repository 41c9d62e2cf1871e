"""Content hashes that identify sources (files, sample sets) in the store."""
from __future__ import annotations

import hashlib
import os


def file_digest(path: str | os.PathLike, length: int = 16) -> str:
    """Hex digest of a file's bytes (as stored: a .gz file is hashed compressed)."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:length]


def bytes_digest(data: bytes, length: int = 16) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()[:length]
