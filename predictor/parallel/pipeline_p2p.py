"""The activation one pipeline stage hands the next per micro-batch (and its gradient back), as the stack moves it.

- **Megatron-core** (and every stack without the setting below): each tensor-parallel rank sends its whole activation
  `[s/cp (/tp with sequence parallelism), b, h]` to the rank of the same tensor-parallel index on the next stage
  (`megatron/core/pipeline_parallel/p2p_communication.py`).
- **Megatron-LM 2020–2022's scatter/gather** (`scatter_gather_tensors_in_pipeline`, on by default there, the
  `megatron-lm-2021` profile sets it; `--no-scatter-gather-tensors-in-pipeline` turned it off; Narayanan et al. 2021,
  §4.1): without sequence parallelism the tensor-parallel ranks hold the same activation, so each sends only its
  1/tp share of it (`split_tensor_into_1d_equal_chunks`) and the receiving ranks all-gather the shares over their
  tensor-parallel group (`gather_split_1d_tensor`, inside the node) — the bytes crossing between the stages' nodes
  fall by tp. Megatron skips it with sequence parallelism (the activation is already split) and where the element
  count does not divide by tp (`megatron/p2p_communication.py: _communicate`). The gather runs after the transfer,
  before the receiving stage's next task, so it lengthens the hand-over (`predictor.schedule.stage_work`).
- **DeepSpeed's pipeline engine** (Megatron-DeepSpeed's pipelined models, GPT-NeoX: the `megatron-deepspeed-2023` and
  `gpt-neox` profiles set the same setting) does the same with a `PartitionedTensor` over the tensor-parallel group,
  activations forward and gradients backward (`pipe_partitioned`, `grad_partitioned`, both true by default in its
  pipeline configuration); Megatron-DeepSpeed's own schedule has Megatron-LM's scatter/gather, on by default.
"""
from __future__ import annotations

from predictor.ir.ops import OpBuilder, OpUse


def scatter_gather(b: OpBuilder) -> bool:
    """Whether the stages hand their activations over as tp shares and an all-gather (module docstring)."""
    c = b.c
    run = c.run
    wanted = run is not None and bool(run.scatter_gather_tensors_in_pipeline)
    numel = b.tokens * c.hidden_size
    return wanted and c.pp > 1 and b.t > 1 and not b.sp and numel % b.t == 0


def p2p_ops(b: OpBuilder) -> tuple[OpUse | None, OpUse | None]:
    """(the transfer between adjacent stages, the all-gather after it) of one activation; (None, None) without a
    pipeline, the gather None without scatter/gather."""
    if b.c.pp <= 1:
        return None, None
    nbytes = b.sp_tokens * b.c.hidden_size * b.bytes
    if not scatter_gather(b):
        return b.collective("p2p.activation", "send_recv", "p2p", nbytes, False), None
    share = nbytes / b.t
    return (b.collective("p2p.activation", "send_recv", "p2p", share, False),
            b.collective("p2p.gather", "all_gather", "tp", share, False))
