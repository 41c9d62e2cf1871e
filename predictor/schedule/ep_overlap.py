"""Which passes of Megatron-core's combined 1F1B schedule run alone: the expert-parallel overlap's exposed passes.

With `overlap_moe_expert_parallel_comm`, Megatron-core runs a micro-batch's forward beside another micro-batch's
backward, layer by layer, so that each pass's token dispatch and combine run under the other pass's attention and
MLP compute (`megatron/core/pipeline_parallel/combined_1f1b.py`). Without pipelining
(`combined_1f1b_schedule_for_no_pipelining`, M micro-batches) the schedule is: the first micro-batch's forward alone,
then M − 1 phases of (backward of micro-batch i, forward of micro-batch i + 1), then the last micro-batch's backward
alone. The forward and the backward that run alone have nothing to hide their expert-parallel collectives under:
they expose them as a schedule without the overlap does. Of the M forwards and M backwards, one of each: a share
1 / M of every forward and backward pass (tracekit times one micro-batch's forward and backward and repeats them).

With pipelining (the interleaved combined schedule) the warm-up forwards and cool-down backwards run alone too;
tracekit keeps the overlap over every pass there (not modelled: `alone_share` returns 0).
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from predictor.schedule.pipeline import Work
    from tracekit.core.config import TrainingConfig


def alone_share(config: TrainingConfig) -> float:
    """Share of the forward (and of the backward) passes that the combined 1F1B schedule runs alone: 1 / M without
    pipelining under `overlap_moe_expert_parallel_comm`, 0 otherwise (module docstring)."""
    moe = config.moe
    if moe is None or not moe.overlap_moe_expert_parallel_comm or config.pp > 1:
        return 0.0
    return 1.0 / max(1, config.num_microbatches)


def with_alone_passes(overlapped: Work, alone: Work, share: float) -> Work:
    """One micro-batch's pass as the schedule's mean: `overlapped` (its expert collectives under the other pass's
    compute) for 1 − `share` of the passes, `alone` (exposed) for `share`: the difference of their blocking
    communication is exposed communication."""
    if share <= 0.0:
        return overlapped
    extra = max(0.0, alone.comm - overlapped.comm)
    return replace(overlapped, comm=overlapped.comm + share * extra)
