"""The small collectives a Megatron training loop runs once per iteration besides the gradients' (read in Megatron-LM's
`megatron/training/training.py` and `megatron/core/timers.py`):

- **The loss report.** After the optimizer step, `train_step` sums each micro-batch's (loss, tokens) pair on the last
  pipeline stage and all-reduces the pair over the data- and context-parallel ranks (`torch.distributed.all_reduce(val,
  group=dp_cp_group)`): every iteration, 2 fp32 values.
- **The logging barrier.** Every `--log-interval` iterations `training_log` reads the `interval-time` timer with
  `barrier=True`, a `torch.distributed.barrier()` over every rank: 1/log_interval of one per iteration (Megatron's
  default interval is 100). PyTorch's NCCL process group runs a barrier as an all-reduce of one value; it is timed so
  here, on every rank of the job.

tracekit's reference trainer does both the same way. On a GPU each is a few tens of µs; on CPU runs over gloo, where
a small all-reduce takes 0.5–2 ms, they are a few per cent of a small data-parallel iteration. Both run after the
step with nothing beside them, so the schedule adds them to the stage's end, exposed (`schedule.StageEnd.report_us`).
No constant is fitted here.
"""
from __future__ import annotations

from predictor.ir.ops import OpBuilder, OpUse
from tracekit.core.errors import ConfigError

#: Megatron's `--log-interval` default.
DEFAULT_LOG_INTERVAL = 100
#: The loss report's values: the micro-batches' loss sum and token count, fp32.
LOSS_REPORT_BYTES = 2 * 4
#: The barrier's one value (an fp32 all-reduce, as PyTorch's NCCL group runs it).
BARRIER_BYTES = 4


def log_interval(extra: dict) -> int:
    """Iterations between Megatron's training-log lines (the configuration's `log_interval`, default 100); a
    ConfigError unless a positive whole number (Megatron takes it modulo the iteration)."""
    value = extra.get("log_interval")
    if value in (None, ""):
        return DEFAULT_LOG_INTERVAL
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = 0.0
    if number < 1 or number != int(number):
        raise ConfigError(f"log_interval must be a positive whole number of iterations, not {value!r}")
    return int(number)


def stage_ops(b: OpBuilder, stage: int) -> list[tuple[OpUse, float]]:
    """(op, times per iteration) of the loss report and the logging barrier that pipeline stage `stage` runs."""
    c = b.c
    out: list[tuple[OpUse, float]] = []
    if stage == c.pp - 1:
        report = b.collective("loss.report_all_reduce", "all_reduce", "dpcp", LOSS_REPORT_BYTES, False)
        if report is not None:
            out.append((report, 1.0))
    barrier = b.collective("log.interval_barrier", "all_reduce", "world", BARRIER_BYTES, False)
    if barrier is not None:
        out.append((barrier, 1.0 / log_interval(c.extra)))
    return out
