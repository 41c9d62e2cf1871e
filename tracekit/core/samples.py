"""The operator-sample contract: one row per timed operator instance, whatever the source."""
from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:  # pandas is imported where rows are conformed
    import pandas as pd

#: The kernels hybrid models add (predictor.layers.kernel_work: their work; extractors.kineto.classify: their kernel
#: names): Mamba2's causal convolution and SSD scan, Gated DeltaNet's chunked rule, DSA's indexer and sparse attention.
HYBRID_PRIMITIVES = (
    "causal_conv1d", "ssd_chunk_cumsum", "ssd_chunk_state", "ssd_state_passing", "ssd_bmm_chunk", "ssd_chunk_scan",
    "gdn_chunk_rule", "dsa_index_scores", "dsa_topk", "sparse_attention",
)
#: DESIGN.md's primitives. `other` holds what no rule classified (kept and counted, never dropped).
COMPUTE_PRIMITIVES = (
    "gemm", "bmm", "attention", "softmax", "norm", "activation", "elementwise",
    "embedding", "cross_entropy", "optimizer", *HYBRID_PRIMITIVES,
)
MEMORY_PRIMITIVES = ("memcpy", "memset")
COLLECTIVE_PRIMITIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")
#: Framework time per compute operator that no operator sample holds (eager PyTorch's module calls, views, autograd
#: bookkeeping between operators), sampled on CPU as a reference layer's time minus its operators' own times.
HOST_PRIMITIVES = ("framework",)
PRIMITIVES = COMPUTE_PRIMITIVES + MEMORY_PRIMITIVES + COLLECTIVE_PRIMITIVES + HOST_PRIMITIVES + ("other",)

#: `source_path` of `tracekit sample`'s rows timed by the host's clock around each call and a synchronize (a CPU's
#: operators, host costs, collectives, and the first harvest's GPU kernels), and of a GPU's kernels timed on the
#: device (tracekit.sampling.clocks).
HOST_CLOCK_SOURCE = "tracekit-sample"
DEVICE_CLOCK_SOURCE = "tracekit-sample-device"

#: Suffix of an optimizer step's variant over DTensor parameters (torch FSDP2's sharded parameters: every op of the
#: step dispatches through DTensor), beside the plain-tensor step of the same stage (`firstStage_optimizer`).
DTENSOR_SUFFIX = "_dtensor"
#: Suffix of an optimizer step's variant with a fused multi-tensor Adam (torch's `fused=True` AdamW, as TE's and apex's
#: FusedAdam step), beside the plain step of the same stage (a GPU's: torch's `foreach` AdamW, Megatron's fallback).
FUSED_SUFFIX = "_fused"

#: PyTorch FSDP2's copies around its collectives, by op name (the `variant` of their elementwise rows wherever they
#: come from: a trace's op, `tracekit sample`, the predictor's graph): each unit's parameter shards into the
#: all-gather buffer, the gathered buffer out into the unsharded parameters, the unsharded gradients into the
#: reduce-scatter buffer. Their `numel` is the elements copied (`rows` = numel, `width` 1: one flat buffer).
FSDP_COPY_IN, FSDP_COPY_OUT, FSDP_GRAD_COPY_IN = (
    "fsdp::all_gather_copy_in", "fsdp::split_with_sizes_copy", "fsdp::chunk_cat")
FSDP_COPIES = (FSDP_COPY_IN, FSDP_COPY_OUT, FSDP_GRAD_COPY_IN)
#: The `framework` variant of FSDP2's own host time per unit and pass (its hooks, beyond the unit's operators and
#: copies), beside `reference_layer`'s time per compute operator.
FSDP2_UNIT = "fsdp2_unit"

#: A gated linear unit's activation rows (SwiGLU, GLU: the FC1 output's two halves in, one half out) are stored as
#: the GELU rows that move the same bytes, per pass: forward it reads both halves and writes one (3 element moves per
#: output element against GELU's 2), backward it reads the gradient and both halves and writes both halves'
#: gradients (5 against 3). `rows` and `numel` of a GLU row are its output's times this factor (`width` is the
#: output's), as the predictor sizes them (predictor.layers.mlp.activation) and `tracekit sample` stores them.
GLU_ROW_SCALE = {"fwd": 3.0 / 2.0, "bwd": 5.0 / 3.0}

#: Passes, as stored: forward, backward, optimizer step, communication.
PASSES = ("fwd", "bwd", "optimizer", "comm")

#: Roles of a backward row, all keyed by the forward op's shape features: `whole` is the whole backward of one
#: forward op (the seed paper's `bwd` samples, a CPU run's autograd node, a GPU node's kernels together); a GEMM's
#: backward splits into `dgrad` (gradient of its input, dY·Wᵀ), `wgrad` (of its weight, Xᵀ·dY) and `bgrad` (the
#: bias, a reduction of dY). Parquet parts written before the column existed read as null (unlinked).
ROLES = ("whole", "dgrad", "wgrad", "bgrad")
GEMM_ROLES = ("dgrad", "wgrad", "bgrad")

#: Shape features; each primitive fills the ones that describe it and leaves the rest null.
FEATURE_COLUMNS = (
    "m", "n", "k", "batch",                      # gemm / bmm: [batch ×] (m×k) @ (k×n)
    "heads", "kv_heads", "seq", "seq_kv", "head_dim", "causal",  # attention (batch in `batch`)
    "rows", "width",                             # norm / softmax / activation / elementwise / embedding / cross_entropy
    "numel",                                     # element count of the main tensor (any primitive)
    "params",                                    # optimizer: parameters updated; embedding: vocab rows
    "layers", "tp",                              # optimizer samples of a pipeline stage
    "bytes", "group_size", "ranks_per_node", "nodes",  # collectives: message bytes per rank, topology
)

SCHEMA = pa.schema(
    [
        pa.field("hardware", pa.string(), nullable=False),
        pa.field("primitive", pa.string(), nullable=False),
        pa.field("pass", pa.string(), nullable=False),
        pa.field("dtype", pa.string()),
        pa.field("variant", pa.string()),          # source label: launching op (aten::mm) or sample-file op name
        pa.field("role", pa.string()),             # bwd rows: ROLES (None: a backward kernel not linked to its op)
        *[pa.field(name, pa.float64()) for name in FEATURE_COLUMNS],
        pa.field("duration_us", pa.float64(), nullable=False),
        pa.field("wait_us", pa.float64()),          # collectives matched across ranks: time spent waiting
        pa.field("process_group", pa.string()),
        pa.field("stream", pa.int64()),
        pa.field("rank", pa.int64()),
        pa.field("iteration", pa.int64()),
        pa.field("kernel", pa.string()),            # kernel name(s), or the op name on CPU runs
        pa.field("source", pa.string(), nullable=False),       # content hash of the source file
        pa.field("source_path", pa.string()),       # file name (no directories) of the source
    ]
)
COLUMNS = tuple(SCHEMA.names)


def empty_table() -> pa.Table:
    return SCHEMA.empty_table()


def to_table(rows: list[dict] | pa.Table | pd.DataFrame) -> pa.Table:
    """Conform rows (list of dicts, a pandas DataFrame or a table) to SCHEMA; missing columns become null."""
    if isinstance(rows, pa.Table) and rows.schema.equals(SCHEMA):  # already conformed (ingest builds its tables so)
        return rows
    import pandas as pd

    if isinstance(rows, pa.Table):
        frame = rows.to_pandas()
    elif isinstance(rows, pd.DataFrame):
        frame = rows
        if list(frame.columns) == list(COLUMNS):  # fast path: already in schema order with convertible dtypes
            try:
                return pa.Table.from_pandas(frame, schema=SCHEMA, preserve_index=False)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
                pass
    else:
        frame = pd.DataFrame(list(rows))
    unknown = set(frame.columns) - set(COLUMNS)
    if unknown:
        raise ValueError(f"columns not in the sample schema: {sorted(unknown)}")
    arrays = []
    for field in SCHEMA:
        if field.name in frame.columns:
            arrays.append(pa.array(frame[field.name].tolist(), type=field.type, from_pandas=True))
        else:
            arrays.append(pa.nulls(len(frame), type=field.type))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)
