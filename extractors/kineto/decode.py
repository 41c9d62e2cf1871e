"""Decode a trace's raw JSON event array into EventColumns (`extractors.kineto.events`): in one pass when small,
else in chunks of ~16 MB cut at `},{` boundaries (a cut that lands inside a string or nested object fails to
decode, and then the array is split exactly into raw events first), each chunk reduced to typed arrays before the
next."""
from __future__ import annotations

import re

import msgspec

from .events import EVENTS, RAW_LIST, ColumnBuilder, EventColumns

#: Chunk sizes of the chunked decoder: bytes (boundary scan) and events (exact fallback).
CHUNK_BYTES = 16 << 20
CHUNK_EVENTS = 50_000
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
#: Arrays larger than this (bytes) are decoded in chunks.
CHUNK_THRESHOLD = 16 << 20


def _byte_chunks(view: memoryview):
    """Split a JSON event array at `},{` boundaries about CHUNK_BYTES apart; yields JSON arrays (bytearrays).

    A boundary found inside a string or a nested object makes that chunk invalid JSON (or not a list of events),
    which the caller detects by failing to decode it, and then falls back to the exact two-pass split.
    """
    end = len(view)
    while end > 0 and view[end - 1:end] in (b" ", b"\n", b"\r", b"\t"):
        end -= 1
    if view[:1] != b"[" or view[end - 1:end] != b"]":
        raise msgspec.DecodeError("event array is not a JSON array")
    start = 1
    while start < end - 1:
        match = _BOUNDARY.search(view, start + CHUNK_BYTES, end - 1) if start + CHUNK_BYTES < end - 1 else None
        stop = match.start() + 1 if match else end - 1
        chunk = bytearray(b"[")
        chunk += view[start:stop]
        chunk += b"]"
        yield chunk
        start = match.end() - 1 if match else end


def event_columns(events: list) -> EventColumns:
    """EventColumns of already decoded events (a list of `Event`)."""
    builder = ColumnBuilder()
    builder.add(events)
    return builder.finish()


def decode_events(events_raw) -> EventColumns:
    """Decode a raw JSON event array into EventColumns (chunked when large). Raises msgspec errors."""
    view = memoryview(events_raw)
    if len(view) <= CHUNK_THRESHOLD:
        return event_columns(EVENTS.decode(view))
    builder = ColumnBuilder()
    try:
        for chunk in _byte_chunks(view):
            builder.add(EVENTS.decode(chunk))
        return builder.finish()
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    builder = ColumnBuilder()  # exact fallback: split into raw events first, then decode chunks of them
    raws = RAW_LIST.decode(view)
    for start in range(0, len(raws), CHUNK_EVENTS):
        part = raws[start:start + CHUNK_EVENTS]
        chunk = b"[" + b",".join(part) + b"]"
        del part
        builder.add(EVENTS.decode(chunk))
        del chunk
    del raws
    return builder.finish()
