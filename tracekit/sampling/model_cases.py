"""The operator cases a layer of a real model runs beyond the GPT grid's (tracekit.sampling.shapes), at the shapes of
the catalogue's configurations (tracekit.sampling.catalog), each under the primitive, variant and features the
predictor's operator graph asks for (predictor.layers.attention.ops, mlp_ops, glu_activation, norm_rope_ops, moe_ops),
so that what is sampled is what a prediction looks up:

- activations: Megatron's SwiGLU fused (`swiglu`: its `bias_swiglu` kernels, compiled) and unfused
  (`swiglu_unfused`: `--no-bias-swiglu-fusion`, chunk → SiLU → multiply), torch's GLU kernel (`glu`), all three
  sized as the predictor sizes a gated unit (tracekit.core.samples.GLU_ROW_SCALE), and the squared ReLU
  (`squared_relu`, Megatron's `--squared-relu`);
- norms: RMSNorm as torch's fused kernel (`rmsnorm_fused`, F.rms_norm) and as the unfused chain (`RMSlayernorm`);
- RoPE: the unfused chain on a query and a key tensor (`RoPE`) and Transformer Engine's fused kernel on one tensor
  (`rope_fused`, sized as the predictor sizes it: predictor.layers.norm_rope);
- the unfused attention chain: scores (`bmm`/`baddbmm`), then Megatron's FusedScaleMaskSoftmax without its fused
  kernel in the input dtype: the causal mask filled in place into the scores' view (`softmax`/`fillmask`) and
  softmax (`softmax`/`softmax`), the seed paper's two operators; dropout on the scores (`elementwise`/`dropout`),
  context (`bmm`/`bmm`); fused attention (SDPA) with the models' query groups and head dims;
- MoE: router GEMM (`gemm`/`router`), top-k (`elementwise`/`router_topk`), permute and unpermute
  (`moe_permute`, `moe_unpermute`), the experts' GEMMs one expert at a time (`expert_fc1`, `expert_fc2`: Megatron's
  SequentialMLP) and grouped (`grouped_fc1`, `grouped_fc2`: torch._grouped_mm, `batch` = experts);
- the dense linears of the catalogue (`linear1`–`linear4`: grouped-query QKV, gated FC1) in the run's dtype and as
  fp8 GEMMs (torch._scaled_mm: tensorwise `fp8`, rowwise `fp8_row`, blockwise 1×128 / 128×128 `fp8_block`).

Each case names its timing recipe (`extra["recipe"]`, tracekit.sampling.recipes); cases without one are GEMMs and
attention timed by tracekit.sampling.compute as the grid's are.
"""
from __future__ import annotations

from dataclasses import replace

from tracekit.core.samples import GLU_ROW_SCALE

from .catalog import Layer, layers
from .shapes import Case, _case

#: The predictor's variants for TE's fused kernels (predictor.layers.norm_rope.FUSED_RMSNORM, FUSED_ROPE).
FUSED_RMSNORM, FUSED_ROPE = "rmsnorm_fused", "rope_fused"
#: A fused RoPE kernel over n elements moves 2 n (read, write); the element-wise row that answers it moves 3 per
#: `numel`, so its `numel` is 2/3 of the tensor's (predictor.layers.norm_rope).
ROPE_NUMEL = 2.0 / 3.0
#: The unfused attention chain materialises [batch, heads, seq, seq] scores (and their mask, softmax, dropout mask and
#: gradients): sampled up to this many score elements per tensor (CUDA: 2 GiB of bf16 each).
SCORES_MAX = {"cpu": 2 ** 21, "cuda": 2 ** 30}
#: fp8 GEMM recipes: (scaling, stored dtype, the divisor every GEMM dimension must have on a GPU). torch._scaled_mm
#: wants dimensions in multiples of 16; blockwise scales 128-element blocks, and cuBLAS wants the number of blocks
#: along the contraction a multiple of 4 (every dimension is a contraction in one of the forward, dgrad and wgrad
#: GEMMs). A CPU has no blockwise kernel: its blockwise cases (dimensions in multiples of 128) are built to be named
#: as skipped.
FP8 = (("tensorwise", "fp8", 16), ("rowwise", "fp8_row", 16), ("blockwise", "fp8_block", 512))
FP8_CPU_BLOCK = 128
GLU_ACTIVATIONS = ("swiglu", "swiglu_unfused", "glu")
#: Rows per group of a grouped GEMM are a multiple of this (torchtitan pads each expert's tokens so for the grouped
#: GEMM kernels' alignment): the tokens an expert gets, rounded down.
GROUP_ALIGN = 16


def model_cases(device: str, primitives: set[str]) -> list[Case]:
    """Every case of every catalogue layer of `device` among `primitives`, without repeats, in the catalogue's
    spread order."""
    out: dict[Case, None] = {}
    for layer in layers(device):
        for case in layer_cases(layer, device, primitives):
            out.setdefault(case, None)
    return list(out)


def layer_cases(layer: Layer, device: str, primitives: set[str]) -> list[Case]:
    m = layer.model
    h, d, s, b = m.hidden, m.head_dim, layer.seq, layer.micro_batch
    tokens, heads, kv = layer.tokens, layer.heads, layer.kv_heads
    cases: list[Case] = []
    scores = b * heads * s * s
    small_scores = scores <= SCORES_MAX[device]
    if "activation" in primitives:
        rows = layer.copies if m.experts else tokens
        if m.glu:
            cases += [_glu(variant, rows, layer.ffn) for variant in GLU_ACTIVATIONS]
        else:
            cases.append(_case("activation", "squared_relu", {"recipe": "squared_relu"}, rows=rows,
                               width=layer.ffn, numel=rows * layer.ffn))
    if "norm" in primitives:
        cases.append(_case("norm", "layernorm", rows=tokens, width=h, numel=tokens * h))
        for variant, recipe in ((FUSED_RMSNORM, "rmsnorm_fused"), ("RMSlayernorm", "rmsnorm_unfused")):
            cases.append(_case("norm", variant, {"recipe": recipe}, rows=tokens, width=h, numel=tokens * h))
    if "elementwise" in primitives:
        cases.append(_case("elementwise", "res_add", rows=tokens, width=h, numel=tokens * h))
        mean = (heads + kv) / 2  # the chain runs on q (heads) and k (kv heads): the predictor's mean
        cases.append(_case("elementwise", "RoPE", {"recipe": "rope", "q_heads": heads, "k_heads": kv, "seq": s,
                                                   "micro_batch": b}, rows=tokens * mean, width=d, heads=mean,
                           head_dim=d, numel=tokens * mean * d))
        for n in sorted({heads, kv}):  # one kernel per tensor: the query's, the key's
            numel = tokens * n * d * ROPE_NUMEL
            cases.append(_case("elementwise", FUSED_ROPE, {"recipe": "rope_fused", "heads": n, "seq": s,
                                                           "micro_batch": b}, rows=numel / d, width=d, numel=numel))
        if small_scores:
            cases.append(_case("elementwise", "dropout", {"recipe": "dropout"}, rows=b * heads * s, width=s,
                               numel=scores))
    if "bmm" in primitives and small_scores:
        cases.append(_case("bmm", "baddbmm", {"recipe": "baddbmm"}, batch=b * heads, m=s, n=s, k=d))
        cases.append(_case("bmm", "bmm", {"recipe": "bmm"}, batch=b * heads, m=s, n=d, k=s))
    if "softmax" in primitives and small_scores:  # the features of predictor.layers.local_kernels' rows
        scores_of = dict(batch=b, heads=heads, seq=s, rows=b * heads * s, width=s, numel=scores, causal=0)
        cases.append(_case("softmax", "fillmask", {"recipe": "fillmask"}, head_dim=d, **scores_of))
        cases.append(_case("softmax", "softmax", {"recipe": "softmax"}, **scores_of))
    if "attention" in primitives:
        cases.append(_case("attention", "flash_atten", batch=b, heads=heads, kv_heads=kv, seq=s, seq_kv=s,
                           head_dim=d, causal=1))
    if m.experts:
        cases += _moe_cases(layer, primitives)
    elif "gemm" in primitives:
        for variant, n, k in _linears(layer):
            cases.append(_case("gemm", variant, m=tokens, n=n, k=k, batch=1))
        for variant, n, k in _linears(layer):
            for scaling, dtype, multiple in FP8:
                multiple = FP8_CPU_BLOCK if device == "cpu" and scaling == "blockwise" else multiple
                if all(x % multiple == 0 for x in (tokens, n, k)):
                    case = _case("gemm", variant, {"recipe": f"fp8_{scaling}"}, m=tokens, n=n, k=k, batch=1)
                    cases.append(replace(case, dtype=dtype))
    return cases


def _linears(layer: Layer) -> list[tuple[str, int, int]]:
    """(variant, n, k) of a dense layer's four linears on its TP rank (predictor.layers.attention.ops, mlp_ops)."""
    m = layer.model
    q = layer.heads * m.head_dim
    return [("linear1", q + 2 * layer.kv_heads * m.head_dim, m.hidden), ("linear2", m.hidden, q),
            ("linear3", layer.fc1_out, m.hidden), ("linear4", m.hidden, layer.ffn)]


def _glu(variant: str, rows: int, width: int) -> Case:
    """A gated unit over [rows, 2·width] → [rows, width], stored with the rows of the GELU that moves its bytes, per
    pass (tracekit.core.samples.GLU_ROW_SCALE); `extra["rows"]` is the real output's."""
    passes = tuple((p, (("numel", rows * scale * width), ("rows", rows * scale)))
                   for p, scale in sorted(GLU_ROW_SCALE.items()))
    case = _case("activation", variant, {"recipe": variant, "rows": rows}, rows=rows * GLU_ROW_SCALE["fwd"],
                 width=width, numel=rows * GLU_ROW_SCALE["fwd"] * width)
    return replace(case, passes=passes)


def _moe_cases(layer: Layer, primitives: set[str]) -> list[Case]:
    """An MoE layer's router, token routing and experts (predictor.layers.moe.ops), every expert local."""
    m = layer.model
    h, tokens, experts, copies, per = m.hidden, layer.tokens, m.experts, layer.copies, layer.per_expert
    cases = []
    route = {"topk": m.topk, "experts": experts, "tokens": tokens}
    if "gemm" in primitives:
        cases.append(_case("gemm", "router", m=tokens, n=experts, k=h, batch=1))
        aligned = max(GROUP_ALIGN, per - per % GROUP_ALIGN)
        for variant, n, k in (("fc1", layer.fc1_out, h), ("fc2", h, layer.ffn)):
            cases.append(_case("gemm", f"expert_{variant}", m=per, n=n, k=k, batch=1))
            cases.append(_case("gemm", f"grouped_{variant}", {"recipe": "grouped_gemm"}, m=aligned, n=n, k=k,
                               batch=experts))
    if "elementwise" in primitives:
        cases.append(_case("elementwise", "router_topk", {"recipe": "router_topk", **route}, rows=tokens,
                           width=experts, numel=tokens * experts))
        for variant in ("moe_permute", "moe_unpermute"):
            cases.append(_case("elementwise", variant, {"recipe": variant, **route}, rows=copies, width=h,
                               numel=copies * h))
    return cases
