"""Pack a harvest into what the GPU machine can bring back, and unpack it here.

The machine brings back at most 8 files of at most 16 MiB from its output folder; a 25 MB result of the first
harvest was too large and was lost whole. So `pack` writes volumes `harvest-NN.tar` of at most 15 MiB each
(`MAX_BYTES`, counted as tar writes them: headers, padding, the end blocks and its 10 KiB records), each a
standalone tar, and one index `harvest.json` (the summary given plus what went where, with each file's size and
sha256): `MAX_FILES` files in all. Files go in the order given (the most wanted first); one that does not fit the
space left in a volume is cut into chunks (`NAME.chunk-000`, ...) across volumes; what does not fit in the last
volume is left out and listed under `left_out`. A lost volume loses its own files only.

`unpack` checks the index against the volumes (every chunk there, every sha256 right) before writing anything, then
writes the files into a new folder: one clear error otherwise, and nothing half-written.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

MAX_FILES = 8
MAX_BYTES = 15 * 2**20
INDEX = "harvest.json"
VOLUME = "harvest-{:02d}.tar"
_BLOCK = tarfile.BLOCKSIZE  # 512
_RECORD = tarfile.RECORDSIZE  # 10240: a tar file's length is a whole number of records
_MIN_CHUNK = 64 * 2**10  # a volume with less room left than this is closed rather than given a sliver of a file


class PackError(Exception):
    """A harvest that cannot be unpacked (or a pack that cannot be made), in one line."""


def _member_bytes(size: int) -> int:
    return _BLOCK + -(-size // _BLOCK) * _BLOCK


def _tar_bytes(payload: int) -> int:
    """The file size of a tar whose members take `payload` bytes (headers and padding included)."""
    return -(-(payload + 2 * _BLOCK) // _RECORD) * _RECORD


def _room(payload: int, max_bytes: int) -> int:
    """The largest file that still fits in a volume already holding `payload` bytes of members."""
    left = max_bytes - _BLOCK - payload
    while left > 0 and _tar_bytes(payload + _member_bytes(left)) > max_bytes:
        left -= _BLOCK if left > _BLOCK else left
    return max(left, 0)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def pack(files: list[tuple[str, Path]], out_dir: Path, summary: dict, max_files: int = MAX_FILES,
         max_bytes: int = MAX_BYTES) -> dict:
    """Write `files` ((name in the harvest, path here), most wanted first) and `summary` into `out_dir` as at most
    `max_files` files of at most `max_bytes` each; returns the index written (`harvest.json`)."""
    if max_files < 2:
        raise PackError("a harvest needs at least 2 files: its index and one volume")
    out_dir.mkdir(parents=True, exist_ok=True)
    volumes: list[list[tuple[str, Path, int, int]]] = [[]]  # per volume: (member, source, offset, length)
    used = [0]
    entries: list[dict] = []
    left_out: list[dict] = []
    for name, path in files:
        size = path.stat().st_size
        parts: list[tuple[int, int, int]] = []  # (volume, offset, length)
        offset, full = 0, False
        while offset < size or (size == 0 and not parts):
            room = _room(used[-1], max_bytes)
            want = size - offset
            if want > room and (room < _MIN_CHUNK or want <= _room(0, max_bytes)) and used[-1]:
                if len(volumes) == max_files - 1:
                    full = True
                    break
                volumes.append([])
                used.append(0)
                continue
            length = min(want, room)
            parts.append((len(volumes) - 1, offset, length))
            used[-1] += _member_bytes(length)
            offset += length
            if size == 0:
                break
        if full:  # undo the chunks placed so far: a file comes back whole or not at all
            for volume, _, length in parts:
                used[volume] -= _member_bytes(length)
            left_out.append({"name": name, "bytes": size, "reason": f"no room in {max_files - 1} volumes"})
            continue
        chunks = []
        for i, (volume, start, length) in enumerate(parts):
            member = name if len(parts) == 1 else f"{name}.chunk-{i:03d}"
            volumes[volume].append((member, path, start, length))
            chunks.append({"volume": VOLUME.format(volume), "member": member, "bytes": length})
        entries.append({"name": name, "bytes": size, "sha256": sha256(path), "chunks": chunks})
    written = []
    for number, members in enumerate(volumes):
        if not members:
            continue
        target = out_dir / VOLUME.format(number)
        with tarfile.open(target.with_suffix(".tmp"), "w", format=tarfile.GNU_FORMAT) as tar:
            for member, path, start, length in members:
                info = tarfile.TarInfo(member)
                info.size, info.mode, info.mtime = length, 0o644, 0
                with open(path, "rb") as handle:
                    handle.seek(start)
                    tar.addfile(info, io.BytesIO(handle.read(length)))
        os.replace(target.with_suffix(".tmp"), target)
        if target.stat().st_size > max_bytes:
            raise PackError(f"{target}: {target.stat().st_size} bytes, over the {max_bytes} a volume may hold")
        written.append(target.name)
    index = {**summary, "pack": {"volumes": written, "max_bytes": max_bytes, "max_files": max_files,
                                 "files": entries, "left_out": left_out}}
    tmp = out_dir / (INDEX + ".tmp")
    tmp.write_text(json.dumps(index, indent=1, sort_keys=True))
    os.replace(tmp, out_dir / INDEX)
    return index


def unpack(bring_back: Path, dest: Path) -> dict:
    """Check the harvest in `bring_back` (its index and volumes) and write its files into the new folder `dest`;
    returns the index. PackError in one line, and nothing written, when a volume or chunk is missing or a file's
    sha256 is not the one packed."""
    try:
        index = json.loads((bring_back / INDEX).read_text())
        entries = index["pack"]["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PackError(f"{bring_back / INDEX}: not a harvest index ({exc})") from exc
    if dest.exists():
        raise PackError(f"{dest}: already exists; unpack into a new folder")
    tars: dict[str, tarfile.TarFile] = {}
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent if dest.parent.exists() else None))
    try:
        for entry in entries:
            name = entry["name"]
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise PackError(f"{bring_back / INDEX}: file name {name!r} leaves the harvest folder")
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            digest = hashlib.sha256()
            with open(target, "wb") as out:
                for chunk in entry["chunks"]:
                    volume = chunk["volume"]
                    if volume not in tars:
                        try:
                            tars[volume] = tarfile.open(bring_back / volume)
                        except (OSError, tarfile.TarError) as exc:
                            raise PackError(f"{bring_back / volume}: volume missing or unreadable ({exc}); "
                                            f"{name} is in it") from exc
                    try:
                        data = tars[volume].extractfile(chunk["member"])
                    except KeyError:
                        data = None
                    if data is None:
                        raise PackError(f"{bring_back / volume}: no member {chunk['member']} ({name})")
                    block = data.read()
                    digest.update(block)
                    out.write(block)
            if digest.hexdigest() != entry["sha256"]:
                raise PackError(f"{name}: sha256 differs from the one packed (a damaged volume)")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(bring_back / INDEX, staging / INDEX)
        os.replace(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        for tar in tars.values():
            tar.close()
    return index
