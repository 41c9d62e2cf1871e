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


def match_collectives(frames: list) -> MatchReport:
    """Match the collectives of one run's ranks (device_events frames, edited in place: `wait_us`).

    Only frames with distinct ranks should be passed. A collective is matched when every rank that took part
    (its group size, or all frames given when the size is unknown) has an entry with the same key, kind and
    message size (the size check keeps traces without process-group names from pairing different groups);
    collectives whose group has members outside the given frames stay unmatched.
    """
    import pandas as pd

    parts = []
    for f_index, frame in enumerate(frames):
        comm = frame[(frame["category"] == "communication") & (frame["primitive"] != "send_recv")]
        if comm.empty:
            continue
        parts.append(pd.DataFrame({
            "frame": f_index, "row": comm.index, "pg": comm["process_group"].fillna("default").to_numpy(),
            "seq": comm["comm_seq"].to_numpy(), "kind": comm["primitive"].to_numpy(), "dur": comm["dur_us"].to_numpy(),
            "size": comm["group_size"].to_numpy(), "bytes": comm["bytes"].to_numpy(),
        }))
    if not parts:
        return MatchReport(0, 0, 0)
    allc = pd.concat(parts, ignore_index=True)
    matched = unmatched = mismatched = 0
    n_frames = len(frames)
    for _, group in allc.groupby(["pg", "seq"], sort=False):
        expected = group["size"].iloc[0]
        expected = int(expected) if pd.notna(expected) and expected > 0 else n_frames
        if group["kind"].nunique() > 1 or group["bytes"].nunique() > 1:
            mismatched += 1
            unmatched += len(group)
            continue
        if len(group) < 2 or group["frame"].nunique() != len(group) or len(group) != expected:
            unmatched += len(group)
            continue
        transfer = group["dur"].min()
        for frame_index, row, dur in zip(group["frame"], group["row"], group["dur"]):
            frames[frame_index].at[row, "wait_us"] = float(dur - transfer)
        matched += 1
    return MatchReport(matched, unmatched, mismatched)
