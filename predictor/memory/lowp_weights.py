"""Quantised weight copies Transformer Engine keeps under a low-precision recipe, per GEMM weight.

Facts (Transformer Engine's linear modules, `Float8Tensor`, `MXFP8Tensor`, `Float8BlockwiseQTensor`, and Megatron's
TE wrappers, which pass `is_first_microbatch` so the copy is cached):
- bf16 primary weights (no `--fp8-param-gather`): each linear layer quantises its weight at the first micro-batch of
  an iteration into a workspace it keeps as a module attribute (`_fp8_workspaces`), across micro-batches and between
  steps. The forward GEMM reads it row-wise and the input-gradient GEMM column-wise: per-tensor fp8 (delayed or
  current scaling) on Hopper and earlier keeps a second, transposed copy because their fp8 GEMM takes only the TN
  layout; on Blackwell the fp8 GEMM takes every layout and the one copy serves both. Block-scaled recipes keep both
  copies everywhere, each with its scales (fp8 blockwise: one fp32 scale per 128×128 weight block; MXFP8: one E8M0
  byte per 32 elements; NVFP4: an E4M3 byte per 16).
- quantised primary weights (`--fp8-param-gather`, TE's `fp8_model_init`): the parameter itself is the quantised
  tensor (it replaces the 2-byte bf16 weight) and keeps the same copies.
The amax/scale history of delayed scaling (`--fp8-amax-history-len` fp32 values per tensor, 1 by default) is a few
bytes per weight tensor, not per element: not counted. Everything not a linear layer's weight (embeddings, the output
layer, norms, the `--first-last-layers-bf16` layers) stays bf16.
"""
from __future__ import annotations

from tracekit.core.config import TrainingConfig
from tracekit.core.hardware import architecture

#: Bytes per element of one quantised weight copy, scales included, by recipe (weights use 128×128 blocks under
#: fp8 blockwise, unlike activations' 1×128).
COPY_BYTES = {"fp8": 1.0, "fp8-cs": 1.0, "fp8-block": 1.0 + 4 / (128 * 128), "mxfp8": 1.0 + 1 / 32,
              "nvfp4": 0.5 + 1 / 16}
PER_TENSOR = ("fp8", "fp8-cs")
BF16_BYTES = 2.0


def copies(recipe: str, hardware: str | None) -> int:
    """Quantised copies kept per weight: one for per-tensor fp8 on Blackwell, two otherwise (module docstring)."""
    blackwell = bool(hardware) and architecture(str(hardware)) == "blackwell"
    return 1 if (recipe in PER_TENSOR and blackwell) else 2


def extra_weight_bytes(c: TrainingConfig, hardware: str | None) -> float:
    """Bytes per low-precision GEMM weight element on top of the 2-byte bf16 weight the estimate already counts:
    the cached copies, less the bf16 weight itself where the parameter is the quantised tensor. 0 for bf16 runs."""
    name = c.recipe.name
    if name not in COPY_BYTES:
        return 0.0
    kept = copies(name, hardware) * COPY_BYTES[name]
    quantised_params = bool(c.lowp and c.lowp.fp8_param_gather)
    return kept - BF16_BYTES if quantised_params else kept
