"""Megatron's gradient buckets: in how many collectives each model chunk's gradients are reduced, and how big each is
(the pinned Megatron-LM's `training.py: resolve_ddp_bucket_size` and `wrap_model_chunks_with_ddp`,
`distributed_data_parallel.py`, `param_and_grad_buffer.py`).

- **The bucket size** (elements): with `ddp_num_buckets` N, the rank's parameters (every chunk, dense and expert) // N;
  else `ddp_bucket_size`; else max(40M, 1M · the dp·cp ranks).
- **No bucketing** — the chunk's whole buffer in one collective — without `overlap_grad_reduce` (every bucket would
  start after the last backward anyway), on every pipeline stage but the first (their reduction is off the critical
  path, Megatron's comment says) and for every model chunk but the first of the interleaved schedule.
- A chunk's dense and expert parameters are buffers of their own, each cut with that size.

Megatron walks a buffer's parameters in backward order and closes a bucket at the end of the parameter that brings it
to the size; tracekit cuts the buffer into buckets of the size and a last one with the rest, never into more buckets
than the chunk has parameter tensors (predictor.architecture.tensors: a bucket holds at least one), in equal slices
then. DeepSpeed's ZeRO-0/1 and torch DDP (torchtitan's `replicate`) are priced with these buckets too.

Before a bucket's collective, Megatron's DDP multiplies the bucket's gradients in place by its scaling factor
(`param_and_grad_buffer.py: start_grad_sync`) wherever that factor is not 1: 1/(dp·cp ranks) by default, for dense
and expert buffers alike; with `ddp_average_in_collective` the collective averages and only the expert buffers are
scaled (by their ranks over the dense buffers' ranks: edp/dp·cp); with `calculate_per_token_loss` nothing is scaled
before the collective and every buffer is divided by the global batch's token count after it
(`finalize_model_grads`). `scaled_elements` counts the gradient elements those passes read and write on a stage.
"""
from __future__ import annotations

from predictor.architecture.params import chunk_params
from predictor.architecture.tensors import chunk_tensors
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError
from tracekit.core.runtime import RuntimeSettings

#: Per model chunk of a pipeline stage, the elements of each bucket of its dense and of its expert buffer.
StageBuckets = list[tuple[list[int], list[int]]]
#: Megatron's default bucket: at least this many elements ...
MIN_ELEMENTS = 40_000_000
#: ... and this many per data- and context-parallel rank (NCCL's ring chunks stay bandwidth-bound at large dp).
PER_RANK_ELEMENTS = 1_000_000


def _whole(c: TrainingConfig, key: str) -> int | None:
    value = c.extra.get(key)
    if value is None:
        return None
    if int(value) < 1:
        raise ConfigError(f"{key} must be ≥ 1, got {value}")
    return int(value)


def bucket_size(c: TrainingConfig, stage: int, chunk: int, rank_params: int, dpcp_ranks: int) -> int | None:
    """Elements per gradient bucket of model chunk `chunk` on pipeline stage `stage`, or None for one bucket of the
    whole buffer (module docstring); `rank_params`: every parameter the rank holds (all its chunks, dense and
    expert), what `ddp_num_buckets` divides."""
    num_buckets, size = _whole(c, "ddp_num_buckets"), _whole(c, "ddp_bucket_size")
    if not c.overlap_grad_reduce or stage > 0 or chunk > 0:
        return None
    if num_buckets is not None:
        return max(1, rank_params // num_buckets)
    if size is not None:
        return size
    return max(MIN_ELEMENTS, PER_RANK_ELEMENTS * dpcp_ranks)


def chunk_tag(chunk: int) -> str:
    """What a bucket collective's name says of its model chunk: nothing for the first (`ddp.bucket3.all_reduce`),
    `chunk1.` for the second (`ddp.chunk1.bucket0.all_reduce`)."""
    return f"chunk{chunk}." if chunk else ""


def bucket_elements(params: int, size: int | None, tensors: int) -> list[int]:
    """The elements of each bucket of a buffer of `params` elements in `tensors` parameter tensors, cut in buckets of
    `size` (None: one bucket) — full ones and the rest, or equal slices when that would be more buckets than
    tensors."""
    if params <= 0:
        return []
    if size is None or size >= params:
        return [params]
    count = -(-params // size)
    if count <= max(1, tensors):
        return [min(size, params - i * size) for i in range(count)]
    count = max(1, tensors)
    return [params // count + (1 if i < params % count else 0) for i in range(count)]


def scaled_elements(c: TrainingConfig, buckets: StageBuckets, dpcp_ranks: int, edp_ranks: int) -> int:
    """Gradient elements Megatron's DDP scales in place once per iteration on a pipeline stage whose buffers are cut
    into `buckets` (`stage_buckets`; module docstring): each chunk's dense and expert buffers, where their scaling
    factor is not 1."""
    run = c.run or RuntimeSettings()
    if run.per_token_loss:
        dense_scaled = expert_scaled = True
    elif run.average_in_collective:
        dense_scaled, expert_scaled = False, edp_ranks != dpcp_ranks
    else:
        dense_scaled = expert_scaled = dpcp_ranks > 1
    return sum((sum(dense) if dense_scaled else 0) + (sum(expert) if expert_scaled else 0) for dense, expert in buckets)


def stage_buckets(c: TrainingConfig, stage: int, dpcp_ranks: int) -> StageBuckets:
    """Per model chunk of pipeline stage `stage`, the elements of each bucket of its dense and of its expert buffer
    (module docstring; `dpcp_ranks`: the ranks a dense parameter is reduced over)."""
    per_chunk = [chunk_params(c, stage, chunk) for chunk in range(c.vp)]
    rank_params = sum(d + e for d, e in per_chunk)
    out = []
    for chunk, (dense, expert) in enumerate(per_chunk):
        size = bucket_size(c, stage, chunk, rank_params, dpcp_ranks)
        tensors = chunk_tensors(c, stage, chunk).tensors if size is not None else 1  # the floor of a cut buffer
        out.append((bucket_elements(dense, size, tensors), bucket_elements(expert, size, tensors)))
    return out
