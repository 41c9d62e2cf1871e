"""What PyTorch-native trainers change in a layer's ops beyond Megatron's: torchtitan's per-op selective activation
checkpointing (`[activation_checkpoint] mode = "selective"`, `selective_ac_option = "op"`; Megatron's
`recompute_modules` name it `per_op`).

torchtitan's per-op policy saves the outputs of every other matrix multiply, of attention (SDPA's flash, efficient
and cuDNN kernels) and of reduce-scatters, and recomputes everything else in the backward: the norms, RoPE, the
residual adds, the activation, the remaining matrix multiplies and the sequence-parallel all-gathers. On the layer
Megatron's builder makes (one QKV GEMM, the output projection, FC1, FC2), the GEMMs replayed are the second and the
fourth: the output projection and FC2 — per token 4.5·h² of a Llama layer's ~12.5·h² multiply-adds, beside
torchtitan's 4.75·h² (wk, wo and w3 of its seven separate projections).
"""
from __future__ import annotations

from predictor.ir.ops import OpUse, Pair

#: Compute primitives the per-op policy saves (never replayed), and the collective it saves.
SAVED = ("attention",)
SAVED_COLLECTIVES = ("reduce_scatter",)


def per_op_replay(pairs: list[Pair], specs: list[dict]) -> list[OpUse]:
    """The forward ops of one layer's `pairs` that torchtitan's per-op policy replays before the backward."""
    out: list[OpUse] = []
    gemms = 0
    for op, _, _ in pairs:
        if op is None:
            continue
        primitive = specs[op.spec]["primitive"]
        if op.group is not None:
            if primitive not in SAVED_COLLECTIVES:
                out.append(op)
            continue
        if primitive in ("gemm", "bmm"):
            gemms += 1
            if gemms % 2 == 0:
                out.append(op)
        elif primitive not in SAVED:
            out.append(op)
    return out
