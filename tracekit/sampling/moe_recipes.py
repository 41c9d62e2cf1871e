"""Timing recipes of an MoE layer's router and token routing (Megatron-core's `topk_routing_with_score_function`,
`permute` and `unpermute` of `megatron/core/transformer/moe/moe_utils.py`, their unfused paths) and of its experts'
grouped GEMM (torch._grouped_mm), written here from what those functions compute. The router's logits are random,
so the tokens spread evenly over the experts, as an auxiliary loss keeps them in training.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .compute import DTYPES, Timer, leaf
from .shapes import Case


def _route(case: Case) -> tuple[int, int, int]:
    return int(case.get("tokens")), int(case.get("experts")), int(case.get("topk"))


def routing(logits: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities, routing map) [tokens, experts] of softmax top-k routing: the top-k logits, their softmax in
    fp32 back in the logits' dtype, scattered into a dense [tokens, experts] tensor beside the boolean map."""
    scores, top = torch.topk(logits, k=topk, dim=1)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).type_as(logits)
    routing_probs = torch.zeros_like(logits).scatter(1, top, probs)
    routing_map = torch.zeros_like(logits).int().scatter(1, top, 1).bool()
    return routing_probs, routing_map


def router_topk(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    tokens, experts, topk = _route(case)
    logits = leaf((tokens, experts), DTYPES[dtype_name], timer.device)
    fwd, bwd = timer.fwd_bwd([logits], lambda: routing(logits, topk)[0])
    return {"fwd": fwd, "bwd": bwd}


def sorted_token_indices(routing_map: torch.Tensor, copies: int) -> torch.Tensor:
    """The token of each routed copy, grouped by expert: the routing map read expert by expert (Megatron's
    argsort-based permute: the same order as masking it)."""
    tokens = routing_map.shape[0]
    flat = routing_map.T.contiguous().reshape(-1).argsort(descending=True, stable=True)[:copies]
    return flat % tokens


def moe_permute(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    """Each token copied once per chosen expert, grouped by expert, with its probability (the indices from the
    routing map, then index_select of the tokens; backward: the copies' gradients added back per token)."""
    tokens, experts, topk = _route(case)
    dtype, dev, hidden = DTYPES[dtype_name], timer.device, int(case.feature("width"))
    probs, routing_map = routing(torch.randn((tokens, experts), device=dev, dtype=dtype), topk)
    x = leaf((tokens, hidden), dtype, dev)
    copies = tokens * topk

    def forward() -> torch.Tensor:
        flat = routing_map.T.contiguous().reshape(-1).argsort(descending=True, stable=True)[:copies]
        probs.T.contiguous().reshape(-1)[flat]  # the permuted probabilities travel with the tokens
        return x.index_select(0, flat % tokens)

    fwd, bwd = timer.fwd_bwd([x], forward)
    return {"fwd": fwd, "bwd": bwd}


def moe_unpermute(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    """The experts' outputs weighted by their probabilities and summed back into each token's row (the probabilities
    masked out of the dense tensor, a product, scatter_add into zeros)."""
    tokens, experts, topk = _route(case)
    dtype, dev, hidden = DTYPES[dtype_name], timer.device, int(case.feature("width"))
    routing_probs, routing_map = routing(torch.randn((tokens, experts), device=dev, dtype=dtype), topk)
    index = sorted_token_indices(routing_map, tokens * topk).unsqueeze(1).expand(-1, hidden)
    y = leaf((tokens * topk, hidden), dtype, dev)
    probs = routing_probs.detach().requires_grad_()
    mask = routing_map.T.contiguous()

    def forward() -> torch.Tensor:
        weighted = y * probs.T.contiguous().masked_select(mask).unsqueeze(-1)
        return torch.zeros((tokens, hidden), device=dev, dtype=dtype).scatter_add(0, index, weighted)

    fwd, bwd = timer.fwd_bwd([y, probs], forward)
    return {"fwd": fwd, "bwd": bwd}


@functools.cache
def grouped_mm():
    """torch's grouped GEMM: F.grouped_mm (torch > 2.10), else torch._grouped_mm; None where torch has neither."""
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def grouped_gemm(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    """The local experts' GEMMs as one grouped GEMM (`batch` groups of `m` tokens each, every expert its own [n, k]
    weight, read transposed as torchtitan's GroupedExperts and Megatron's torch grouped-GEMM backend do)."""
    f, dtype, dev = dict(case.features), DTYPES[dtype_name], timer.device
    groups, m, n, k = int(f["batch"]), int(f["m"]), int(f["n"]), int(f["k"])
    x = leaf((groups * m, k), dtype, dev)
    w = leaf((groups, n, k), dtype, dev, 0.02)
    offs = torch.arange(m, groups * m + 1, m, device=dev, dtype=torch.int32)
    mm = grouped_mm()
    fwd, bwd = timer.fwd_bwd([x, w], lambda: mm(x, w.transpose(-2, -1), offs=offs))
    return {"fwd": fwd, "bwd": bwd}
