"""Where Megatron-core's MoE layers make the host wait for the device, and what that costs the schedule.

The CPU runs ahead of the GPU: a layer pass lasts the longer of its kernels and the host time to issue them
(`predictor.schedule.stage_work`). A device synchronisation drains the GPU's queue first; after it the GPU idles until
the host has returned from it and issued the next kernel. Read in Megatron-core's code
(`megatron/core/transformer/moe/`, `megatron/core/fusions/fused_bias_geglu.py`):

- **Token counts on the host**, once per MoE layer forward (and per replay of that forward in a recompute): with
  dropless routing the tokens each local expert receives are known on the device only, and the grouped GEMMs
  need them on the host — Transformer Engine's `GroupedLinear` takes its splits as a Python list, so `TEGroupedMLP`
  calls `tokens_per_expert.tolist()` (a device-to-host copy) after the flex (DeepEP, HybridEP) and all-gather
  dispatchers, and the all-to-all dispatcher copies its split sizes to the host and synchronises
  (`_maybe_dtoh_and_synchronize`) before its all-to-all, which hands the experts counts already on the host.
  Forced load balancing (`moe_router_force_load_balancing`) changes which experts get tokens, not where the counts
  are. No synchronisation where the sizes are fixed: a capacity factor with `moe_pad_expert_input_to_capacity`.
- **The clamped quick-GELU GLU** (GPT-OSS's experts: `activation_func_clamp_value`, `glu_linear_offset`):
  `weighted_bias_quick_geglu_impl` makes a device tensor of the linear offset per call,
  `torch.tensor(linear_offset, device=...)`: a blocking host-to-device copy, which synchronises the stream (PyTorch
  copies a pageable host tensor with `cudaMemcpyAsync` then `cudaStreamSynchronize` unless asked not to block).
  Once per MoE layer forward and once per replay of the `moe_act` recompute; not under Transformer Engine's op fuser
  (its kernels take the offset themselves, `predictor.layers.moe.grouped_mlp` adds no clamp pass there).

A CUDA graph cannot capture a synchronisation: where a graph captures the layer (or the iteration) these do not run
(`predictor.schedule.stage_work` counts only the syncs of ops left to the host). Each one costs the device `SYNC_US`
(the synchronisation seen from the host, `predictor.schedule.framework_costs`) plus one host operator's issue time
(`host_op_us` of the calibration) of idling, and the host `SYNC_US`. No constant is fitted here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from predictor.ir.ops import Pair
    from tracekit.core.moe import MoESettings


def token_count_syncs(moe: MoESettings) -> int:
    """Device synchronisations per MoE layer forward that bring the experts' token counts to the host."""
    fixed = moe.moe_expert_capacity_factor is not None and moe.moe_pad_expert_input_to_capacity
    return 0 if fixed else 1


def mark_first_forward(pairs: list[Pair], syncs: int) -> None:
    """Put `syncs` on the first forward op of `pairs` (in place): the host waits before issuing it."""
    if not syncs:
        return
    for fwd, _, _ in pairs:
        if fwd is not None:
            fwd.syncs += syncs
            return
