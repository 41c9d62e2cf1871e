"""The transformer shapes real models train with, for the operators a layer of one runs beyond the GPT grid of
`tracekit.sampling.shapes` (gated MLPs, grouped-query attention, head dims 64 and 128, RMSNorm, RoPE, mixtures of
experts): published model configurations on a GPU, scaled-down stand-ins of the same structure on a CPU (whose
operators are sampled at the sizes the reference trainer runs on a CPU).

A `Layer` is one configuration on one tensor-parallel rank at one (sequence, micro-batch); its properties are the
per-rank sizes the predictor's operator graph uses (`predictor.layers.attention.ops`, `predictor.layers.mlp.ops`,
`predictor.layers.moe.ops`): query and key/value heads split over TP, the FFN split over TP, an MoE's experts all local
(expert parallelism 1) with the FFN of each expert whole.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Model:
    """A published configuration: hidden size, query heads, key/value heads (query groups), head dim, the FFN's
    hidden size (per expert for an MoE), gated MLP (SwiGLU), experts and top-k (0: dense)."""

    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    glu: bool
    experts: int = 0
    topk: int = 0


#: Dense and MoE configurations from their published configuration files (hidden, heads, query groups, head dim,
#: FFN). GPT-3's are the paper's table; the 1.3B (16 heads of 128) and the 8-expert top-2 MoE are the ones the
#: project's H200 kit trains.
GPU_MODELS = (
    Model("gpt3-350m", 1024, 16, 16, 64, 4096, False),
    Model("gpt-1.3b", 2048, 16, 16, 128, 8192, False),
    Model("gpt3-2.7b", 2560, 32, 32, 80, 10240, False),
    Model("gpt3-6.7b", 4096, 32, 32, 128, 16384, False),
    Model("llama3.2-1b", 2048, 32, 8, 64, 8192, True),
    Model("llama3.2-3b", 3072, 24, 8, 128, 8192, True),
    Model("llama2-7b", 4096, 32, 32, 128, 11008, True),
    Model("llama3-8b", 4096, 32, 8, 128, 14336, True),
    Model("qwen2.5-14b", 5120, 40, 8, 128, 13824, True),
    Model("llama3-70b", 8192, 64, 8, 128, 28672, True),
    Model("kit-moe-8x", 1024, 16, 16, 64, 2816, True, experts=8, topk=2),
    Model("mixtral-8x7b", 4096, 32, 8, 128, 14336, True, experts=8, topk=2),
    Model("mixtral-8x22b", 6144, 48, 8, 128, 16384, True, experts=8, topk=2),
    Model("qwen1.5-moe-a2.7b", 2048, 16, 16, 128, 1408, True, experts=60, topk=4),
    Model("gpt-oss-20b", 2880, 64, 8, 64, 2880, True, experts=32, topk=4),
    Model("olmoe-1b-7b", 2048, 16, 16, 128, 1024, True, experts=64, topk=8),
    Model("qwen3-30b-a3b", 2048, 32, 4, 128, 768, True, experts=128, topk=8),
)
#: The same structures at the sizes a CPU trains (the reference trainer's range: hidden 64-512), head dims 16-64.
CPU_MODELS = (
    Model("gpt-64", 64, 4, 4, 16, 256, False),
    Model("gpt-128", 128, 2, 2, 64, 512, False),
    Model("gpt-256", 256, 8, 8, 32, 1024, False),
    Model("llama-128", 128, 4, 2, 32, 352, True),
    Model("llama-256", 256, 8, 2, 32, 704, True),
    Model("llama-512", 512, 8, 4, 64, 1408, True),
    Model("moe-128", 128, 4, 4, 32, 176, True, experts=4, topk=2),
    Model("moe-256", 256, 4, 2, 64, 128, True, experts=8, topk=2),
)
MODELS = {"cpu": CPU_MODELS, "cuda": GPU_MODELS}
#: Sequence lengths, micro-batches and tensor-parallel sizes the configurations are sampled at.
RUNS = {"cpu": ((32, 64, 128), (1, 2), (1, 2)), "cuda": ((2048, 4096, 8192), (1, 2, 4), (1, 2, 4, 8))}


@dataclass(frozen=True)
class Layer:
    """One `Model` on one of `tp` tensor-parallel ranks, at sequence `seq` and micro-batch `micro_batch`."""

    model: Model
    seq: int
    micro_batch: int
    tp: int

    @property
    def tokens(self) -> int:
        return self.seq * self.micro_batch

    @property
    def heads(self) -> int:
        return self.model.heads // self.tp

    @property
    def kv_heads(self) -> int:
        return self.model.kv_heads // self.tp

    @property
    def ffn(self) -> int:
        """The FFN width on this rank (a dense MLP's split over TP; an expert's whole: expert TP 1)."""
        return self.model.ffn if self.model.experts else self.model.ffn // self.tp

    @property
    def fc1_out(self) -> int:
        return 2 * self.ffn if self.model.glu else self.ffn

    @property
    def copies(self) -> int:
        """Token copies an MoE layer routes (tokens × top-k)."""
        return self.tokens * self.model.topk

    @property
    def per_expert(self) -> int:
        """Token copies each expert computes when the router spreads them evenly."""
        return self.copies // self.model.experts


def layers(device: str, seed: int = 0) -> list[Layer]:
    """Every catalogue configuration at every (sequence, micro-batch, TP) its heads split over, in a fixed shuffled
    order (a budget that runs out leaves a spread of models and sizes). An MoE layer is sampled at TP 1 (its
    experts' GEMMs do not split over TP here)."""
    seqs, micros, tps = RUNS[device]
    out = [Layer(m, s, b, t) for m, s, b, t in itertools.product(MODELS[device], seqs, micros, tps)
           if m.kv_heads % t == 0 and (not m.experts or t == 1)]
    random.Random(seed).shuffle(out)
    return out
