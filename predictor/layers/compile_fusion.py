"""What `torch.compile` (TorchInductor) makes of a decoder layer's memory-bound ops, for torchtitan and Composer jobs
that compile (`torch_compile`: torchtitan's `[compile] enable`, Composer's `compile_config`).

torchtitan compiles each transformer block on its own (`apply_compile`: `torch.compile(block, fullgraph=True)`), so
one layer is one Inductor graph forward and one backward. Inductor leaves the matrix multiplies and attention to
extern kernels (cuBLAS `mm`/`addmm`, SDPA's flash/cuDNN kernels; on a CPU `aten::mm` and the CPU flash kernel), and
fuses every chain of pointwise ops and reductions between two of them into one generated kernel: the norm reads `x`
once and writes once; a residual add runs inside the norm that follows it (writing both the sum and the normalised
sum); SwiGLU's silu·mul, RoPE, a dropout/bias/activation chain are one kernel each. The backward is fused likewise.
A residual add's backward is the identity (no kernel; with a dropout mask or a bias gradient it is a kernel), and
the gradient sum it implies runs inside the norm backward at the block's input. The norms' weight gradients (a
reduction over tokens, across the rows the input gradient reduces) are one more kernel per layer, both norms'
together. A compiled block never fuses with its neighbour: the residual add at a layer's end stays a kernel.

On the layer the graph builds (predictor.layers.attention.ops, predictor.layers.mlp.ops) that is: each run of
consecutive memory-bound ops (norm, element-wise, activation, softmax) between two extern kernels (GEMM, attention,
collective, a precision recipe's cast inside its linear) becomes one kernel forward and one backward, each op reading
its predecessor's output from registers; a run that is only a residual add without dropout or bias has no backward
kernel, and one gradient read joins the layer's first run's backward instead. On a Llama layer: forward 5 kernels
(norm · RoPE · add+norm · silu·mul · add), backward 5 (silu·mul · add+norm · RoPE · norm with the residual
gradient · the norms' weight gradients), against the eager graph's 6 and 6. The forward count is the one a block
compiled on a CPU shows (tools/capture_compiled_block.py, tests/test_compile_fusion.py); its backward has up to
two more (the C++ backend's RoPE backward for q and k apart, a layout kernel before the CPU flash backward).

Costs, without fitted constants: a fused kernel moves the bytes of its ops as the eager element-wise rows count them
(predictor.costs.features: read and write the main tensor, 2·numel·dtype bytes forward, 3 backward with the gradient),
less one read of every intermediate a consumer in the same kernel takes from registers; the weight-gradient
kernel reads the output gradient and the input of each norm. Each is timed as the eager element-wise kernel at those
bytes (an `elementwise` row of variant `inductor_fused`, answered by the residual-add model, its `numel` set so the
row moves the kernel's bytes, as predictor.ir.ops `quantize` does) and is one launch. The eager norm, RoPE and
activation rows keep their own models, fitted on Megatron's kernels, several of them far from the memory bandwidth
(an RMSNorm backward at ~100 GB/s on an A100): what compile gains is mostly those ops run at the bandwidth of a
plain element-wise kernel.
"""
from __future__ import annotations

from predictor.ir.ops import OpBuilder, OpUse, Pair, parts
from tracekit.core.config import TrainingConfig

#: Primitives Inductor generates code for (fused); everything else (gemm, bmm, attention, collectives) is extern.
FUSED_PRIMITIVES = ("norm", "elementwise", "activation", "softmax")
#: The variant a fused kernel's row is asked as (answered by the element-wise default model: the residual add's).
VARIANT = "inductor_fused"
#: Bytes per element the eager element-wise rows count (predictor.costs.features): forward read + write, backward +
#: grad.
FWD_TENSORS, BWD_TENSORS = 2.0, 3.0


def compiled(config: TrainingConfig) -> bool:
    """Whether the job compiles its transformer blocks (`torch_compile`)."""
    return config.run is not None and config.run.compiled


def _fusible(b: OpBuilder, op: OpUse | None) -> bool:
    if op is None or op.group is not None or not op.launch:  # a recipe's casts run inside their linear's call
        return False
    return b.specs[op.spec]["primitive"] in FUSED_PRIMITIVES


def _runs(b: OpBuilder, pairs: list[Pair]) -> list[list[Pair] | Pair]:
    """`pairs` with each run of consecutive fusible forward ops gathered into a list (other pairs kept as they are;
    a pair of nothing, a collective of a one-member group, breaks no run)."""
    out: list[list[Pair] | Pair] = []
    current: list[Pair] = []
    for pair in pairs:
        fwd, bwd, _ = pair
        if fwd is None and bwd is None:
            continue
        if _fusible(b, fwd) and all(_fusible(b, p) for p in parts(bwd)):
            current.append(pair)
            continue
        if current:
            out.append(current)
            current = []
        out.append(pair)
    if current:
        out.append(current)
    return out


def _numel(b: OpBuilder, op: OpUse) -> float:
    return float(b.specs[op.spec]["numel"])


def _is_residual(b: OpBuilder, run: list[Pair]) -> bool:
    """A run that is only a residual add whose backward is the identity (no dropout mask, no bias gradient)."""
    c = b.c
    plain = c.hidden_dropout == 0 and not c.add_bias_linear
    return plain and len(run) == 1 and run[0][0] is not None and b.specs[run[0][0].spec]["variant"] == "res_add"


def _kernel(b: OpBuilder, name: str, nbytes: float, width: float) -> OpUse:
    """One generated kernel moving `nbytes`, as an element-wise row of that many bytes (module docstring)."""
    numel = nbytes / (FWD_TENSORS * b.bytes)
    width = max(1.0, min(width, numel))
    return b.compute(name, "elementwise", VARIANT, 0.0, True, rows=numel / width, width=width, numel=numel)[0]


def fuse_layer(b: OpBuilder, pairs: list[Pair]) -> list[Pair]:
    """One compiled decoder layer's `pairs` (attention block + MLP/MoE block): each run of fusible ops one generated
    kernel forward and one backward (none for a lone residual add), plus the norms' weight-gradient kernel."""
    grouped = _runs(b, pairs)
    runs = [g for g in grouped if isinstance(g, list)]
    lone_adds = [r for r in runs if _is_residual(b, r)]
    norms = [op for r in runs for op, _, _ in r if op is not None and b.specs[op.spec]["primitive"] == "norm"]
    out: list[Pair] = []
    if norms:  # run last in the backward: the weight gradients once every input gradient is known
        nbytes = sum(FWD_TENSORS * _numel(b, op) * b.bytes for op in norms)
        out.append((None, _kernel(b, "compiled.norm_weight_grads", nbytes, b.h), "layernorm"))
    first = True
    for item in grouped:
        if not isinstance(item, list):
            out.append(item)
            continue
        ops = [op for op, _, _ in item if op is not None]
        numels = [_numel(b, op) for op in ops]
        # a backward row sized apart from its forward (a gated activation's reads both halves:
        # predictor.layers.mlp.activation)
        bwd_numels = [_numel(b, bw) if isinstance(bw, OpUse) else _numel(b, op)
                      for op, bw, _ in item if op is not None]
        links = sum(numels[:-1]) * b.bytes  # each intermediate read back by the next op: kept in registers
        width = max(float(b.specs[op.spec].get("width") or 1.0) for op in ops)
        name = "compiled." + "+".join(op.name for op in ops)
        fwd = _kernel(b, name, FWD_TENSORS * sum(numels) * b.bytes - links, width)
        bwd: OpUse | None = None
        if not _is_residual(b, item):
            extra = sum(_numel(b, r[0][0]) for r in lone_adds if r[0][0] is not None) if first else 0.0
            bwd = _kernel(b, name, (BWD_TENSORS * sum(bwd_numels) + extra) * b.bytes - links, width)
        first = False
        out.append((fwd, bwd, item[-1][2]))
    return out
