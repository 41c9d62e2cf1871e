"""Mixture-of-experts settings of a Megatron-core GPT (`megatron/core/transformer/moe/`), by Megatron's argument
names, with the rules Megatron applies to them.

- Which layers are MoE: `moe_layer_freq` — an integer N (every N-th layer, from layer 0) or a 0/1 pattern per layer,
  which Megatron writes as a Python list expression (`([0]*3+[1]*58)`); published tables write it as the number of
  dense first layers (`moe_first_k_dense`).
- Expert parallelism: the expert layers are laid out over the world in the order expert-TP, EP, expert-DP, PP
  (Megatron's expert rank generator, order "tp-ep-dp-pp"), independently of the attention's TP/CP/DP; the expert
  tensor-parallel size defaults to the tensor-parallel size; expert-DP = world / (pp · etp · ep).
- Tokens per expert: each rank routes its local tokens to `moe_router_topk` experts; with balanced routing every
  expert receives tokens·topk / experts of the tokens of its EP group. `moe_router_force_load_balancing` (Megatron
  benchmarks) makes that exact; otherwise tracekit's `moe_imbalance` (the busiest expert rank's load over the mean,
  default 1.0 — dropless routing with an auxiliary loss keeps it near balance, but how near is a property of the run,
  not of its settings) scales it; a capacity factor caps it (`moe_expert_capacity_factor`; with
  `moe_pad_expert_input_to_capacity` every expert computes exactly its capacity).
- Latent MoE (`moe_latent_size`, Nemotron 3): a projection [hidden → latent] before the dispatch and [latent → hidden]
  after the combine (Transformer Engine linears replicated over TP), so the tokens travel and the experts compute at
  the latent width: each expert's FC1 is [latent → ffn], its FC2 [ffn → latent]. The shared experts stay at hidden.
"""
from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tracekit.core.errors import ConfigError

DISPATCHERS = ("alltoall", "allgather", "flex")
FLEX_BACKENDS = ("deepep", "hybridep", "ncclep")
SCORE_FUNCTIONS = ("softmax", "sigmoid", "sqrtsoftplus")


@dataclass(frozen=True)
class MoESettings:
    num_experts: int
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None  # None: ffn_hidden_size
    moe_shared_expert_intermediate_size: int | None = None
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None  # None: tensor_model_parallel_size
    moe_layer_freq: Any = 1  # int N, or a per-layer 0/1 tuple
    moe_router_score_function: str = "softmax"
    moe_router_num_groups: int | None = None
    moe_router_group_topk: int | None = None
    moe_router_load_balancing_type: str = "aux_loss"
    moe_token_dispatcher_type: str = "allgather"
    moe_flex_dispatcher_backend: str = "deepep"
    moe_enable_deepep: bool = False
    moe_expert_capacity_factor: float | None = None
    moe_pad_expert_input_to_capacity: bool = False
    moe_router_force_load_balancing: bool = False
    moe_grouped_gemm: bool = False
    moe_permute_fusion: bool = False
    moe_router_dtype: str | None = None
    overlap_moe_expert_parallel_comm: bool = False
    moe_shared_expert_overlap: bool = False
    moe_latent_size: int | None = None  # None: the experts run at hidden
    #: tracekit's own: load of the busiest expert rank over the mean (1.0: balanced); see the module docstring
    moe_imbalance: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "moe_layer_freq", layer_freq(self.moe_layer_freq))
        if self.moe_token_dispatcher_type not in DISPATCHERS:
            raise ConfigError(f"moe_token_dispatcher_type must be one of {', '.join(DISPATCHERS)}, not "
                              f"{self.moe_token_dispatcher_type!r}")
        if self.moe_router_score_function not in SCORE_FUNCTIONS:
            raise ConfigError(f"moe_router_score_function must be one of {', '.join(SCORE_FUNCTIONS)}, not "
                              f"{self.moe_router_score_function!r}")
        if self.moe_flex_dispatcher_backend not in FLEX_BACKENDS:
            raise ConfigError(f"moe_flex_dispatcher_backend must be one of {', '.join(FLEX_BACKENDS)}, not "
                              f"{self.moe_flex_dispatcher_backend!r}")
        if self.moe_latent_size is not None and self.moe_latent_size <= 0:
            raise ConfigError("MoE latent projection dimension has to be greater than zero.")
        if self.moe_imbalance < 1.0:
            raise ConfigError(f"moe_imbalance is the busiest expert rank's load over the mean: ≥ 1, not "
                              f"{self.moe_imbalance}")

    # -- derived (given the model's TrainingConfig) ----------------------------------------------------------
    def etp(self, tp: int) -> int:
        return self.expert_tensor_parallel_size or tp

    def ffn(self, ffn_hidden_size: int) -> int:
        return self.moe_ffn_hidden_size or ffn_hidden_size

    def expert_width(self, hidden_size: int) -> int:
        """The width the tokens are dispatched and the experts computed at: the latent size, else hidden."""
        return self.moe_latent_size or hidden_size

    @property
    def ep(self) -> int:
        return self.expert_model_parallel_size

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.ep

    @property
    def dispatcher(self) -> str:
        """`alltoall`, `allgather`, or the flex dispatcher's fused kernels (`deepep` / `hybridep`)."""
        if self.moe_enable_deepep:
            return "deepep"
        if self.moe_token_dispatcher_type == "flex":
            return self.moe_flex_dispatcher_backend
        return self.moe_token_dispatcher_type

    def expert_dp(self, world: int, pp: int, tp: int) -> int:
        return world // (pp * self.etp(tp) * self.ep)

    def pattern(self, num_layers: int) -> tuple[int, ...]:
        """1 for an MoE layer, 0 for a dense one, per layer (Megatron's `moe_layer_freq` rule)."""
        return _pattern(self.moe_layer_freq, num_layers)

    def load_factor(self) -> float:
        """Tokens the busiest expert computes over the balanced mean: forced balance 1, a padded capacity exactly
        the capacity factor, a capacity cap min(imbalance, factor), else the stated imbalance."""
        if self.moe_router_force_load_balancing:
            return 1.0
        cf = self.moe_expert_capacity_factor
        if cf is not None and cf > 0:
            return cf if self.moe_pad_expert_input_to_capacity else min(self.moe_imbalance, cf)
        return self.moe_imbalance

    def validate(self, config) -> None:
        """ConfigError naming the first way Megatron would refuse these settings with `config` (a TrainingConfig)."""
        c = config
        if self.num_experts < 1:
            raise ConfigError(f"num_experts must be ≥ 1, got {self.num_experts}")
        if not 1 <= self.moe_router_topk <= self.num_experts:
            raise ConfigError(f"moe_router_topk {self.moe_router_topk} must be between 1 and num_experts "
                              f"{self.num_experts}")
        if self.num_experts % self.ep:
            raise ConfigError(f"num_experts {self.num_experts} is not divisible by expert_model_parallel_size "
                              f"{self.ep}")
        etp = self.etp(c.tp)
        if c.extra.get("use_tp_pp_dp_mapping") and c.pp > 1 and etp * self.ep != c.tp * c.cp:
            raise ConfigError("Megatron refuses --use-tp-pp-dp-mapping with a pipeline when the expert layers' "
                              "data-parallel size differs from the attention layers' (expert_tensor_parallel_size·"
                              f"expert_model_parallel_size {etp}·{self.ep} ≠ tp·cp {c.tp}·{c.cp})")
        if (c.world_size // c.pp) % (etp * self.ep):
            raise ConfigError(f"the {c.world_size // c.pp} GPUs of a pipeline stage are not divisible by "
                              f"expert_tensor_parallel_size·expert_model_parallel_size = {etp}·{self.ep}")
        if self.ffn(c.ffn_hidden_size) % etp:
            raise ConfigError(f"moe_ffn_hidden_size {self.ffn(c.ffn_hidden_size)} is not divisible by "
                              f"expert_tensor_parallel_size {etp}")
        if isinstance(self.moe_layer_freq, tuple) and len(self.moe_layer_freq) != c.num_layers:
            raise ConfigError(f"moe_layer_freq gives {len(self.moe_layer_freq)} layers, the model has "
                              f"{c.num_layers}")
        if (self.ep > 1 or etp > 1) and c.tp > 1 and not c.sequence_parallel:
            raise ConfigError("Megatron requires sequence_parallel with MoE when tensor_model_parallel_size > 1")
        if self.moe_latent_size and self.moe_shared_expert_overlap:
            raise ConfigError("Shared expert overlap with MoE latent projections is not supported during training. "
                              "Disable moe_shared_expert_overlap.")
        groups, group_topk = self.moe_router_num_groups, self.moe_router_group_topk
        if groups and (self.num_experts % groups or not group_topk or group_topk > groups):
            raise ConfigError(f"group-limited routing needs num_experts divisible by moe_router_num_groups "
                              f"({self.num_experts} / {groups}) and 1 ≤ moe_router_group_topk ≤ groups")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if isinstance(data["moe_layer_freq"], tuple):
            data["moe_layer_freq"] = list(data["moe_layer_freq"])
        return data


FIELDS = tuple(f.name for f in dataclasses.fields(MoESettings))
#: Names published tables use for these settings.
ALIASES = {"ep": "expert_model_parallel_size", "etp": "expert_tensor_parallel_size",
           "moe_topk": "moe_router_topk", "experts": "num_experts", "num_moe_experts": "num_experts"}


@lru_cache(maxsize=256)
def _pattern(freq: int | tuple[int, ...], num_layers: int) -> tuple[int, ...]:
    if isinstance(freq, int):
        return tuple(1 if i % freq == 0 else 0 for i in range(num_layers))
    return tuple(freq)


def layer_freq(value: Any) -> int | tuple[int, ...]:
    """`moe_layer_freq` as Megatron reads it: an integer, or a 0/1 list (a Python list expression such as
    `([0]*3+[1]*58)` or `[1,0,1]`, evaluated here without running code)."""
    if isinstance(value, bool):
        raise ConfigError(f"moe_layer_freq must be an integer or a 0/1 list, not {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ConfigError(f"moe_layer_freq must be ≥ 1, not {value}")
        return value
    if isinstance(value, (list, tuple)):
        items = tuple(int(v) for v in value)
    else:
        text = str(value).strip()
        try:
            return layer_freq(int(text))
        except ValueError:
            pass
        try:
            items = tuple(int(v) for v in _list_expression(ast.parse(text, mode="eval").body))
        except (SyntaxError, ValueError, TypeError) as exc:
            raise ConfigError(f"moe_layer_freq {value!r} is neither an integer nor a list such as "
                              f"'([0]*3+[1]*58)' ({exc})") from exc
    if any(v not in (0, 1) for v in items):
        raise ConfigError(f"moe_layer_freq's pattern holds 0 (dense) and 1 (MoE) only, not {list(items)}")
    return items


def _list_expression(node: ast.AST) -> list[int]:
    """A list expression of integer literals, `*` by an integer and `+` (what Megatron's `--moe-layer-freq` holds)."""
    if isinstance(node, ast.List | ast.Tuple):
        return [_integer(e) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _list_expression(node.left) + _list_expression(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        if isinstance(node.right, ast.Constant):
            return _list_expression(node.left) * _integer(node.right)
        return _list_expression(node.right) * _integer(node.left)
    raise ValueError("only lists of 0/1, + and * are read")


def _integer(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    raise ValueError("only integer literals are read")


def first_k_dense(k: int, num_layers: int) -> tuple[int, ...]:
    """The pattern of a model whose first k layers are dense (DeepSeek's `first_k_dense_replace`)."""
    return tuple([0] * k + [1] * (num_layers - k))
