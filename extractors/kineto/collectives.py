"""Collectives: kind, message bytes, group size and process group from any of the three comm-metadata
generations, and cross-rank matching that splits each collective into waiting and transfer.

Generations: (a) `record_param_comms` with only `Input Dims`, plus an `nccl:<kind>` annotation holding the
message tensor; (b) ~PyTorch 2.2: `Collective name`, `In/Out msg nelems`, `Group size`, `dtype`, `Process Group
Name/Ranks` on record_param_comms; (c) ≥ 2.3: the same fields copied onto the NCCL kernel itself.

Message bytes = `In msg nelems` × dtype size (the per-rank input of the collective); generation (a) uses the
element count and type of the annotation's (or record_param_comms') input tensor.

Matching (one run, several ranks): collectives are keyed by process group and their sequence number in it (the
recorded `Seq` where the trace has one, else their launch order within the group on that rank; NCCL requires
every member to issue a group's collectives in the same order). All members of a collective finish together, so
the member whose kernel is shortest arrived last and spent (almost) no time waiting: transfer = the shortest
member's duration, and each member's wait = its duration − transfer. This needs no clock alignment between hosts.
Point-to-point transfers are not matched (traces do not name the peer): they keep their whole duration.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson

from .classify import collective_kind
from .events import CommFields
from .shapes import DTYPE_BYTES, dtype_name, tensor_bytes
from .table import EventTable


@dataclass
class CommInfo:
    primitive: str
    bytes: float | None
    group_size: float | None
    process_group: str | None
    process_group_desc: str | None
    dtype: str | None
    seq: int | None


def _group_size(fields: CommFields | None, world_size: int | None) -> float | None:
    if fields is not None:
        if fields.group_size:
            return float(fields.group_size)
        if fields.pg_ranks:
            try:
                ranks = orjson.loads(fields.pg_ranks)
                if isinstance(ranks, list) and ranks:
                    return float(len(ranks))
            except orjson.JSONDecodeError:
                pass
    return float(world_size) if world_size else None


def comm_info(kernel: str, fields: CommFields | None, annotation: str | None, ann_blobs: tuple | None,
              op_blobs: tuple | None, world_size: int | None) -> CommInfo:
    """Describe one communication kernel from whatever metadata its trace generation has."""
    kind = collective_kind(fields.name if fields else None, annotation, kernel) or "other"
    dtype = dtype_name(fields.dtype) if fields and fields.dtype else None
    nbytes = None
    if fields is not None and fields.in_nelems is not None and dtype in DTYPE_BYTES:
        nbytes = float(fields.in_nelems * DTYPE_BYTES[dtype])
    if nbytes is None:
        for blobs in (ann_blobs, op_blobs):
            if blobs:
                size, tdtype = tensor_bytes(*blobs)
                if size is not None:
                    nbytes, dtype = float(size), dtype or tdtype
                    break
    group = fields.pg_name if fields else None
    desc = fields.pg_desc if fields else None
    known_group = fields is not None and (fields.group_size or fields.pg_ranks)
    group_size = _group_size(fields, world_size) if (known_group or kind != "send_recv") else 2.0  # a pair
    return CommInfo(kind, nbytes, group_size, group, desc, dtype, fields.seq if fields else None)


def assign_sequence(process_group: list, kinds: list, launch_order: np.ndarray, recorded: list) -> list:
    """Per collective row: its recorded Seq, else its position in launch order within its process group.

    Point-to-point transfers are counted apart: different ranks issue different numbers of them (pipeline
    stages), so counting them with the group's collectives would misalign the collectives' sequence numbers."""
    seq = list(recorded)
    counters: dict = {}
    for row in launch_order.tolist():
        if seq[row] is None:
            key = (process_group[row] or "default", kinds[row] == "send_recv")
            seq[row] = counters.get(key, 0)
            counters[key] = seq[row] + 1
    return seq


@dataclass
class MatchReport:
    matched: int  # collectives matched across all their ranks
    unmatched: int  # collective rows left without a full set of peers
    mismatched_kind: int  # keys where ranks disagree on the kind or message size (left unmatched)


def match_collectives(tables: list[EventTable]) -> MatchReport:
    """Match the collectives of one run's ranks (their `KinetoTrace.events`, edited in place: `wait_us`).

    Only tables with distinct ranks should be passed. A collective is matched when every rank that took part
    (its group size, or all tables given when the size is unknown) has an entry with the same key, kind and
    message size (the size check keeps traces without process-group names from pairing different groups);
    collectives whose group has members outside the given tables stay unmatched. The key is the process group
    (`default` when unnamed) and the collective's sequence number in it; one without a number is not matched.
    """
    groups: dict[tuple[str, int], list[tuple[int, int, str, float, float, float]]] = {}
    for t_index, table in enumerate(tables):
        comm = np.flatnonzero((table["category"] == "communication") & (table["primitive"] != "send_recv"))
        if not len(comm):
            continue
        pg, seq, kind = table["process_group"][comm], table["comm_seq"][comm], table["primitive"][comm]
        dur, size, nbytes = table["dur_us"][comm], table["group_size"][comm], table["bytes"][comm]
        for j, row in enumerate(comm.tolist()):
            if seq[j] is None:
                continue
            groups.setdefault(("default" if pg[j] is None else pg[j], seq[j]), []).append(
                (t_index, row, kind[j], float(dur[j]), float(size[j]), float(nbytes[j])))
    matched = unmatched = mismatched = 0
    for group in groups.values():
        first_size = group[0][4]
        expected = int(first_size) if first_size == first_size and first_size > 0 else len(tables)
        sizes = {nbytes for *_, nbytes in group if nbytes == nbytes}  # NaN: not recorded
        if len({entry[2] for entry in group}) > 1 or len(sizes) > 1:
            mismatched += 1
            unmatched += len(group)
            continue
        if len(group) < 2 or len({entry[0] for entry in group}) != len(group) or len(group) != expected:
            unmatched += len(group)
            continue
        transfer = min(entry[3] for entry in group)
        for t_index, row, _, took, _, _ in group:
            tables[t_index].set("wait_us", row, took - transfer)
        matched += 1
    return MatchReport(matched, unmatched, mismatched)
