"""Software-stack profiles: what a training stack does beyond the model's shapes.

A profile (`tracekit/data/stacks/<name>.json`) carries the stack's defaults for what a configuration file rarely
says — the attention kernel (`unfused`: baddbmm + fused masked softmax + bmm; `flash`), overlap of the gradient
reduce, P2P and TP communication, the dtype gradients are kept and reduced in (memory and DP traffic) — and its
host costs as calibration constants (framework time per
compute operator, per micro-batch call, per iteration). Constants are fitted on one data set and scored on
another (the profile's `fit` says which); a profile may take its constants from a sibling stack
(`constants_from`) when it has no measurements of its own.

Host constants are host time, and a host CPU runs them faster or slower: a profile's `host_scale` multiplies them
per host CPU class (`tracekit/data/host_cpus.json`: the CPU of each GPU's usual node, DGX A100's EPYC, DGX H100's
and B200's Xeons, Grace), fitted with the constants; a class it does not name keeps the constants as fitted (its
reference class, scale 1).

What a GPU achieves is a property of the hardware, and lives with it (`predictor.costs.physics.achieved_rates`: the
measured GEMM rates every stack's predictions start from). A profile's `device_scale` multiplies its tensor-core ops
(the calibration's compute scale) per GPU architecture (`tracekit.core.hardware.architecture`: hopper, blackwell, ...)
for what that stack's runs show beyond them, fitted on that stack's measured runs and read by that stack alone (the
megatron-bridge profile's, on the Megatron-Bridge rows' dense models, reported leave-one-model-out; docs/limits.md
says what it stands for): no profile takes another's device scales, `constants_from` included.

`select_stack(text)` picks the profile a row names (the e2e `framework` column, a version string, `--stack`);
`stack_of_arguments(args)` the one a Megatron log's arguments block shows (Megatron-DeepSpeed prints `deepspeed`,
Megatron-core `transformer_impl`); the default for inputs that say nothing is `megatron-core`, today's Megatron.
Host constants are GPU facts: on a CPU (`cpu-*`) the framework time `tracekit sample` measured serves instead.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from .calibration import CONSTANTS, Calibration, device_scaled, host_scaled
from .data_files import DATA
from .errors import ConfigError, did_you_mean
from .hardware import ARCHITECTURES, architecture
from .hosts import host_class, host_cpus

STACK_DIR = DATA / "stacks"
DEFAULT = "megatron-core"
#: Configuration keys a profile may set (TrainingConfig fields); anything the input states wins over them.
CONFIG_KEYS = ("attention", "overlap_grad_reduce", "overlap_param_gather", "overlap_p2p_comm", "tp_comm_overlap",
               "use_distributed_optimizer", "accumulate_allreduce_grads_in_fp32", "position_embedding_type",
               "normalization", "apply_rope_fusion", "fused_rmsnorm", "swiglu", "moe_token_dispatcher_type",
               "moe_grouped_gemm", "moe_permute_fusion", "hidden_dropout", "attention_dropout",
               "cross_entropy_loss_fusion", "cross_entropy_fusion_impl", "check_for_nan_in_loss_and_grad",
               "scatter_gather_tensors_in_pipeline", "async_tensor_model_parallel_allreduce",
               "apex_available", "te_available")  # what the stack's install has (tracekit.core.layer_impl)


#: Stacks that are not Megatron-LM or one of its forks → the framework's name.
FRAMEWORKS = {"torchtitan": "torchtitan", "composer": "Composer"}


@dataclass(frozen=True)
class Stack:
    name: str
    description: str
    match: tuple[str, ...]  # regular expressions on a framework / version text
    config: dict[str, Any] = field(default_factory=dict)
    constants: dict[str, float] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)
    host_scale: dict[str, float] = field(default_factory=dict)  # host CPU class → × the host constants
    device_scale: dict[str, float] = field(default_factory=dict)  # GPU architecture → × the tensor-core ops

    @property
    def framework(self) -> str:
        """Who refuses a configuration this stack cannot run, in a message: torchtitan, Composer, else Megatron (the
        other stacks are Megatron-LM and its forks)."""
        return FRAMEWORKS.get(self.name, "Megatron")

    def calibration(self, hardware: str = "") -> Calibration:
        """The stack's host constants as a calibration named after the stack (none on a CPU), scaled for the host
        CPU of `hardware`'s usual node and for its GPU architecture (`device_scale`)."""
        constants = {} if hardware.startswith("cpu-") else self.constants
        cal = Calibration(name=f"stack:{self.name}", description=self.description, fit=self.fit,
                          **{k: float(v) for k, v in constants.items()})
        cal = device_scaled(cal, self.device_scale.get(architecture(hardware) or "", 1.0))
        return host_scaled(cal, self.host_scale.get(host_class(hardware) or "", 1.0))


def stack_path(name: str) -> Path:
    return STACK_DIR / f"{name}.json"


@lru_cache(maxsize=None)
def stacks() -> dict[str, Stack]:
    """Every shipped profile by name (constants of `constants_from` profiles resolved)."""
    raw = {}
    for path in sorted(STACK_DIR.glob("*.json")):
        doc = json.loads(path.read_text())
        raw[doc["name"]] = doc
    out = {}
    for name, doc in raw.items():
        unknown = set(doc.get("config", {})) - set(CONFIG_KEYS)
        if unknown:
            raise ConfigError(f"{stack_path(name)}: unknown config key(s) {sorted(unknown)}")
        constants = dict(doc.get("constants", {}))
        host_scale = dict(doc.get("host_scale", {}))
        device_scale = dict(doc.get("device_scale", {}))
        source = doc.get("constants_from")
        fit = dict(doc.get("fit", {}))
        if source:
            constants = dict(raw[source].get("constants", {}))
            host_scale = dict(raw[source].get("host_scale", {}))
            fit = {"constants_from": source, **raw[source].get("fit", {})}
        bad = set(constants) - set(CONSTANTS)
        if bad:
            raise ConfigError(f"{stack_path(name)}: unknown constant(s) {sorted(bad)}")
        hosts = set(host_scale) - set(host_cpus())
        if hosts:
            raise ConfigError(f"{stack_path(name)}: unknown host CPU class(es) {sorted(hosts)} "
                              f"(tracekit/data/host_cpus.json: {', '.join(host_cpus())})")
        archs = set(device_scale) - set(ARCHITECTURES.values())
        if archs:
            raise ConfigError(f"{stack_path(name)}: unknown GPU architecture(s) {sorted(archs)} "
                              f"(known: {', '.join(sorted(set(ARCHITECTURES.values())))})")
        out[name] = Stack(name, doc.get("description", ""), tuple(doc.get("match", ())), doc.get("config", {}),
                          constants, fit, host_scale, device_scale)
    return out


def get_stack(name: str) -> Stack:
    """A profile by name; ConfigError with a suggestion when unknown."""
    known = stacks()
    if name in known:
        return known[name]
    raise ConfigError(f"unknown stack {name!r}{did_you_mean(name, known)}; shipped: {', '.join(known)}")


def select_stack(text: str | None) -> tuple[Stack, str]:
    """The profile a framework/version text names, and a note when none matched (the default is used)."""
    text = (text or "").strip()
    if text:
        for stack in stacks().values():
            if any(re.search(p, text, re.I) for p in stack.match):
                return stack, ""
        return get_stack(DEFAULT), f"stack {text!r} not recognised: {DEFAULT} assumed"
    return get_stack(DEFAULT), ""


def stack_of_arguments(args: dict[str, Any]) -> Stack | None:
    """The profile a Megatron arguments block shows, or None when it shows none."""
    def truthy(key: str) -> bool:
        return str(args.get(key, "")).strip().lower() in ("true", "1")

    if truthy("deepspeed") or any(k.startswith(("zero_", "deepspeed_")) for k in args):
        return get_stack("megatron-deepspeed-2023")
    if "transformer_impl" in args or "use_mcore_models" in args:
        return get_stack("megatron-core")
    return None
