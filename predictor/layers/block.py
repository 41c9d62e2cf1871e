"""What every layer kind answers (`Block`), so that the model's parameters, FLOPs, memory, optimizer matrices,
parameter tensors and offloaded activations are each one sum over a layer's blocks (`predictor.layers.decoder`)
instead of a branch per kind in each of those rooms.

A decoder layer is one or more blocks: a GPT layer is an attention block and an MLP or MoE block (Megatron-core's
TransformerLayer: `self_attention` and `mlp`); a hybrid layer is one block of its pattern's symbol. Each block
includes its own norm (the input norm of attention, the pre-MLP norm of an MLP or MoE) and its residual add.

Every answer is per layer and on one GPU unless said otherwise; `Saving` holds what decides the bytes a block keeps
for its backward (the precision recipe, selective recompute, fine-grained activation offloading), which the memory
room computes once per layer (`predictor.memory.stages`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from predictor.ir.ops import OpBuilder, Pair
from tracekit.core.config import TrainingConfig

#: A matrix (rows, cols) of a layer's weights, whole (before tensor parallelism).
Matrix = tuple[int, int]


@dataclass(frozen=True)
class Saving:
    """What decides the activation bytes a block keeps per micro-batch (`Block.saved`)."""

    q: float  # a GEMM input's bytes over bf16's (the recipe's format where it applies to the layer)
    modules: frozenset[str]  # the modules selective recompute replays (Megatron's `recompute_modules`)
    host: frozenset[str]  # the modules whose saved tensors fine-grained activation offloading keeps on the host
    normed: float  # 0 where `layernorm` recompute frees the norms' outputs, else 1
    tokens: int  # the sequence (over CP) × micro-batch


@dataclass(frozen=True)
class Saved:
    """Bytes a block keeps for its backward: per token replicated over TP without sequence parallelism, per token
    split over TP, and bytes beyond both (an MoE block's routed copies, on its experts' ranks)."""

    replicated: float = 0.0
    split: float = 0.0
    extra: float = 0.0


@dataclass(frozen=True)
class Tensors:
    """Parameter tensors of a block as Megatron-core's layers register them: linear layers (each a weight), those
    with a bias where the configuration adds biases, norms (a weight, and a bias with LayerNorm), and tensors of
    neither kind (a Mamba or Gated DeltaNet layer's convolution, gates and fixed-kind norms), counted as they are."""

    linears: int = 0
    biased: int = 0
    norms: int = 0
    other: int = 0


class Block(Protocol):
    """One block of a decoder layer."""

    #: The block's name (what its ops' `block` and the model's tables call its layers).
    name: str

    def ops(self, b: OpBuilder, window: int | None, lowp: bool) -> list[Pair]:
        """The block's operator rows, forward with each backward (`window`: keys per query of a sliding-window
        layer, for blocks that attend; `lowp`: the precision recipe applies to its linear layers)."""
        ...

    def params(self, c: TrainingConfig) -> tuple[int, int]:
        """(dense, expert) parameters of one layer's block on one GPU, its norm included."""
        ...

    def flops_per_token(self, c: TrainingConfig, layer: int, causal: bool) -> float:
        """Forward model FLOPs per token (whole block, every TP rank); `causal` halves a full attention's scores."""
        ...

    def saved(self, c: TrainingConfig, saving: Saving) -> Saved:
        """Activation bytes one layer's block keeps for its backward on one GPU (`Saved`)."""
        ...

    def matrices(self, c: TrainingConfig, split_qkv: bool) -> tuple[list[Matrix], list[Matrix]]:
        """(dense, expert) 2-D weights of one layer's block, whole before TP (the experts': this EP rank's); what
        Muon orthogonalises (`split_qkv`: Q, K and V apart)."""
        ...

    def tensors(self, c: TrainingConfig) -> Tensors:
        """Parameter tensors of one layer's block on one GPU."""
        ...

    def offload_tensors(self, c: TrainingConfig) -> dict[str, list[float]]:
        """Elements of each tensor every offloadable module of the block saves for its backward, per layer and
        micro-batch on one GPU (`predictor.schedule.activation_offload`)."""
        ...


def norm_params(c: TrainingConfig, width: int) -> int:
    """Parameters of a norm over `width` (RMSNorm a weight, LayerNorm a weight and a bias)."""
    return width * (1 if c.normalization == "RMSNorm" else 2)


def local_tokens(c: TrainingConfig) -> int:
    """Tokens of one micro-batch on one GPU before TP: the sequence over CP × micro-batch."""
    return c.seq_length // c.cp * c.micro_batch_size
