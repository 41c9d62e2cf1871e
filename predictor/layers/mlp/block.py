"""The dense MLP as a layer kind (`predictor.layers.block.Block`): its pre-MLP norm, FC1 (×2 wide with SwiGLU), the
activation and FC2 split over TP — its ops (`predictor.layers.mlp.ops`), parameters, FLOPs, saved activations,
matrices, parameter tensors and offloadable groups. The helpers of an MLP of any width (`mlp_params`,
`mlp_saved_bytes`, `mlp_matrices`) are the MoE block's shared experts and experts too.

Saved activations (Korthikanti et al. 2022): the norm's input, FC1's input and the dropout mask replicated over TP
without SP; split over TP, the activation's input and FC2's input (16h for a 4h GeLU MLP).
"""
from __future__ import annotations

from predictor.ir.ops import OpBuilder, Pair
from predictor.layers.block import Matrix, Saved, Saving, Tensors, local_tokens, norm_params
from predictor.layers.mlp.ops import mlp_block
from tracekit.core.config import TrainingConfig


def mlp_params(c: TrainingConfig, ffn: int, split: int, width: int | None = None) -> int:
    """An MLP of width `ffn` split over `split` ranks (FC1 ×2 with SwiGLU) on inputs of `width` (hidden)."""
    f, h, bias = ffn // split, width or c.hidden_size, c.add_bias_linear
    fc1 = 2 * f if c.swiglu else f
    return h * fc1 + fc1 * bias + f * h + h * bias


def mlp_saved_bytes(c: TrainingConfig, ffn: int, q: float = 1.0) -> float:
    """TP-split bytes per token of an MLP of width `ffn`: the activation's input and FC2's (a GEMM input: × q)."""
    f1 = 2 * ffn if c.swiglu else ffn
    return 2.0 * f1 + 2.0 * ffn * q


def mlp_matrices(c: TrainingConfig, ffn: int, width: int | None = None) -> list[Matrix]:
    """FC1's and FC2's weights of an MLP of width `ffn` on inputs of `width` (hidden), whole."""
    h = width or c.hidden_size
    return [((2 if c.swiglu else 1) * ffn, h), (h, ffn)]


def mlp_flops_per_token(c: TrainingConfig, ffn: int) -> float:
    """Forward FLOPs per token of an MLP of width `ffn` (FC1 ×2 with SwiGLU, FC2)."""
    return 2.0 * c.hidden_size * ffn * (3 if c.swiglu else 2)


def pre_mlp_norm_saved(c: TrainingConfig, saving: Saving) -> float:
    """The pre-MLP norm's input and the hidden-dropout mask (1 byte) an MLP or MoE block keeps per token,
    replicated over TP without SP."""
    norm_in = 0.0 if "mlp_norm" in saving.host else 2.0 * c.hidden_size
    return norm_in + (1.0 * c.hidden_size if c.hidden_dropout > 0 else 0.0)


def pre_mlp_norm_tensors(c: TrainingConfig) -> dict[str, list[float]]:
    """The pre-MLP norm's offloadable input (the local 1/tp of the tokens with SP)."""
    tokens = local_tokens(c)
    local = tokens // c.tp if c.sequence_parallel else tokens
    return {"mlp_norm": [float(local * c.hidden_size)]}


class MLP:
    name = "mlp"

    def ops(self, b: OpBuilder, window: int | None, lowp: bool) -> list[Pair]:
        return mlp_block(b, lowp)

    def params(self, c: TrainingConfig) -> tuple[int, int]:
        return norm_params(c, c.hidden_size) + mlp_params(c, c.ffn_hidden_size, c.tp), 0

    def flops_per_token(self, c: TrainingConfig, layer: int, causal: bool) -> float:
        return mlp_flops_per_token(c, c.ffn_hidden_size)

    def saved(self, c: TrainingConfig, saving: Saving) -> Saved:
        replicated = pre_mlp_norm_saved(c, saving)
        if "mlp" in saving.modules:  # replayed whole: only its input (the norm's) stays
            return Saved(replicated)
        # FC1's input, freed by `layernorm` recompute (replayed from the norm's input)
        return Saved(replicated + 2.0 * c.hidden_size * saving.q * saving.normed,
                     mlp_saved_bytes(c, c.ffn_hidden_size, saving.q))

    def matrices(self, c: TrainingConfig, split_qkv: bool) -> tuple[list[Matrix], list[Matrix]]:
        return mlp_matrices(c, c.ffn_hidden_size), []

    def tensors(self, c: TrainingConfig) -> Tensors:
        return Tensors(linears=2, biased=2, norms=1)

    def offload_tensors(self, c: TrainingConfig) -> dict[str, list[float]]:
        return pre_mlp_norm_tensors(c)


MLP_BLOCK = MLP()
