"""One pipeline stage of a Megatron-style GPT: embedding (first stage), transformer layers, final norm, LM head and
vocab-parallel cross-entropy (last stage). Activations are laid out [sequence, batch, hidden] as in Megatron; with
sequence parallelism the sequence dimension is split across the tp group between the linears."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from .parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    Topology,
    VocabParallelEmbedding,
    copy_to_tp,
    gather_from_sp,
    init_shard,
    reduce_from_tp,
    reduce_scatter_to_sp,
    vocab_parallel_cross_entropy,
)


def _norm(args, topo: Topology, dtype) -> nn.Module:
    kind = nn.RMSNorm if args.normalization == "RMSNorm" else nn.LayerNorm
    norm = kind(args.hidden_size, eps=1e-5, device=topo.device, dtype=dtype)
    for param in norm.parameters():
        # Megatron's mark (not an attribute torch declares): grads summed over tp when activations are split
        setattr(param, "sequence_parallel", args.sequence_parallel)
    return norm


class TransformerLayer(nn.Module):
    """norm → QKV (column-parallel) → causal attention → out-proj (row-parallel) → dropout + residual,
    norm → FC1 (column-parallel) → GeLU/SwiGLU → FC2 (row-parallel) → dropout + residual."""

    def __init__(self, args, topo: Topology, number: int, dtype):
        super().__init__()
        self.number, self.args, self.topo = number, args, topo
        h, tp, sp = args.hidden_size, topo.tp, args.sequence_parallel
        bias, std = args.add_bias_linear, args.init_method_std
        out_std = std / (2.0 * args.num_layers) ** 0.5  # Megatron's scaled init of the output projections
        self.heads = args.num_attention_heads // tp
        self.head_dim = args.kv_channels
        seed = args.seed + 10 * (number + 1)  # per layer, not per rank: every tp/pp split starts from one model
        self.input_norm = _norm(args, topo, dtype)
        self.qkv = ColumnParallelLinear(topo, h, 3 * args.num_attention_heads * self.head_dim, bias, sp, std, dtype,
                                        seed)  # output features ordered [head, q/k/v, head_dim]
        self.proj = RowParallelLinear(topo, args.num_attention_heads * self.head_dim, h, bias, sp, out_std, dtype,
                                      seed + 1)
        self.mlp_norm = _norm(args, topo, dtype)
        fc1_out = 2 * args.ffn_hidden_size if args.swiglu else args.ffn_hidden_size
        self.fc1 = ColumnParallelLinear(topo, h, fc1_out, bias, sp, std, dtype, seed + 2,
                                        parts=2 if args.swiglu else 1)
        self.fc2 = RowParallelLinear(topo, args.ffn_hidden_size, h, bias, sp, out_std, dtype, seed + 3)

    def forward(self, x):
        args = self.args
        with record_function(f"layer_{self.number}/attention"):
            qkv = self.qkv(self.input_norm(x))  # [s, b, 3·heads/tp·d]
            s, b = qkv.shape[0], qkv.shape[1]
            q, k, v = qkv.view(s, b, self.heads, 3, self.head_dim).permute(3, 1, 2, 0, 4).unbind(0)  # [b, n, s, d]
            ctx = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=args.attention_dropout if self.training else 0.0
            )
            ctx = ctx.permute(2, 0, 1, 3).reshape(s, b, self.heads * self.head_dim)
            x = x + F.dropout(self.proj(ctx), p=args.hidden_dropout, training=self.training)
        with record_function(f"layer_{self.number}/mlp"):
            y = self.fc1(self.mlp_norm(x))
            if args.swiglu:
                gate, up = y.chunk(2, dim=-1)
                y = F.silu(gate) * up
            else:
                y = F.gelu(y)
            x = x + F.dropout(self.fc2(y), p=args.hidden_dropout, training=self.training)
        return x


class GPTStage(nn.Module):
    """The layers of one pipeline stage; the first adds the embedding, the last the head and the loss."""

    def __init__(self, args, topo: Topology, dtype):
        super().__init__()
        self.args, self.topo = args, topo
        per_stage = args.num_layers // topo.pp
        first = topo.pp_rank * per_stage
        std = args.init_method_std
        self.layers = nn.ModuleList(TransformerLayer(args, topo, first + i, dtype) for i in range(per_stage))
        self.word_embeddings = self.position_embeddings = self.final_norm = self.output_weight = None
        if topo.first_stage or (topo.last_stage and not args.untie_embeddings_and_output_weights):
            self.word_embeddings = VocabParallelEmbedding(topo, args.padded_vocab_size, args.hidden_size, std, dtype,
                                                          args.seed + 1)
        if topo.first_stage:
            self.position_embeddings = nn.Embedding(args.max_position_embeddings, args.hidden_size,
                                                    device=topo.device, dtype=dtype)
            with torch.no_grad():
                generator = torch.Generator().manual_seed(args.seed + 2)
                self.position_embeddings.weight.copy_(
                    torch.randn(self.position_embeddings.weight.shape, generator=generator) * std)
        if topo.last_stage:
            self.final_norm = _norm(args, topo, dtype)
            if args.untie_embeddings_and_output_weights:
                self.output_weight = init_shard((args.padded_vocab_size, args.hidden_size), 0, topo, std, dtype,
                                                args.seed + 3)

    def shared_embedding(self) -> nn.Parameter | None:
        """The word-embedding weight the first and last stage share (tied, pp > 1), else None."""
        if self.topo.pp > 1 and not self.args.untie_embeddings_and_output_weights and self.word_embeddings is not None:
            return self.word_embeddings.weight
        return None

    def embed(self, tokens):  # tokens [b, s] → [s(/tp), b, h]
        args, group = self.args, self.topo.tp_group
        with record_function("embedding"):
            words = self.word_embeddings(tokens).transpose(0, 1).contiguous()
            positions = self.position_embeddings(torch.arange(tokens.shape[1], device=tokens.device)).unsqueeze(1)
            if args.sequence_parallel:
                words = reduce_scatter_to_sp(words, group)
                chunk = words.shape[0]
                positions = positions[self.topo.tp_rank * chunk:(self.topo.tp_rank + 1) * chunk]
            else:
                words = reduce_from_tp(words, group)
            return F.dropout(words + positions, p=args.hidden_dropout, training=self.training)

    def head_loss(self, x, labels):  # x [s(/tp), b, h], labels [b, s] → mean loss
        args, group = self.args, self.topo.tp_group
        with record_function("output_layer"):
            x = self.final_norm(x)
            x = gather_from_sp(x, group) if args.sequence_parallel else copy_to_tp(x, group)
            weight = self.output_weight if self.output_weight is not None else self.word_embeddings.weight
            logits = F.linear(x, weight)  # [s, b, vocab/tp]
        with record_function("cross_entropy"):
            vocab_start = self.topo.tp_rank * logits.shape[-1]
            losses = vocab_parallel_cross_entropy(logits, labels.transpose(0, 1).contiguous(), vocab_start, group)
            return losses.mean()

    def forward(self, x, tokens=None, labels=None):
        """x: activations from the previous stage (None on the first). Returns activations, or the loss last."""
        if self.topo.first_stage:
            x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head_loss(x, labels) if self.topo.last_stage else x
