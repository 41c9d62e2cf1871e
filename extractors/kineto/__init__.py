"""Kineto (PyTorch profiler) traces → classified device events and operator samples.

Public API (other parts of tracekit build on these names):

- ``read_trace(path) -> KinetoTrace`` parses one .json / .json.gz trace, redacted (the trace's ``metadata``
  environment block is never decoded or kept). Raises ``InputError(path, reason)`` for a truncated/corrupt gzip,
  a file that is not JSON, JSON that is not a trace, a Chakra execution trace, a GPU run without device
  activity, or a trace with nothing timed in it.
- ``KinetoTrace``: ``path``, ``hardware`` (normalized id from deviceProperties; ``cpu-<model>`` for CPU runs;
  ``unknown`` when the trace has no deviceProperties), ``rank`` / ``world_size`` (None when unknown),
  ``iterations`` (list of ``(step_number, start_us, end_us)`` from ``ProfilerStep#N``; empty if none), ``kernels``
  (events of category ``kernel`` in the file), ``size_bytes`` (uncompressed), ``base_time_ns``, ``is_cpu_run``,
  ``events`` (an ``EventTable``: the columns ``EVENT_COLUMNS`` as numpy arrays and lists, what ingest reads without
  pandas) and ``device_events`` (the same as a pandas DataFrame, built on first use), one row per GPU kernel /
  memcpy / memset (on CPU runs: per timed top-level operator and gloo collective):

  ``ts_us``, ``dur_us``  start and duration in µs on the trace's own clock (same clock as ``iterations``);
  ``stream``             CUDA/HIP stream (thread id on CPU runs);  ``name`` kernel name (op name on CPU runs);
  ``kind``               ``kernel`` | ``memcpy`` | ``memset`` | ``cpu_op``;
  ``category``           ``computation`` | ``communication`` | ``memory``;
  ``primitive``          one of tracekit.core.samples.PRIMITIVES (``other`` when unclassified);
  ``pass``               ``fwd`` | ``bwd`` | ``optimizer`` | ``comm``;  ``dtype`` e.g. ``bf16`` (None if unknown);
  ``op``                 launching operator (e.g. ``aten::addmm``; None when the launch is not in the trace and
                         its twins do not name it, see ``op_from_twin``);
  ``op_from_twin``       the kernel's launch is not in the trace (most often: it started before the profiler's CPU
                         window) and ``op`` with its shapes is that of its twins: same name and grid/block, all
                         launched by one op with the same inputs, or the same place in a run of kernels that
                         recurs (twins.py);
  ``iteration``          ProfilerStep number of the launch (-1 outside profiler steps);
  FEATURE_COLUMNS        shape features (m, n, k, batch, heads, ..., bytes, group_size), NaN where not applicable;
  ``process_group``, ``process_group_desc``, ``comm_seq``  collective group id/description, sequence number in it
                         (recorded Seq, else launch order in the group; named so because FEATURE_COLUMNS has `seq`);
  ``wait_us``            collectives matched across ranks: time spent waiting for the slowest rank (else NaN);
  ``layer``              innermost user annotation (Megatron/module range) around the op, else None;
  ``launch_ts_us``       start of the runtime launch call (CPU runs: of the c10d call that issued gloo work; NaN if
                         absent);
  ``blocked_us``         CPU runs, gloo work of a synchronous call: the calling thread's time from the call to its
                         next operator (what the collective cost the step); NaN otherwise;
  ``role``, ``fwd_op``, ``bwd_node``  backward compute work linked to its forward op (backward.py): role ``dgrad`` |
                         ``wgrad`` | ``bgrad`` (a GEMM's) or ``whole``, the forward op's name (its primitive, dtype and
                         shape features replace the launching op's) and the autograd node's op row (-1: unlinked).
- ``trace_samples(trace, source_id) -> DataFrame`` in the sample schema (collectives carry transfer time; a
  backward node's linked kernels are one row per role).
- ``ingest_paths(paths, store, progress=None, jobs=None) -> IngestResult``: files, directories (one run each, rank
  files matched for collectives; a large run's files parsed by `jobs` processes, every core by default) and globs
  into a SampleStore; ``IngestResult.as_json()`` is the ``--json`` document
  ``{"traces": [...], "errors": [{"path", "error"}]}``.
- ``match_collectives(tables)`` splits matched collectives of one run's ranks (their ``events``) into wait and
  transfer.
- ``is_trace_name(path)``: whether a file name is one ingest picks up (``*.json``, ``*.json.gz``);
  ``CAPTURE_MANIFEST``: the name of a capture folder's own JSON, which is never a trace.
- ``open_trace(path) -> TraceFile``: a trace file's redacted header (``device_properties``, ``distributed_info``
  with its ``pg_config`` process groups) and raw events, without classifying them; same refusals as read_trace.
"""
from .collectives import match_collectives
from .columns import EVENT_COLUMNS
from .ingest import CAPTURE_MANIFEST, IngestResult, find_runs, ingest_paths, trace_samples
from .load import TraceFile, is_trace_name, open_trace
from .table import EventTable
from .trace import KinetoTrace, read_trace

__all__ = [
    "CAPTURE_MANIFEST", "EVENT_COLUMNS", "EventTable", "IngestResult", "KinetoTrace", "TraceFile", "find_runs",
    "ingest_paths", "is_trace_name", "match_collectives", "open_trace", "read_trace", "trace_samples",
]
