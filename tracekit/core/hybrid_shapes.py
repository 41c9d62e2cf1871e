"""The shapes of a hybrid model's mixers as Megatron-core builds them (`MambaMixer` as `hybrid_stack_spec` builds it,
`GatedDeltaNet`, the DSA indexer), from `tracekit.core.hybrid`'s settings, with the constants of the spec no flag
sets."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

#: MambaMixer's arguments as `hybrid_stack_spec` leaves them (no flag sets them in this snapshot).
MAMBA_D_CONV, MAMBA_EXPAND, MAMBA_CHUNK_SIZE = 4, 2, 128
#: The chunk of FLA's chunked gated delta rule (GatedDeltaNet.chunk_size).
GDN_CHUNK_SIZE = 64
VARIANTS = ("gdn", "gdn2", "dsa")
DSA_BACKENDS = ("none", "tilelang", "cudnn")
SSM_STATE_DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class MambaShape:
    """A Mamba2 mixer's sizes as `MambaMixer.__init__` derives them (whole layer, before tensor parallelism)."""

    hidden: int
    d_inner: int
    heads: int
    head_dim: int
    state: int
    groups: int
    d_conv: int = MAMBA_D_CONV
    chunk: int = MAMBA_CHUNK_SIZE

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise convolution: x, B and C."""
        return self.d_inner + 2 * self.groups * self.state

    @property
    def in_proj_dim(self) -> int:
        """The in-projection's output: z, x, B, C and dt."""
        return 2 * self.d_inner + 2 * self.groups * self.state + self.heads

    def check_split(self, tp: int, cp: int = 1) -> None:
        """ConfigError with Megatron's reason where MambaMixer refuses to split this mixer over `tp` tensor- and `cp`
        context-parallel ranks."""
        if self.heads % tp:
            raise ConfigError(f"nheads must be evenly divisble by tp_size (mamba heads {self.heads}, tp {tp})")
        if self.groups % tp:
            raise ConfigError(f"ngroups must be evenly divisible by tp_size (mamba groups {self.groups}, tp {tp})")
        if self.heads % self.groups:
            raise ConfigError(f"nheads must be evenly divisible by ngroups (mamba heads {self.heads}, groups "
                              f"{self.groups})")
        heads_t, groups_t = self.heads // tp, self.groups // tp
        if heads_t % cp:
            raise ConfigError(f"nheads must be evenly divisible by tp_size * cp_size (mamba heads {self.heads}, "
                              f"tp {tp}, cp {cp})")
        if groups_t < cp and cp % groups_t:
            raise ConfigError(f"cp_size must be evenly divisible by ngroups/tp_size (cp {cp}, groups/tp {groups_t})")
        if groups_t >= cp and groups_t % cp:
            raise ConfigError(f"ngroups must be evenly divisible by tp_size * cp_size (mamba groups {self.groups}, "
                              f"tp {tp}, cp {cp})")


@dataclass(frozen=True)
class GDNShape:
    """A Gated DeltaNet layer's sizes (`_GDNBase.__init__`), whole layer."""

    hidden: int
    key_heads: int
    value_heads: int
    key_dim: int  # per head
    value_dim: int  # per head
    conv_kernel: int
    variant: str = "gdn"  # gdn | gdn2
    chunk: int = GDN_CHUNK_SIZE

    @property
    def qk_dim(self) -> int:
        return self.key_heads * self.key_dim

    @property
    def v_dim(self) -> int:
        return self.value_heads * self.value_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.qk_dim + self.v_dim

    @property
    def in_proj_dim(self) -> int:
        """q, k, v, the output gate z, then GDN's β and α per value head, or GDN2's f, b (key width) and w."""
        extra = 2 * self.value_heads if self.variant == "gdn" else 2 * self.qk_dim + self.v_dim
        return 2 * self.qk_dim + 2 * self.v_dim + extra

    def check_split(self, tp: int, cp: int = 1) -> None:
        """ConfigError with Megatron's reason where GatedDeltaNet refuses to split this layer over `tp` tensor- and
        `cp` context-parallel ranks."""
        if self.value_heads % self.key_heads:
            raise ConfigError(f"linear_num_value_heads ({self.value_heads}) must be a multiple of "
                              f"linear_num_key_heads ({self.key_heads}).")
        for name, heads in (("linear_num_key_heads", self.key_heads), ("linear_num_value_heads", self.value_heads)):
            if heads % (tp * cp):
                raise ConfigError(f"self.{name}={heads} must be a multiple of "
                                  f"(self.tensor_model_parallel_size={tp} * self.context_parallel_size={cp}).")


@dataclass(frozen=True)
class DSAShape:
    """The DSA indexer's sizes (`DSAIndexer.__init__`)."""

    hidden: int
    q_lora_rank: int  # the indexer's query input: MLA's q_lora_rank, or hidden without a query LoRA
    heads: int
    head_dim: int
    topk: int
    rope_dim: int
    topk_freq: int = 1
    skip_topk_offset: int = 0
    loss_coeff: float = 0.0
    sparse_loss: bool = False
    kernel_backend: str = "none"
    rotate: bool = True  # the Hadamard rotation of q and k (--disable-dsa-indexer-rotate-activation: off)
    relu: bool = True  # ReLU on the scores before the heads' weighted sum (--disable-dsa-indexer-scoring-relu: off)
    k_norm_fp32: bool = False  # k's LayerNorm in fp32 (--dsa-indexer-k-norm-fp32)
