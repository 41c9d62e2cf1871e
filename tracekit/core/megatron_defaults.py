"""Megatron's derived defaults: the one place they are computed (TrainingConfig, the reference trainer's argument
parser and the seed paper's sample reader use these)."""
from __future__ import annotations

#: Megatron-core's vocabulary where none is stated (GPT-2's) and its --make-vocab-size-divisible-by default.
VOCAB_SIZE, VOCAB_MULTIPLE = 50257, 128


def default_ffn_hidden_size(hidden_size: int, swiglu: bool) -> int:
    """Megatron's --ffn-hidden-size when not given: 4h, or with SwiGLU int(8h/3/64)·64 (⅔ of 4h, a multiple of 64)."""
    return int(8 * hidden_size / 3 / 64) * 64 if swiglu else 4 * hidden_size


def default_kv_channels(hidden_size: int, num_attention_heads: int) -> int:
    """Megatron's --kv-channels when not given: the head dimension h / heads (the caller checks divisibility)."""
    return hidden_size // num_attention_heads


def data_parallel_size(world_size: int, tp: int, pp: int, cp: int = 1) -> int:
    """Data-parallel ranks: world / (tp·pp·cp) (the caller checks divisibility)."""
    return world_size // (tp * pp * cp)


def num_microbatches(global_batch_size: int, micro_batch_size: int, dp: int) -> int:
    """Micro-batches per iteration on each pipeline: global batch / (micro batch · dp)."""
    return global_batch_size // (micro_batch_size * dp)


def padded_vocab_size(vocab_size, divisible_by, tp):
    """Megatron's padded vocabulary: `vocab_size` rounded up to a multiple of divisible_by·tp (numbers or numpy
    arrays)."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple
