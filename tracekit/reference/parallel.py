"""Megatron's process groups and tensor-parallel building blocks, on plain torch.distributed.

Rank order is Megatron's default (tp fastest, then dp, then pp): rank = tp_rank + tp·(dp_rank + dp·pp_rank).
The autograd functions put the collectives where Megatron puts them: column-parallel linears take their input
through `copy_to_tp` (backward all-reduce) or, with sequence parallelism, `gather_from_sp` (all-gather, backward
reduce-scatter); row-parallel linears end in `reduce_from_tp` (all-reduce) or `reduce_scatter_to_sp`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclass
class Topology:
    """This rank's place in the tp × dp × pp grid and the groups it belongs to."""

    rank: int
    world_size: int
    tp: int
    pp: int
    dp: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    tp_group: object
    dp_group: object
    embedding_group: object | None  # first + last pipeline stage (tied embeddings); None when pp == 1
    device: torch.device

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    def stage_rank(self, pp_rank: int) -> int:
        """Global rank of the rank holding my tp/dp position on pipeline stage `pp_rank`."""
        return self.tp_rank + self.tp * (self.dp_rank + self.dp * pp_rank)


def init_topology(tp: int, pp: int, backend: str, device: torch.device) -> Topology:
    """Initialize torch.distributed (env:// as torchrun sets it) and build Megatron's groups."""
    dist.init_process_group(backend=backend)
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % (tp * pp):
        raise SystemExit(f"world size {world} is not divisible by tensor × pipeline parallel size {tp}×{pp}")
    dp = world // (tp * pp)
    tp_rank, dp_rank, pp_rank = rank % tp, (rank // tp) % dp, rank // (tp * dp)

    def grid(t: int, d: int, p: int) -> int:
        return t + tp * (d + dp * p)

    tp_group = dp_group = embedding_group = None
    # Every rank creates every group, in the same order (torch.distributed requires it).
    for p in range(pp):
        for d in range(dp):
            group = dist.new_group([grid(t, d, p) for t in range(tp)], group_desc="TENSOR_MODEL_PARALLEL_GROUP")
            if (p, d) == (pp_rank, dp_rank):
                tp_group = group
    for p in range(pp):
        for t in range(tp):
            group = dist.new_group([grid(t, d, p) for d in range(dp)], group_desc="DATA_PARALLEL_GROUP")
            if (p, t) == (pp_rank, tp_rank):
                dp_group = group
    if pp > 1:
        for d in range(dp):
            for t in range(tp):
                group = dist.new_group([grid(t, d, 0), grid(t, d, pp - 1)], group_desc="EMBEDDING_GROUP")
                if (d, t) == (dp_rank, tp_rank):
                    embedding_group = group
    return Topology(rank, world, tp, pp, dp, tp_rank, pp_rank, dp_rank, tp_group, dp_group, embedding_group, device)


# -- collectives as autograd functions ----------------------------------------------------------------------------
def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    if dist.get_world_size(group) == 1:
        return x
    x = x.contiguous()
    dist.all_reduce(x, group=group)
    return x


def _all_gather_seq(x: torch.Tensor, group) -> torch.Tensor:
    size = dist.get_world_size(group)
    if size == 1:
        return x
    out = torch.empty((x.shape[0] * size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_single(out, x.contiguous(), group=group)
    return out


def _reduce_scatter_seq(x: torch.Tensor, group) -> torch.Tensor:
    size = dist.get_world_size(group)
    if size == 1:
        return x
    out = torch.empty((x.shape[0] // size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_single(out, x.contiguous(), group=group)
    return out


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_seq(grad, ctx.group), None


class _ReduceScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_seq(grad, ctx.group), None


def copy_to_tp(x, group):
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x, group):
    return _ReduceFromTP.apply(x, group)


def gather_from_sp(x, group):
    return _GatherFromSP.apply(x, group)


def reduce_scatter_to_sp(x, group):
    return _ReduceScatterToSP.apply(x, group)


# -- parallel layers ------------------------------------------------------------------------------------------------
def init_shard(full_shape: tuple[int, int], dim: int, topo: Topology, std: float, dtype, seed: int,
               parts: int = 1) -> nn.Parameter:
    """This rank's slice of a full N(0, std) weight drawn from `seed` (as Megatron's CPU initialization does), so a
    model starts identical whatever its tp/pp split. The full weight is cut into `parts` blocks along `dim` (e.g. the
    gate and up halves of a SwiGLU FC1) and each block is split across the tp ranks."""
    full = torch.randn(full_shape, generator=torch.Generator().manual_seed(seed)) * std
    blocks = [block.chunk(topo.tp, dim)[topo.tp_rank] for block in full.chunk(parts, dim)]
    return nn.Parameter(torch.cat(blocks, dim).to(device=topo.device, dtype=dtype).contiguous())


class ColumnParallelLinear(nn.Module):
    """Y = X·Wᵀ with W split by output rows across the tp group; the input enters through copy/all-gather."""

    def __init__(self, topo: Topology, in_features: int, out_features: int, bias: bool, sequence_parallel: bool,
                 std: float, dtype, seed: int, parts: int = 1):
        super().__init__()
        self.topo, self.sp = topo, sequence_parallel
        self.weight = init_shard((out_features, in_features), 0, topo, std, dtype, seed, parts)
        self.bias = (nn.Parameter(torch.zeros(out_features // topo.tp, dtype=dtype, device=topo.device)) if bias
                     else None)

    def forward(self, x):
        x = gather_from_sp(x, self.topo.tp_group) if self.sp else copy_to_tp(x, self.topo.tp_group)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Y = X·Wᵀ with W split by input columns; partial sums are all-reduced (or reduce-scattered with SP)."""

    def __init__(self, topo: Topology, in_features: int, out_features: int, bias: bool, sequence_parallel: bool,
                 std: float, dtype, seed: int):
        super().__init__()
        self.topo, self.sp = topo, sequence_parallel
        self.weight = init_shard((out_features, in_features), 1, topo, std, dtype, seed)
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=topo.device)) if bias else None
        if self.bias is not None:
            # Megatron's mark on a parameter whose gradient is summed over tp (not an attribute torch declares)
            setattr(self.bias, "sequence_parallel", sequence_parallel)

    def forward(self, x):
        y = F.linear(x, self.weight)
        y = reduce_scatter_to_sp(y, self.topo.tp_group) if self.sp else reduce_from_tp(y, self.topo.tp_group)
        return y + self.bias if self.bias is not None else y


class VocabParallelEmbedding(nn.Module):
    """Word embedding with the vocabulary split across tp; lookups outside my slice are zero, then summed."""

    def __init__(self, topo: Topology, vocab: int, hidden: int, std: float, dtype, seed: int):
        super().__init__()
        self.topo = topo
        per_rank = vocab // topo.tp
        self.start, self.end = topo.tp_rank * per_rank, (topo.tp_rank + 1) * per_rank
        self.weight = init_shard((vocab, hidden), 0, topo, std, dtype, seed)

    def forward(self, tokens):  # tokens [b, s] → partial embeddings [b, s, h] (summed by the caller)
        outside = (tokens < self.start) | (tokens >= self.end)
        local = (tokens - self.start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight)
        return out.masked_fill(outside.unsqueeze(-1), 0.0)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split by vocabulary: three tp all-reduces (max, target logit, sum of exp)."""

    @staticmethod
    def forward(ctx, logits, target, vocab_start, group):
        logits = logits.float()
        logits_max = logits.max(dim=-1)[0]
        if dist.get_world_size(group) > 1:
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        logits = logits - logits_max.unsqueeze(-1)
        vocab_end = vocab_start + logits.shape[-1]
        outside = (target < vocab_start) | (target >= vocab_end)
        local = (target - vocab_start).masked_fill(outside, 0)
        predicted = logits.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        predicted = _all_reduce(predicted, group)
        exp = logits.exp()
        sum_exp = _all_reduce(exp.sum(dim=-1), group)
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local, outside)
        return sum_exp.log() - predicted

    @staticmethod
    def backward(ctx, grad):
        softmax, local, outside = ctx.saved_tensors
        grad_input = softmax
        rows = grad_input.view(-1, grad_input.shape[-1])
        hit = (~outside).view(-1).to(grad_input.dtype)
        rows[torch.arange(rows.shape[0], device=rows.device), local.view(-1)] -= hit
        return grad_input * grad.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(logits, target, vocab_start: int, group):
    return _VocabParallelCrossEntropy.apply(logits, target, vocab_start, group)
