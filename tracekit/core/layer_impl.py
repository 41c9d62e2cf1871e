"""Which kernels Megatron-core's layer implementation runs, from the launch's flags and what the machine has
installed (the vendored snapshot, core 0.20: `megatron/core/models/gpt/gpt_layer_specs.py`, `models/backends.py`,
`transformer/dot_product_attention.py`, `transformer/torch_norm.py`, `fusions/`, `tensor_parallel/layers.py`,
`optimizer/__init__.py`, `training/arguments.py`).

Settings, read from a configuration's `extra` (Megatron's argument names, plus two of tracekit's own):

- `transformer_impl` (`--transformer-impl`): `transformer_engine` (Megatron's default; `inference_optimized` runs the
  same Transformer Engine kernels) or `local` (`get_gpt_layer_local_spec`: Megatron-core's own modules).
- `apex_available`, `te_available` (tracekit's, not Megatron's: a launch line cannot say what is installed): whether
  apex with its CUDA extensions and Transformer Engine are importable where the job runs. Unstated, both are True:
  the stack profiles `megatron-core` and `megatron-bridge` say so (NVIDIA's containers; Megatron-LM's CI runs its
  local implementation without `--no-persist-layer-norm` or `--no-masked-softmax-fusion`, which only apex makes
  possible), and a prediction's notes say what was assumed. `--set apex_available=false te_available=false`
  predicts a plain PyTorch install.
- The fusion flags: `masked_softmax_fusion` (`--no-masked-softmax-fusion`), `no_persist_layer_norm`
  (`--no-persist-layer-norm`; `persist_layer_norm` False says the same), `bias_gelu_fusion` / `bias_swiglu_fusion`
  (`--no-bias-gelu-fusion`, `--no-bias-swiglu-fusion`), `attention_softmax_in_fp32` and
  `apply_query_key_layer_scaling` (the latter implies the former); `apply_rope_fusion`, `bias_dropout_fusion`,
  `gradient_accumulation_fusion` and the dropouts are read where they were already.

What each implementation runs (`kernels(config)`), Transformer Engine's first, then the local implementation's:

- norms: TE's fused LayerNorm / RMSNorm. Local: LayerNorm is apex's `FusedLayerNorm` (its persistent kernel unless
  `--no-persist-layer-norm` or the width is not one it has), without apex `torch.nn.LayerNorm`; RMSNorm is
  `torch.nn.RMSNorm`, with or without apex.
- core attention: TE's flash/fused kernel (`--use-flash-attn` changes nothing). Local: `DotProductAttention`, never
  flash-attn — GQA's keys and values repeated to every head, baddbmm, the fused masked softmax (apex's kernel, with
  masked-softmax fusion and scores it takes) or PyTorch's chain (the causal mask built, [fp32 cast, layer scaling],
  masked_fill, softmax, [cast back]), dropout on the probabilities, bmm, the context permuted to [s, b, h].
- linear biases: in the GEMM's epilogue. Local: the QKV projection's bias added by a kernel of its own and its
  gradient reduced by another (the other linear layers hand theirs on).
- MoE experts: a grouped GEMM with `--moe-grouped-gemm`. Local: `SequentialMLP`, one GEMM per expert, whatever the
  flag says.
- optimizer: TE's `FusedAdam`. Local: TE's or apex's `FusedAdam`; with neither, `torch.optim.AdamW` (foreach) and
  per-tensor loops for the gradient norm and the parameter copies.

Both: the bias-activation fusion and the bias-dropout-add fusion are `torch.compile`d (`megatron/core/jit.py`); off,
each op is a kernel of its own. Where Megatron refuses a combination, `check` raises ConfigError in one line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, did_you_mean

IMPLS = ("transformer_engine", "local", "inference_optimized")
#: Settings this module reads from a configuration's `extra` (tracekit.core.config keeps them there).
SETTINGS = ("transformer_impl", "apex_available", "te_available", "masked_softmax_fusion", "no_persist_layer_norm",
            "persist_layer_norm", "bias_gelu_fusion", "bias_swiglu_fusion", "attention_softmax_in_fp32",
            "apply_query_key_layer_scaling")
#: Hidden sizes apex's persistent LayerNorm kernel takes (`fusions/fused_layer_norm.py`); others fall back to
#: `FusedLayerNormAffineFunction`.
PERSIST_LN_WIDTHS = frozenset((1024, 1536, 2048, 2304, 3072, 3840, 4096, 5120, 6144, 8192, 10240, 12288, 12800,
                               15360, 16384, 18432, 20480, 24576, 25600, 30720, 32768, 40960, 49152, 65536))


@dataclass(frozen=True)
class Kernels:
    """What one configuration's layers run (module docstring)."""

    impl: str  # transformer_engine | local (inference_optimized runs transformer_engine's kernels)
    apex: bool
    te: bool
    norm: str  # te | apex_persist | apex | torch
    softmax: str  # fused | torch (the unfused core attention's softmax; flash attention has none)
    softmax_fp32: bool  # the torch softmax in fp32 (casts around it)
    softmax_scale: bool  # apply_query_key_layer_scaling: the torch path multiplies the scores by 1/layer
    bias_activation_fusion: bool
    bias_dropout_fusion: bool
    optimizer: str  # fused | torch_foreach
    multi_tensor: bool  # TE's or apex's multi-tensor kernels (else Megatron's per-tensor fallbacks)

    @property
    def local(self) -> bool:
        return self.impl == "local"


def _flag(extra: dict, name: str, default: bool) -> bool:
    """A boolean setting; ConfigError naming it when its value is not one."""
    value = extra.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"{name} must be true or false, not {value!r}")


def _persist(extra: dict) -> bool:
    """persist_layer_norm as Megatron sets it: on unless `--no-persist-layer-norm` (dest `no_persist_layer_norm`
    in a log's arguments; `persist_layer_norm` False as a flag parser reads `--no-…`)."""
    return not _flag(extra, "no_persist_layer_norm", False) and _flag(extra, "persist_layer_norm", True)


def impl_of(extra: dict) -> str:
    """The layer implementation (ConfigError for a value Megatron does not have)."""
    value = extra.get("transformer_impl")
    if value is None:
        return "transformer_engine"
    text = str(value).strip().lower()
    if text not in IMPLS:
        raise ConfigError(f"transformer_impl must be one of {', '.join(IMPLS)}, not {value!r}"
                          f"{did_you_mean(text, IMPLS)}")
    return "transformer_engine" if text == "inference_optimized" else text


def fused_softmax_takes(batch: int, heads: int, sq: int, sk: int, causal: bool = True) -> bool:
    """Whether the fused masked-softmax kernel takes these scores ([batch, heads, sq, sk] in fp16/bf16):
    `FusedScaleMaskSoftmax.is_kernel_available` — 16 < sk ≤ 4096, sq, sk and batch·heads multiples of 4, and the
    kernel's batches per block (8 rows of up to 128 keys, 4 of more: 128 threads, a warp per row or two) dividing
    batch·heads (causal) or sq."""
    rows = batch * heads
    if not (16 < sk <= 4096 and sq % 4 == 0 and sk % 4 == 0 and rows % 4 == 0):
        return False
    per_block = 8 if sk <= 128 else 4
    return (rows if causal else sq) % per_block == 0


def kernels(c) -> Kernels:
    """The kernels `c` (a TrainingConfig) runs; ConfigError where a setting has no meaning (see `check` for the
    combinations Megatron refuses)."""
    extra = c.extra
    impl = impl_of(extra)
    apex = _flag(extra, "apex_available", True)
    te = _flag(extra, "te_available", True)
    local = impl == "local"
    persist = _persist(extra)
    if not local:
        norm = "te"
    elif c.normalization == "RMSNorm" or not apex:
        norm = "torch"
    else:
        norm = "apex_persist" if persist and c.hidden_size in PERSIST_LN_WIDTHS else "apex"
    scale = _flag(extra, "apply_query_key_layer_scaling", False)
    fp32 = scale or _flag(extra, "attention_softmax_in_fp32", False)
    fusion = _flag(extra, "masked_softmax_fusion", True)
    if impl == "transformer_engine" and "transformer_impl" in extra:
        softmax = "fused"  # TE's unfused attention has softmax kernels of its own
    else:
        a_t = c.num_attention_heads // c.tensor_model_parallel_size
        s = c.seq_length // c.context_parallel_size
        takes = fused_softmax_takes(c.micro_batch_size, a_t, s, s * c.context_parallel_size)
        softmax = "fused" if fusion and apex and takes and c.precision != "fp32" else "torch"
    if c.swiglu:
        act_fusion = _flag(extra, "bias_swiglu_fusion", True)
    else:
        act_fusion = _flag(extra, "bias_gelu_fusion", True) and c.add_bias_linear  # Megatron turns it off without bias
    multi = te or apex
    return Kernels(impl=impl, apex=apex, te=te, norm=norm, softmax=softmax, softmax_fp32=fp32 and c.precision != "fp32",
                   softmax_scale=scale, bias_activation_fusion=act_fusion,
                   bias_dropout_fusion=_flag(extra, "bias_dropout_fusion", True),
                   optimizer="fused" if multi else "torch_foreach", multi_tensor=multi)


def check(c) -> None:
    """ConfigError naming the first way Megatron (or the install) refuses this configuration's layer kernels."""
    k = kernels(c)
    impl = str(c.extra.get("transformer_impl", "transformer_engine"))
    if k.impl == "transformer_engine" and not k.te:
        raise ConfigError(f"--transformer-impl {impl} needs Transformer Engine (te_available is false): use "
                          "--transformer-impl local")
    if c.apply_rope_fusion and c.position_embedding_type == "rope" and not k.te:
        raise ConfigError("Megatron refuses RoPE fusion without Transformer Engine (te_available is false): add "
                          "--no-rope-fusion")
    if not k.local:
        return
    run = c.run
    if (run is None or run.accumulation_fused) and not k.apex:
        raise ConfigError("Megatron's local linear layers refuse gradient-accumulation fusion without apex "
                          "(fused_weight_gradient_mlp_cuda; apex_available is false): add "
                          "--no-gradient-accumulation-fusion")
    if k.norm == "torch":
        why = "RMSNorm" if c.normalization == "RMSNorm" else "LayerNorm without apex"
        if _persist(c.extra):
            raise ConfigError(f"the local implementation's {why} is torch's (WrappedTorchNorm), which refuses "
                              "persist_layer_norm: add --no-persist-layer-norm")
        if c.sequence_parallel:
            raise ConfigError(f"the local implementation's {why} is torch's (WrappedTorchNorm), which refuses "
                              "sequence parallelism")
    if c.context_parallel_size > 1:
        raise ConfigError("the local implementation's DotProductAttention refuses context parallelism (only "
                          "TEDotProductAttention has it)")
    if _flag(c.extra, "masked_softmax_fusion", True) and not k.apex and c.precision != "fp32":
        a_t = c.num_attention_heads // c.tensor_model_parallel_size
        if fused_softmax_takes(c.micro_batch_size, a_t, c.seq_length, c.seq_length):
            raise ConfigError("the local implementation's fused masked softmax is apex's kernel "
                              "(scaled_upper_triang_masked_softmax_cuda; apex_available is false): Megatron stops "
                              "at the first forward; add --no-masked-softmax-fusion")
    if c.recipe.low_precision:
        raise ConfigError(f"the local implementation's linear layers (torch matmul) run no {c.precision} recipe: "
                          "use --transformer-impl transformer_engine")


def notes(c) -> list[str]:
    """What a prediction assumed about the layer kernels where the assumption changes it (the local implementation,
    or no multi-tensor kernels): one line."""
    k = kernels(c)
    if not k.local and k.multi_tensor:
        return []
    stated = {name: name in c.extra for name in ("apex_available", "te_available")}
    have = f"apex {'installed' if k.apex else 'not installed'}, Transformer Engine " \
           f"{'installed' if k.te else 'not installed'}"
    how = "as stated" if all(stated.values()) else "assumed where unstated (--set apex_available=…, te_available=…)"
    if not k.local:
        return [f"layer kernels: {have} ({how}): torch AdamW (foreach) and per-tensor gradient-norm and copy loops"]
    norm = {"apex_persist": "apex's persistent LayerNorm", "apex": "apex's FusedLayerNorm",
            "torch": f"torch.nn.{'RMSNorm' if c.normalization == 'RMSNorm' else 'LayerNorm'}"}[k.norm]
    softmax = "the fused masked softmax" if k.softmax == "fused" else \
        f"PyTorch's masked_fill + softmax{' in fp32' if k.softmax_fp32 else ''}"
    opt = "FusedAdam" if k.optimizer == "fused" else "torch AdamW (foreach)"
    extra: dict[str, Any] = c.extra
    flash = "; --use-flash-attn has no effect on it" if extra.get("use_flash_attn") else ""
    return [f"local implementation, {have} ({how}): {norm}, unfused core attention (baddbmm, {softmax}, bmm)"
            f"{flash}, {opt}"]
