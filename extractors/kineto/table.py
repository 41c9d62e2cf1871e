"""`EventTable`: a trace's device events as plain columns, what ingest reads and writes. Ingest never builds a pandas
DataFrame: importing pandas alone takes about as long as parsing a folder of small traces, so the `tracekit ingest`
command does without it; `KinetoTrace.device_events`, the DataFrame the library's other readers use, is built from
these columns on first use (`to_pandas`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .columns import EVENT_COLUMNS

if TYPE_CHECKING:  # pandas is imported where the frame is built
    import pandas as pd


class EventTable:
    """One row per device event, the columns of `EVENT_COLUMNS`: numbers as numpy arrays, text as lists of
    str | None, `comm_seq` as a list of int | None (the frame's nullable Int64 column)."""

    __slots__ = ("_columns", "_objects", "_frame")

    def __init__(self, columns: dict[str, Any]):
        self._columns = {name: columns[name] for name in EVENT_COLUMNS}
        self._objects: dict[str, np.ndarray] = {}  # list columns as object arrays, made on first use
        self._frame: pd.DataFrame | None = None

    def __len__(self) -> int:
        return len(self._columns["ts_us"])

    def __getitem__(self, name: str) -> np.ndarray:
        """The column as a numpy array (an object array for text; do not write to it: `set`)."""
        value = self._columns[name]
        if isinstance(value, np.ndarray):
            return value
        if name not in self._objects:
            array = np.empty(len(value), dtype=object)
            array[:] = value
            self._objects[name] = array
        return self._objects[name]

    def set(self, name: str, row: int, value: Any) -> None:
        """One cell of a numeric column (collective matching writes `wait_us` so)."""
        self._columns[name][row] = value
        self._frame = None

    def take(self, rows: Sequence[int] | np.ndarray) -> EventTable:
        """The table of these rows, in this order."""
        rows = np.asarray(rows, dtype=np.int64)
        return EventTable({name: value[rows] if isinstance(value, np.ndarray) else [value[i] for i in rows.tolist()]
                           for name, value in self._columns.items()})

    def copy(self) -> EventTable:
        """A table whose columns are this one's, copied (writable where these are not: Ray's object store)."""
        return EventTable({name: value.copy() if isinstance(value, np.ndarray) else list(value)
                           for name, value in self._columns.items()})

    def to_pandas(self) -> pd.DataFrame:
        """The columns as a DataFrame (`KinetoTrace.device_events`), built once."""
        import pandas as pd

        if self._frame is None:
            self._frame = pd.DataFrame({**self._columns,
                                        "comm_seq": pd.array(self._columns["comm_seq"], dtype="Int64")})
        return self._frame
