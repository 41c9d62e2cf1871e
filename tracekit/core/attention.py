"""Attention variants of a Megatron-core GPT beyond multi-head/grouped-query attention: multi-latent attention
(DeepSeek-V2/V3) and sliding-window attention (GPT-OSS, Mistral), by Megatron's argument names.

- MLA (`megatron/core/transformer/multi_latent_attention.py`): the query is projected down to `q_lora_rank`
  (none: one projection straight to the heads), normalised and projected up to heads × (qk_head_dim +
  qk_pos_emb_head_dim); keys and values share one down-projection to kv_lora_rank + qk_pos_emb_head_dim, normalised
  and projected up to heads × (qk_head_dim + v_head_dim); the rope part of the key is shared by the heads. The down
  projections are replicated over tensor parallelism (Transformer Engine's `duplicated` linear); the up
  projections and the output projection are split like the attention heads. Attention runs with query/key head dim
  qk_head_dim + qk_pos_emb_head_dim and value head dim v_head_dim.
- Sliding windows: with `window_size` (keys before, after; -1 unbounded), a layer attends to at most that many keys;
  `window_attn_skip_freq` N makes every N-th layer (1-based) full attention, a 0/1 list names the window layers.
- `fp8_dot_product_attention` (Transformer Engine) runs the attention kernel in fp8.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tracekit.core.errors import ConfigError
from tracekit.core.moe import layer_freq


@dataclass(frozen=True)
class AttentionSettings:
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int = 512
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    window_size: Any = None  # int (keys before) or (before, after); None / -1: full attention
    window_attn_skip_freq: Any = None  # int N, or a 0/1 tuple per layer (1: window)
    qk_layernorm: bool = False
    fp8_dot_product_attention: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "window_size", _window(self.window_size))
        if self.window_attn_skip_freq is not None:
            object.__setattr__(self, "window_attn_skip_freq", layer_freq(self.window_attn_skip_freq))

    @property
    def q_head_dim(self) -> int:
        return self.qk_head_dim + self.qk_pos_emb_head_dim

    def window(self, layer: int) -> int | None:
        """Keys each query attends to at most in layer `layer` (0-based; Megatron counts from 1), None: full."""
        if self.window_size is None:
            return None
        freq = self.window_attn_skip_freq
        if freq is None:
            return self.window_size
        if isinstance(freq, int):
            return self.window_size if (layer + 1) % freq != 0 else None
        return self.window_size if freq[layer] else None

    def validate(self, config) -> None:
        if self.multi_latent_attention:
            for name in ("kv_lora_rank", "qk_head_dim", "v_head_dim"):
                if int(getattr(self, name)) < 1:
                    raise ConfigError(f"{name} must be ≥ 1 with multi_latent_attention, got {getattr(self, name)}")
            if self.q_lora_rank is not None and self.q_lora_rank < 1:
                raise ConfigError(f"q_lora_rank must be ≥ 1 (or unset), got {self.q_lora_rank}")
        if isinstance(self.window_attn_skip_freq, tuple) and len(self.window_attn_skip_freq) != config.num_layers:
            raise ConfigError(f"window_attn_skip_freq gives {len(self.window_attn_skip_freq)} layers, the model has "
                              f"{config.num_layers}")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if isinstance(data["window_attn_skip_freq"], tuple):
            data["window_attn_skip_freq"] = list(data["window_attn_skip_freq"])
        return data


FIELDS = tuple(f.name for f in dataclasses.fields(AttentionSettings))


def _window(value: Any) -> int | None:
    """Keys before each query (`--window-size 128 0`, `(128, 0)`, `128`); None when unbounded."""
    if value in (None, "", "None", False):
        return None
    if isinstance(value, str):
        value = [v for v in value.replace("(", " ").replace(")", " ").replace(",", " ").split() if v]
    if isinstance(value, (list, tuple)):
        if not value:
            return None
        value = value[0]
    size = int(float(value))
    return None if size < 0 else size
