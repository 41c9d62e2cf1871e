"""Precision recipes: what a training run computes its GEMMs in, and what that costs around them.

A recipe is one name tracekit's `precision` setting takes (`TrainingConfig.precision`), read from how published
tables and launch lines write it:

- fp32 (TF32 math): fp32, float32
- fp16 with loss scaling: fp16, amp_fp16, `--fp16`
- bf16: bf16, amp_bf16, `--bf16`
- fp8: e4m3/hybrid GEMMs, per-tensor delayed scaling (amax history): fp8, fp8-ds, amp_fp8, `--fp8-format hybrid`
  (`--fp8-recipe delayed`)
- fp8-cs: per-tensor current scaling (the amax of the tensor itself): fp8-cs, `--fp8-recipe tensorwise`
- fp8-block: 1×128 activation and 128×128 weight scales: fp8-block, blockwise, `--fp8-recipe blockwise`
- mxfp8: one E8M0 scale per 32 elements: mxfp8, fp8-mx, `--fp8-recipe mxfp8`
- nvfp4: e2m1 with one E4M3 scale per 16 elements and a per-tensor scale: nvfp4, `--fp4-format e2m1`

Facts used by the estimate (Transformer Engine's recipes, its documentation and support matrix): every
low-precision recipe quantises each GEMM's inputs — activations in forward, the output gradient in backward, the
weights once per iteration (they are cached across micro-batches) — with memory-bound cast kernels that write a
row-wise and a column-wise copy (the forward and the weight-gradient GEMMs read the tensor along different axes);
current scaling reads the tensor once more for its amax before casting; everything that is not a linear layer's GEMM
(attention unless fp8 attention is asked, norms, activations, softmax, the optimizer) stays in bf16;
`--first-last-layers-bf16` (`--num-layers-at-start-in-bf16`, `--num-layers-at-end-in-bf16`) keeps those layers'
GEMMs in bf16. Which GPUs run which GEMM dtype is the datasheet's (`tracekit.core.hardware.PEAK_KIND`,
`HardwareSpec.peak_tflops`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from tracekit.core.errors import ConfigError, did_you_mean


@dataclass(frozen=True)
class Recipe:
    name: str
    gemm_dtype: str  # a key of tracekit.core.hardware.PEAK_KIND
    #: bytes written per element of a quantised tensor, scales included (0: no cast)
    out_bytes: float = 0.0
    #: quantised copies written per tensor: the forward GEMM and the weight-gradient GEMM read the tensor along
    #: different axes, so training casts to a row-wise and a column-wise (transposed) copy in one kernel
    copies: int = 2
    #: an amax pass over the tensor before the cast (current scaling; NVFP4's per-tensor scale)
    amax_pass: bool = False

    @property
    def low_precision(self) -> bool:
        return self.out_bytes > 0


#: fp8: 1 byte per element; fp8 blockwise: + an fp32 scale per 128; MX: + an E8M0 byte per 32; NVFP4: half a byte +
#: an E4M3 byte per 16.
RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("fp32", "fp32"),
    Recipe("fp16", "fp16"),
    Recipe("bf16", "bf16"),
    Recipe("fp8", "fp8", out_bytes=1.0),
    Recipe("fp8-cs", "fp8", out_bytes=1.0, amax_pass=True),
    Recipe("fp8-block", "fp8_block", out_bytes=1.0 + 4 / 128),
    Recipe("mxfp8", "mxfp8", out_bytes=1.0 + 1 / 32),
    Recipe("nvfp4", "nvfp4", out_bytes=0.5 + 1 / 16, amax_pass=True),
)}

#: How published tables, YAML files and argument values spell each recipe (lower case, `_` and `-` alike).
SPELLINGS = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32", "amp_fp32": "fp32", "tf32": "fp32",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16", "amp_fp16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16", "amp_bf16": "bf16",
    "fp8": "fp8", "float8": "fp8", "e4m3": "fp8", "hybrid": "fp8", "fp8_hybrid": "fp8", "fp8_e4m3": "fp8",
    "fp8_ds": "fp8", "fp8_delayed": "fp8", "delayed": "fp8", "amp_fp8": "fp8",
    "fp8_cs": "fp8-cs", "fp8_current": "fp8-cs", "tensorwise": "fp8-cs", "fp8_tensorwise": "fp8-cs",
    "fp8_block": "fp8-block", "fp8_blockwise": "fp8-block", "blockwise": "fp8-block", "fp8_bs": "fp8-block",
    "mxfp8": "mxfp8", "fp8_mx": "mxfp8", "mx_fp8": "mxfp8",
    "nvfp4": "nvfp4", "fp4": "nvfp4", "e2m1": "nvfp4", "fp4_nv": "nvfp4",
}


@lru_cache(maxsize=256)
def recipe_name(value: object) -> str:
    """The recipe a precision cell or setting names; ConfigError (with a suggestion) for anything else."""
    text = str(value).strip().lower().replace("-", "_")
    if text in SPELLINGS:
        return SPELLINGS[text]
    raise ConfigError(f"precision {value!r} is not a recipe tracekit knows{did_you_mean(text, SPELLINGS)} "
                      f"(recipes: {', '.join(RECIPES)}; also amp_bf16, amp_fp8, fp8-mx, blockwise, ...)")


def recipe(name: str) -> Recipe:
    return RECIPES[recipe_name(name)]


#: Megatron's `--fp8-recipe` values → recipe (`--fp8-format` turns fp8 on; the recipe says which scaling).
FP8_RECIPES = {"delayed": "fp8", "tensorwise": "fp8-cs", "blockwise": "fp8-block", "mxfp8": "mxfp8"}


def from_megatron(fp8_format: object = None, fp8_recipe: object = None, fp4_format: object = None,
                  fp4_recipe: object = None) -> str | None:
    """The recipe Megatron's fp8/fp4 flags select, or None when they select none (then --bf16/--fp16 decide)."""
    def on(value: object) -> bool:
        return value not in (None, False, "None", "none", "")

    if on(fp4_format):  # --fp4-recipe alone selects nothing: its default, nvfp4, is in every log's arguments block
        return "nvfp4"
    if on(fp8_format):
        text = str(fp8_recipe).lower() if on(fp8_recipe) else "delayed"
        if text not in FP8_RECIPES:
            raise ConfigError(f"--fp8-recipe {fp8_recipe!r} is not one tracekit models "
                              f"({', '.join(FP8_RECIPES)}){did_you_mean(text, FP8_RECIPES)}")
        return FP8_RECIPES[text]
    return None


@dataclass(frozen=True)
class LowPrecisionSettings:
    """Which layers keep bf16 GEMMs under a low-precision recipe (Megatron's `--first-last-layers-bf16` with
    `--num-layers-at-start-in-bf16` / `--num-layers-at-end-in-bf16`, 1 each by default), and whether the
    distributed optimizer gathers fp8 parameters (`--fp8-param-gather`: half the all-gather bytes)."""

    first_last_layers_bf16: bool = False
    num_layers_at_start_in_bf16: int = 1
    num_layers_at_end_in_bf16: int = 1
    fp8_param_gather: bool = False

    def bf16_layer(self, layer: int, num_layers: int) -> bool:
        if not self.first_last_layers_bf16:
            return False
        return layer < self.num_layers_at_start_in_bf16 or layer >= num_layers - self.num_layers_at_end_in_bf16

    def to_dict(self) -> dict:
        import dataclasses

        return dataclasses.asdict(self)


LOWP_FIELDS = ("first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16",
               "fp8_param_gather")
