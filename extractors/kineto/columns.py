"""The columns of `KinetoTrace.device_events`, in order: one list that GPU traces (`trace.py`) and CPU runs
(`cpu.py`) both build their frames with, so the two readers cannot drift apart (and neither imports the other for
it). The meaning of each column is in the package docstring (`extractors.kineto`)."""
from __future__ import annotations

from tracekit.core.samples import FEATURE_COLUMNS

#: Columns of KinetoTrace.device_events, in order (FEATURE_COLUMNS sit between `iteration` and the collective fields).
EVENT_COLUMNS = (
    "ts_us", "dur_us", "stream", "name", "kind", "category", "primitive", "pass", "dtype", "op", "op_from_twin",
    "iteration", *FEATURE_COLUMNS, "process_group", "process_group_desc", "comm_seq", "wait_us", "layer",
    "launch_ts_us", "blocked_us", "role", "fwd_op", "bwd_node",
)
