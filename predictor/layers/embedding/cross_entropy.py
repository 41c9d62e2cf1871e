"""The bytes Megatron-core's native vocab-parallel cross entropy moves, and the floor they put under its estimate.

Without `cross_entropy_loss_fusion` Megatron-core computes the loss with `_VocabParallelCrossEntropy`
(`megatron/core/tensor_parallel/cross_entropy.py`), a chain of PyTorch kernels over the [tokens, vocab / tp] logits
that works in fp32 after one cast:

- forward: `vocab_parallel_logits.float()` (reads the logits in their dtype, writes fp32), `torch.max` over the vocab
  (reads fp32), the in-place subtraction of the maximum (reads and writes fp32), the in-place `torch.exp` (reads and
  writes), `exp_logits.sum` (reads), and the in-place division by the sum (reads and writes), the softmax it keeps
  for the backward: 4 + 4 + 8 + 8 + 4 + 8 = 36 bytes per logit plus the logits' own element size;
- backward: `grad_input.mul_(grad_output)` (reads and writes fp32: 8 bytes per logit; the update of the targets'
  entries is one element per token), and autograd's cast of that fp32 gradient back to the dtype of the logits the
  function was given (reads 4, writes the logits' element size).

It is Megatron-core's default (Megatron-Bridge's `GPTModelProvider` fuses the loss for every Bridge model). With a
vocabulary that makes the logits gigabytes (201,088 × 16,384 tokens: 3.3 G logits, 13 GB in fp32) these passes cannot
run out of the L2 cache: each goes to HBM. The operator models learned the kernel from the seed paper's samples
(A100 and GH200, a 50,257-entry vocabulary) and answer other GPUs by transfer; where their answer is faster than
these bytes at the datasheet's HBM bandwidth it is raised to them
(`predictor.costs.physics.cross_entropy_floor`); it is never lowered. A fused loss
(`cross_entropy_loss_fusion`: Transformer Engine's kernel, or Megatron's `native` fused one) keeps its estimate: its
rows carry another variant (`variant`).

The seed paper's samples time another implementation of the same loss (its sampler feeds fp16 logits to its own
`vocab_parallel_cross_entropy`, whose source is not in the vendored copy): on A100 they take 0.80-3.8x these
bytes' time forward (median 0.98), 0.69-4.5x backward (median 0.88), so that function moves fewer bytes than
Megatron-core's chain, and the floor binds wherever the transfer carries their rate to a larger vocabulary.
A torchtitan job names no loss and takes the same floor, although PyTorch's `F.cross_entropy` on the fp32 cast
moves about 22 bytes a logit each way (the cast and a three-pass log-softmax; backward, its gradient, the NLL's
dense gradient and the cast back): its forward floor is then about 40% high and its backward's low, well under 1%
of a step at the loss's share.
"""
from __future__ import annotations

#: The native chain's variant (the seed paper's sampled operator) and the fused kernels' one.
NATIVE = "parallel_cross_entropy_128"
FUSED = "fused_cross_entropy"
#: fp32 bytes per logit beyond the input's own element size, forward (cast write, max, subtract, exp, sum, divide)
#: and backward (scaling by the loss gradient in place, the read of the cast back).
FP32_BYTES = {"fwd": 4.0 + 4.0 + 8.0 + 8.0 + 4.0 + 8.0, "bwd": 8.0 + 4.0}


def variant(extra: dict) -> str:
    """The loss's variant for a configuration's settings: fused where `cross_entropy_loss_fusion` is on."""
    return FUSED if extra.get("cross_entropy_loss_fusion") else NATIVE


def bytes_per_logit(pass_: str, element_bytes: float) -> float:
    """Bytes the native chain moves per logit in a pass ('fwd' or 'bwd') for logits of `element_bytes` each."""
    return FP32_BYTES[pass_] + element_bytes
