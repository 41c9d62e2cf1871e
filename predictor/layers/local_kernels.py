"""The operators that depend on Megatron-core's layer implementation and its fusion flags (which kernels run:
`tracekit.core.layer_impl`), as `Pair`s (predictor.ir.ops) for the attention, MLP and MoE blocks and as once-per-
iteration ops beside the optimizer step.

- **Unfused core attention** (`core_attention`): the local implementation's `DotProductAttention`, and Megatron's
  unfused path elsewhere (Megatron-DeepSpeed, Megatron-LM 2021, `--attention-backend unfused`): [local, GQA: the keys
  and values repeated to every query head] → baddbmm (`bmm`) → the fused masked softmax
  (`ScaledUpperTriangMaskedSoftmax`) where Megatron runs it, else PyTorch's chain: [local: the causal mask built,
  three kernels over [s, s]] → [fp32 cast] → [× 1/layer with `apply_query_key_layer_scaling`] → masked_fill
  (`fillmask`) → softmax (`softmax`) → [cast back] → dropout on the probabilities (attention dropout > 0) → bmm →
  [local: the context permuted to [s, b, h], a copy]. The softmax and fillmask rows are the seed paper's operators
  of those names (`aten::_softmax`, `aten::masked_fill_` and their backward), in fp32 where the softmax runs in
  fp32.
- **The local linear layers' bias** (`linear_bias`): `ColumnParallelLinear` adds the QKV projection's bias with a
  kernel of its own and sums its gradient over the tokens with another (Transformer Engine does both in the GEMM);
  the other linear layers hand their bias on (to the activation, to the bias-dropout-add).
- **The MLP activation without `bias_activation_fusion`** (`mlp_activation`): the bias added by a kernel of its own,
  then GeLU, or SwiGLU as PyTorch runs `silu(x_glu) * (x_linear + offset)`: silu, an add, a multiply forward; the
  multiply's two gradients, silu's gradient and the concatenation of the halves' gradients backward. With the fusion
  (`torch.compile`d `bias_gelu` / `bias_swiglu`): the one kernel of `predictor.layers.mlp.activation`.
- **The optimizer without apex or Transformer Engine** (`optimizer_ops`, `optimizer_loops`): Megatron falls back to
  `torch.optim.AdamW`, whose foreach implementation makes eight passes over the fp32 state (decoupled weight decay,
  lerp, mul, addcmul, sqrt, div, add, addcdiv: 80 bytes per parameter) where a fused Adam reads the parameter,
  gradient and moments once and writes them back (28): the fused step's model answers the updates and the other 52
  bytes are a streaming row of their own; without the multi-tensor kernels the copy of the fp32 parameters into the
  model's (`local_multi_tensor_scale`, non-distributed optimizer) is two kernels per tensor (8 more bytes per
  parameter), and the gradient norm of `clip_grad` one norm and one read on the host per tensor
  (`local_multi_tensor_l2_norm` builds a tensor from the per-tensor norms).

Memory-bound kernels without a model of their own are the same kind as the element-wise kernel the samples hold
(`res_add`: two reads and a write per `numel`) or the activation's (`gelu`: a read and a write forward, two reads and
a write backward): each is asked of that model at the `numel` that moves the same bytes (`streaming`), the variant
naming the kernel (`predictor.costs.learned.model_keys.ALIASES` routes it), and never faster than those bytes at the
GPU's HBM bandwidth (`predictor.costs.physics.hbm_floor`). Element moves count in elements of the training dtype (a
1-byte dropout mask is half a move, an fp32 element two).
"""
from __future__ import annotations

from predictor.ir.ops import Backward, OpBuilder, OpUse, Pair
from predictor.layers.mlp.activation import activation
from tracekit.core.layer_impl import Kernels, kernels

#: Element moves of one `numel` of the element-wise kernel whose model answers streaming rows (a + b: two reads, a
#: write; predictor.layers.norm_rope), forward and backward alike.
RES_ADD_MOVES = 3.0
#: Variants of the streaming rows this module makes, and PyTorch DDP's bucket copies and autocast's weight casts
#: (predictor.parallel.fsdp)
#: (`predictor.costs.learned.model_keys.ALIASES`: res_add; `hbm_floor`: floored).
STREAMING = ("dropout", "repeat_kv", "context_copy", "causal_mask", "softmax_cast", "softmax_scale", "bias_add",
             "glu_add", "glu_mul", "glu_cat", "foreach_adam", "param_copy", "ddp_bucket_copy",
             "autocast_cast")
#: Element moves per element of PyTorch's dropout kernel, each way: it reads and writes the tensor and writes (reads,
#: backward) a 1-byte mask, 2.5 moves, and draws a random number per element; asked as the element-wise add (3 moves)
#: over its elements, as tracekit has costed the unfused attention's dropout since the seed paper's samples (no
#: sample of a dropout kernel of its own; sized at 2.5 moves, the dense GPT sets move: vTrain multi-node 9.91% →
#: 10.36% MAPE).
DROPOUT_MOVES = 3.0
#: Bytes per parameter of torch AdamW's foreach step (fp32 state and gradients) and of a fused Adam's.
FOREACH_ADAM_BYTES = 80.0
FUSED_ADAM_BYTES = 28.0
#: Bytes per parameter `local_multi_tensor_scale` adds to the fp32 → model parameter copy (`src * 1.0`, then copy).
PARAM_COPY_EXTRA_BYTES = 8.0


def streaming(b: OpBuilder, name: str, variant: str, fwd_moves: float, bwd_moves: float, width: float, module: str,
              launch: bool = True, per_layer: bool = True) -> list[Pair]:
    """A memory-bound kernel moving `fwd_moves` elements forward and `bwd_moves` backward (0: no kernel that way),
    asked of the element-wise kernel's model at the numel that moves as much (module docstring)."""
    out: list[Pair] = []
    if fwd_moves > 0:
        fwd, _ = b.elementwise(name, variant, fwd_moves / RES_ADD_MOVES, width, per_layer)
        fwd.launch = launch
        out.append((fwd, None, module))
    if bwd_moves > 0:
        _, bwd = b.elementwise(f"{name}.grad", variant, bwd_moves / RES_ADD_MOVES, width, per_layer)
        for op in _parts(bwd):
            op.launch = launch
        out.append((None, bwd, module))
    return out


def _parts(op: Backward) -> tuple[OpUse, ...]:
    return op if isinstance(op, tuple) else (op,)


def _inside(pair: tuple[OpUse, Backward]) -> tuple[OpUse, Backward]:
    """A core attention's later kernels, issued by the same module call as its first (DotProductAttention's forward,
    its gradients in one autograd pass): one host operator for the whole core attention, as for flash attention's
    one kernel."""
    fwd, bwd = pair
    for op in (fwd, *_parts(bwd)):
        op.launch = False
    return fwd, bwd


def _quiet(pairs: list[Pair]) -> list[Pair]:
    for fwd, bwd, _ in pairs:
        for op in (fwd, *(_parts(bwd) if bwd is not None else ())):
            if op is not None:
                op.launch = False
    return pairs


def core_attention(b: OpBuilder, a_t: int, kv_t: int, s: int, seq_kv: int, qk_dim: float, v_dim: float,
                   causal: int) -> list[Pair]:
    """The unfused core attention of one layer on `a_t` query and `kv_t` key/value heads, `s` queries over `seq_kv`
    keys (module docstring)."""
    c, k, mb = b.c, kernels(b.c), b.b
    name = "self_attention.core_attention"
    numel = float(mb * a_t * s * seq_kv)
    half = 4.0 * mb * a_t * s * seq_kv * (qk_dim + v_dim) / 2 / 2  # one of the two batched GEMMs' FLOPs
    pairs: list[Pair] = []
    if k.local and a_t > kv_t:  # repeat_interleave of the keys and values: read the groups, write every head
        moves = float(mb * s * (kv_t + a_t))
        pairs.extend(streaming(b, f"{name}.repeat_key", "repeat_kv", moves * qk_dim, moves * qk_dim, qk_dim,
                               "core_attn"))
        pairs.extend(streaming(b, f"{name}.repeat_value", "repeat_kv", moves * v_dim, moves * v_dim, v_dim,
                               "core_attn"))
    scores = b.compute(f"{name}.baddbmm", "bmm", "baddbmm", half, True, batch=mb * a_t, m=s, n=seq_kv, k=qk_dim)
    pairs.append((*(scores if not pairs else _inside(scores)), "core_attn"))
    rest: list[Pair] = []
    if k.softmax == "fused":
        softmax = b.compute(f"{name}.scale_mask_softmax", "softmax", "ScaledUpperTriangMaskedSoftmax", 0.0, True,
                            batch=mb, heads=a_t, seq=s, rows=mb * a_t * s, width=seq_kv, numel=numel, causal=causal)
        rest.append((*softmax, "core_attn"))
    else:
        rest.extend(_torch_softmax(b, k, a_t, s, seq_kv, qk_dim, numel))
    if c.attention_dropout > 0:  # native dropout on the probabilities (DROPOUT_MOVES)
        rest.extend(streaming(b, f"{name}.dropout", "dropout", DROPOUT_MOVES * numel, DROPOUT_MOVES * numel, seq_kv,
                              "core_attn"))
    context = b.compute(f"{name}.bmm", "bmm", "bmm", half, True, batch=mb * a_t, m=s, n=v_dim, k=seq_kv)
    rest.append((*context, "core_attn"))
    if k.local:  # context.permute(2, 0, 1, 3).contiguous(), and the copy of its gradient back
        moves = 2.0 * mb * a_t * s * v_dim
        rest.extend(streaming(b, f"{name}.context_copy", "context_copy", moves, moves, v_dim, "core_attn"))
    return pairs + _quiet(rest)


def _torch_softmax(b: OpBuilder, k: Kernels, a_t: int, s: int, seq_kv: int, qk_dim: float, numel: float
                   ) -> list[Pair]:
    """`FusedScaleMaskSoftmax.forward_torch_softmax` on [mb, a_t, s, seq_kv] scores."""
    name = "self_attention.core_attention.softmax"
    mb = b.b
    out: list[Pair] = []
    if k.local:  # get_default_causal_mask: torch.ones (fp32), triu, .bool() over [s, s], every call
        square = float(s * seq_kv)
        for part, moves in (("ones", 2.0), ("triu", 4.0), ("bool", 2.5)):
            out.extend(streaming(b, f"{name}.causal_mask.{part}", "causal_mask", moves * square, 0.0, seq_kv,
                                 "core_attn"))
    dtype = "fp32" if k.softmax_fp32 else None
    if k.softmax_fp32:  # input.float(): read 2 bytes, write 4; its gradient cast back
        out.extend(streaming(b, f"{name}.to_fp32", "softmax_cast", 3.0 * numel, 3.0 * numel, seq_kv, "core_attn"))
    if k.softmax_scale:  # input * (1 / layer number) in fp32, and the gradient scaled
        out.extend(streaming(b, f"{name}.scale", "softmax_scale", 4.0 * numel, 4.0 * numel, seq_kv, "core_attn"))
    rows = mb * a_t * s
    fill = b.compute(f"{name}.masked_fill", "softmax", "fillmask", 0.0, True, dtype=dtype, batch=mb, heads=a_t,
                     seq=s, rows=rows, width=seq_kv, numel=numel, causal=0, head_dim=qk_dim)
    out.append((*fill, "core_attn"))
    soft = b.compute(f"{name}.softmax", "softmax", "softmax", 0.0, True, dtype=dtype, batch=mb, heads=a_t, seq=s,
                     rows=rows, width=seq_kv, numel=numel, causal=0)
    out.append((*soft, "core_attn"))
    if k.softmax_fp32:  # probs.bfloat16() / .half(), and the gradient cast to fp32
        out.extend(streaming(b, f"{name}.from_fp32", "softmax_cast", 3.0 * numel, 3.0 * numel, seq_kv,
                             "core_attn"))
    return out


def linear_bias(b: OpBuilder, name: str, rows: float, n: float, module: str, bias: bool | None = None) -> list[Pair]:
    """The local ColumnParallelLinear's own bias add over its [rows, n] output and the reduction of its gradient
    (none with Transformer Engine's layers or without a bias: `bias`, None where the configuration adds biases);
    both run inside the linear layer's call."""
    if not (b.c.add_bias_linear if bias is None else bias) or not kernels(b.c).local:
        return []
    return streaming(b, f"{name}.bias", "bias_add", 2.0 * rows * n, rows * n, n, module, launch=False)


def mlp_activation(b: OpBuilder, name: str, rows: float, width: float, module: str) -> list[Pair]:
    """The activation of an MLP over an FC1 output of [rows, width] per gate (module docstring)."""
    c = b.c
    if kernels(c).bias_activation_fusion:
        return [activation(b, name, rows, width, module)]
    out: list[Pair] = []
    fc1_out = 2 * width if c.swiglu else width
    if c.add_bias_linear:  # intermediate + bias: read, write
        out.extend(streaming(b, f"{name}.bias", "bias_add", 2.0 * rows * fc1_out, 0.0, fc1_out, module))
    if not c.swiglu:
        out.append(activation(b, name, rows, width, module))
        return out
    numel = rows * width
    fwd, bwd = b.compute(f"{name}.silu", "activation", "silu", 0.0, True, rows=rows, width=width, numel=numel)
    out.append((fwd, bwd, module))  # silu reads and writes like GELU (predictor.layers.mlp.activation's GELU_MOVES)
    out.extend(streaming(b, f"{name}.linear_offset", "glu_add", 2.0 * numel, 0.0, width, module))
    out.extend(streaming(b, f"{name}.mul", "glu_mul", 3.0 * numel, 3.0 * numel, width, module))
    out.extend(streaming(b, f"{name}.mul_other", "glu_mul", 0.0, 3.0 * numel, width, module))
    out.extend(streaming(b, f"{name}.chunk", "glu_cat", 0.0, 4.0 * numel, fc1_out, module))
    return out


def optimizer_ops(b: OpBuilder, params: float) -> list[OpUse]:
    """What an optimizer step over `params` parameters (one GPU's share) adds to the fused step's model once per
    iteration without apex or Transformer Engine (module docstring); none with them."""
    c = b.c
    if kernels(c).multi_tensor or params <= 0:
        return []
    per_param = FOREACH_ADAM_BYTES - FUSED_ADAM_BYTES
    if not c.use_distributed_optimizer and c.precision != "fp32":
        per_param += PARAM_COPY_EXTRA_BYTES
    moves = params * per_param / b.bytes
    pairs = streaming(b, "optimizer.foreach_adam", "foreach_adam", moves, 0.0, b.h, "optimizer", per_layer=False)
    return [op for op, _, _ in pairs if op is not None]


def optimizer_loops(c, tensors: int) -> tuple[float, float]:
    """(host steps, reads on the host) the per-tensor fallbacks add per iteration over the `tensors` parameter
    tensors the optimizer holds: a norm and a read on the host per tensor for the gradient norm (`clip_grad` > 0), a
    second kernel per tensor for the parameter copy (non-distributed optimizer); none with apex's or TE's
    multi-tensor kernels."""
    if kernels(c).multi_tensor:
        return 0.0, 0.0
    steps, reads = 0.0, 0.0
    clip = 1.0 if c.run is None else c.run.clip
    if clip > 0:
        steps += tensors
        reads += tensors
    if not c.use_distributed_optimizer and c.precision != "fp32":
        steps += tensors
    return steps, reads
