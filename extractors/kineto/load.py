"""Read a Kineto trace file (.json or .json.gz) into raw bytes and a redacted header, with clear refusals.

Decoding is typed (msgspec): only the top-level keys tracekit needs are decoded, so a trace's `metadata`
environment block is skipped by the parser and never becomes a Python object. The event array is handed on as
raw JSON (`events_raw`) for `events.py` to decode in bounded chunks; documents up to ONE_PASS_BYTES can instead be
decoded in one pass, header and events together (`events`), which saves a second parse of the array.
"""
from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import GenericAlias, ModuleType
from typing import Any, Callable

import msgspec

from tracekit.core.errors import InputError
from tracekit.core.redact import redact

_inflate: ModuleType | None
_gunzip_members: Callable[[bytes], bytes]
try:  # ISA-L's gzip decoder is ~2x faster than zlib's; same errors, same output
    from isal import isal_zlib as _inflate
    from isal.igzip import decompress as _gunzip_members
except ImportError:  # pragma: no cover - optional speed-up
    _inflate = None
    _gunzip_members = gzip.decompress

_NOT_BLANK = re.compile(rb"\S")
#: File names ingest picks up from a directory or glob.
TRACE_SUFFIXES = (".json", ".json.gz")
#: Documents up to this size (uncompressed JSON) may be decoded in one pass (larger ones: in chunks, see events.py);
#: at this size the decoded events of one pass take no more memory than a larger trace read in chunks.
ONE_PASS_BYTES = 40 << 20


class NotATraceError(InputError):
    """Valid JSON that is no trace at all (a config.json, a results file): a run folder's ingest skips it with a
    note; named on its own, it is an error."""


class _Header(msgspec.Struct, gc=False):
    traceEvents: msgspec.Raw = msgspec.Raw(b"")
    deviceProperties: Any = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    schemaVersion: Any = None
    cpu_model: Any = None  # tracekit convention: captures add the CPU model with prof.add_metadata("cpu_model", ...)
    # keys that identify a Chakra execution trace (not Kineto)
    nodes: msgspec.Raw = msgspec.Raw(b"")
    schema: Any = None


_HEADER = msgspec.json.Decoder(_Header)


@dataclass
class TraceFile:
    """A trace file's redacted header and its raw event array."""

    path: Path
    size_bytes: int  # uncompressed JSON bytes
    device_properties: list[dict] = field(default_factory=list)
    distributed_info: dict = field(default_factory=dict)
    base_time_ns: int | None = None
    schema_version: Any = None
    cpu_model: str | None = None
    events_raw: msgspec.Raw | bytes = b""
    events: list | None = None  # the decoded events instead, when the document was decoded in one pass


def is_trace_name(path: Path) -> bool:
    """True for names ingest reads: *.json, *.json.gz (incl. *.pt.trace.json[.gz])."""
    name = path.name.lower()
    return path.is_file() and name.endswith(TRACE_SUFFIXES)


def _gunzip(data: bytes) -> bytes:
    """Decompress gzip data. The usual single-member file is inflated in one call; anything else (several
    members, trailing bytes, a damaged stream) goes through the general reader, which raises the precise error
    (EOFError for a truncated stream)."""
    if _inflate is not None:
        inflater = _inflate.decompressobj(31)  # wbits 31: gzip header and trailer
        try:
            out = inflater.decompress(data)
            if inflater.eof and not inflater.unused_data:
                return out
        except _inflate.error:
            pass
    return _gunzip_members(data)


def read_bytes(path: Path) -> bytes:
    """The file's JSON bytes, gunzipped when needed; InputError for unreadable or truncated files."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(path, f"cannot read the file ({exc.strerror or exc})") from exc
    if data[:2] == b"\x1f\x8b":
        try:
            data = _gunzip(data)
        except EOFError as exc:
            raise InputError(path, "truncated gzip file (the compressed stream ends early)") from exc
        except (OSError, zlib.error) as exc:
            raise InputError(path, f"corrupt gzip file ({exc})") from exc
    elif path.name.lower().endswith(".gz"):
        raise InputError(path, "named .gz but is not gzip-compressed")
    return data


@lru_cache(maxsize=None)
def _document_decoder(event_type: type) -> msgspec.json.Decoder:
    """Decoder of a whole trace document: the header fields plus `traceEvents` as a list of `event_type`."""
    events = GenericAlias(list, (event_type,))  # list[event_type], built at run time
    document = msgspec.defstruct("_Document", [("traceEvents", events, [])], bases=(_Header,), gc=False)
    return msgspec.json.Decoder(document)


def _decode_one_pass(data: bytes, event_type: type):
    """The document decoded with its events, or None when it is not a plain Kineto object with events (the
    two-pass route then decides, and words any refusal)."""
    try:
        header = _document_decoder(event_type).decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return header if header.traceEvents else None


def open_trace(path: str | Path, event_type: type | None = None) -> TraceFile:
    """Parse the header of a Kineto trace; refuse files that are not Kineto traces, saying why.

    With `event_type` (a msgspec Struct), a document of at most ONE_PASS_BYTES comes back with its events decoded
    (`events`) rather than as raw JSON (`events_raw`).
    """
    path = Path(path)
    data = read_bytes(path)
    if not _NOT_BLANK.search(data):
        raise InputError(path, "empty file")
    header = _decode_one_pass(data, event_type) if event_type is not None and len(data) <= ONE_PASS_BYTES else None
    if header is not None:
        return _trace_file(path, data, header, events=header.traceEvents)
    try:
        header = _HEADER.decode(data)
    except msgspec.ValidationError:
        # valid JSON but not an object: a bare event array is a Chrome trace too
        try:
            first = msgspec.json.decode(data, type=list[msgspec.Raw])
        except msgspec.ValidationError:
            raise NotATraceError(path, "JSON but not a trace (neither an object with traceEvents nor an event array)")
        except msgspec.DecodeError as exc:
            raise InputError(path, f"not valid JSON ({exc})") from exc
        del first
        return TraceFile(path=path, size_bytes=len(data), events_raw=data)
    except msgspec.DecodeError as exc:
        raise InputError(path, f"not valid JSON ({exc})") from exc
    if not len(memoryview(header.traceEvents)):
        if bytes(header.nodes) and header.schema is not None:
            raise InputError(path, "a Chakra execution trace (nodes/schema), not a Kineto profiler trace")
        raise NotATraceError(path, "JSON but not a Kineto trace (no traceEvents)")
    return _trace_file(path, data, header, events_raw=header.traceEvents)


def _trace_file(path: Path, data: bytes, header, **events) -> TraceFile:
    devices = header.deviceProperties if isinstance(header.deviceProperties, list) else []
    dist = header.distributedInfo if isinstance(header.distributedInfo, dict) else {}
    base = header.baseTimeNanoseconds
    return TraceFile(
        path=path,
        size_bytes=len(data),
        device_properties=[redact(d) for d in devices if isinstance(d, dict)],
        distributed_info=redact(dist),
        base_time_ns=int(base) if isinstance(base, (int, float)) else None,
        schema_version=header.schemaVersion,
        cpu_model=header.cpu_model if isinstance(header.cpu_model, str) else None,
        **events,
    )
