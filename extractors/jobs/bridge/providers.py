"""The architecture a Megatron-Bridge model provider fixes, for a published row whose notes name it (`arch:
GPTOSSProvider120B + GPTOSSProvider in src/megatron/bridge/models/gpt_oss/gpt_oss_provider.py`): settings the
table's columns do not state and Megatron's defaults (GPT-3's: biases, tied embeddings, the native cross entropy) get
wrong for these models (no dropout: the megatron-bridge stack profile's).

From the providers' dataclass defaults in Megatron-Bridge (`src/megatron/bridge/models/`):

- `GPTOSSProvider` (`gpt_oss/gpt_oss_provider.py`): biases on every linear (`add_bias_linear`), untied embeddings,
  a quick-GELU GLU (`activation_func=quick_gelu`, `glu_linear_offset` 1.0) clamped at 7.0
  (`activation_func_clamp_value`), the bias-dropout-add unfused (`bias_dropout_fusion=False`:
  predictor.layers.mlp.bias_dropout_add); and every GPT-OSS performance recipe keeps and reduces gradients in bf16
  (`set_gpt_oss_common_configs` in `scripts/performance/configs/gpt_oss/gpt_oss_llm_pretrain.py`:
  `ddp.grad_reduce_in_fp32 = False`, tracekit's `accumulate_allreduce_grads_in_fp32` False).
- `Llama3ModelProvider` (`llama/llama_provider.py`), `Qwen3MoEModelProvider` (`qwen/qwen_provider.py`, with
  `qk_layernorm`), `DeepSeekModelProvider` (`deepseek/deepseek_provider.py`): no linear biases, untied embeddings;
  the Llama 3 and DeepSeek-V3 providers fuse the cross entropy with Transformer Engine's implementation
  (`cross_entropy_fusion_impl=te`; the others keep GPTModelProvider's `native` fused implementation).

Every provider derives from `GPTModelProvider` (`gpt_provider.py`), which fuses the cross entropy
(`cross_entropy_loss_fusion: bool = True`, Megatron-core's TransformerConfig default is False): no Bridge row runs
Megatron-core's unfused fp32 loss chain (`predictor.layers.embedding.cross_entropy`).

All four use RMSNorm (Transformer Engine's fused kernel: the megatron-bridge stack's `fused_rmsnorm`) and rotary
positions (GPT-OSS: YaRN, the same kernels on rescaled frequencies); Llama 3's provider fuses RoPE
(`apply_rope_fusion=True`), the DeepSeek provider sets it False (MLA), the GPT-OSS and Qwen3-MoE providers leave
Megatron's TransformerConfig default (False): the unfused element-wise chain (`predictor.layers.norm_rope`).

- `Nemotron3NanoProvider` (`nemotronh/nemotron_h_provider.py`, over `NemotronHModelProvider` and
  `MambaModelProvider` in `mamba/mamba_provider.py`): a hybrid model (its layer pattern
  `MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME`), Mamba2 mixers of 64 heads × 64 with a state of 128 in 8
  groups, squared-ReLU experts, no position embedding, RMSNorm, no linear biases, untied embeddings, and
  NemotronHModelProvider's router (sigmoid scores with an expert bias, an fp32 router, the sequence-level auxiliary
  loss at 1e-4). Its `first_last_layers_bf16=True` does not reach the model: Bridge's mixed-precision configuration
  overwrites every field it holds on the model (`update_config_with_precision_overrides` in
  `training/mixed_precision.py`), and only its fp8 current-scaling recipe sets it, which the performance scripts turn
  off (extractors.jobs.bridge.precision); NemotronHModelProvider's `moe_shared_expert_overlap=True` is turned off by
  the Nano pretraining recipe (`recipes/nemotronh/nemotron_3_nano.py`), Megatron's default here.

A setting the row states itself (a column, a `name=value` of its notes, its launch line) wins.
"""
from __future__ import annotations

import re
from typing import Any

_COMMON = {"untie_embeddings_and_output_weights": True, "normalization": "RMSNorm", "position_embedding_type": "rope",
           "cross_entropy_loss_fusion": True}
_TE_LOSS = {"cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "te"}
#: Provider class (its name or the start of a subclass's name) → the settings it fixes.
PROVIDERS: dict[str, dict[str, Any]] = {
    "GPTOSSProvider": {**_COMMON, "add_bias_linear": True, "activation_func_clamp_value": 7.0,
                       "accumulate_allreduce_grads_in_fp32": False, "bias_dropout_fusion": False},
    "Llama3ModelProvider": {**_COMMON, **_TE_LOSS, "add_bias_linear": False, "apply_rope_fusion": True},
    "Qwen3MoEModelProvider": {**_COMMON, "add_bias_linear": False, "qk_layernorm": True},
    "DeepSeekModelProvider": {**_COMMON, "add_bias_linear": False},
    "DeepSeekV3ModelProvider": {**_COMMON, **_TE_LOSS, "add_bias_linear": False},
    "Nemotron3NanoProvider": {**_COMMON, "position_embedding_type": "none", "add_bias_linear": False,
                              "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
                              "mamba_num_heads": 64, "mamba_head_dim": 64, "mamba_state_dim": 128,
                              "mamba_num_groups": 8, "squared_relu": True, "moe_router_score_function": "sigmoid",
                              "moe_router_enable_expert_bias": True, "moe_router_dtype": "fp32",
                              "moe_router_load_balancing_type": "seq_aux_loss", "moe_aux_loss_coeff": 1e-4},
}
_ARCH = re.compile(r"\barch:\s*([^|;]*)")
_NAME = re.compile(r"\b([A-Z][A-Za-z0-9_]*Provider[A-Za-z0-9_]*)")


def provider_settings(notes: str) -> tuple[str | None, dict[str, Any]]:
    """(the provider the notes' `arch:` clause names, the settings it fixes); (None, {}) when it names none
    tracekit knows."""
    arch = _ARCH.search(notes or "")
    if not arch:
        return None, {}
    for name in _NAME.findall(arch.group(1)):
        for provider in sorted(PROVIDERS, key=len, reverse=True):
            if name.startswith(provider):
                return provider, dict(PROVIDERS[provider])
    return None, {}
