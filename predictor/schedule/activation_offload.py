"""Megatron-core's fine-grained activation offloading (`--fine-grained-activation-offloading --offload-modules ...`)
as time: what each offloaded module's group copies to the host and back, over the GPU's host link, and how much of it
the compute does not hide. Read in Megatron-core's `megatron/core/pipeline_parallel/fine_grained_activation_offload.py`
and the layers that open the groups (`transformer_layer.py`, `multi_latent_attention.py`, the MoE experts):

- A group is one module call of one layer (`attn_norm`, `qkv_linear`, `core_attn`, `attn_proj`, `mlp_norm`,
  `expert_fc1`, `moe_act`, `fused_group_mlp`): every tensor autograd saves for the backward inside it of at least
  `--min-offloaded-tensor-size` elements (1 Mi by default) is copied to pinned host memory (`group_bytes`).
- The copy to the host (D2H) is issued on a stream of its own when the group's forward ends
  (`on_group_commit_forward`); nothing on the compute stream waits for it in the forward, so it runs beside the
  chunk's compute and costs time only where the link is slower than that compute (`forward_exposed_us`).
- The copy back (H2D), on another stream, is issued when the backward of the group that follows it in the forward
  ends (`on_group_start_backward` → `bulk_reload`), and the compute stream waits for it where the group's own backward
  starts (`on_group_commit_backward` → `wait_reload_event`). Only the backward of the ops *between* the two groups
  runs beside it: exposed = max(0, copy − that compute) per group (`backward_exposed_us`); consecutive groups
  (core attention after the QKV projections) hide nothing.
- Both directions use the GPU's own host link (PCIe x16 on DGX nodes, NVLink-C2C on Grace systems:
  `host_link_gbs` of `tracekit/data/hardware.json`), full duplex, at `LINK_EFFICIENCY` of its rate — and the host's
  memory, which every GPU of the node offloading at once shares (`tracekit/data/host_cpus.json`: a DGX H100's two
  Xeon sockets give its eight GPUs 76.8 GB/s each, less than one Gen5 x16 link's two directions).
- `--activation-offload-fraction` offloads that fraction of the eligible groups (Megatron drops the later ones);
  here the bytes are scaled by it.

Not modelled: Megatron keeps one group of each name on the GPU per iteration (the last one the backward meets,
`post_warmup_callback`), and the host time of the saved-tensor hooks. The memory the offload frees is in
`predictor.memory.stages`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from predictor.layers.block import Block
from predictor.layers.decoder import blocks_named
from tracekit.core.config import TrainingConfig
from tracekit.core.hardware import hardware_spec
from tracekit.core.hosts import host_memory_gbs
from tracekit.core.megatron_arguments import list_words

if TYPE_CHECKING:
    from predictor.ir.ops import OpUse

#: Megatron's `--min-offloaded-tensor-size` default (elements): smaller saved tensors stay on the GPU.
MIN_OFFLOADED_ELEMENTS = 1024 * 1024
#: Share of a host link's rate a large pinned-memory copy reaches: PCIe's transaction-layer headers and flow control
#: take about a fifth of a Gen4/Gen5 x16 link (the same figure `predictor.costs.physics.collectives` uses for PCIe).
LINK_EFFICIENCY = 0.8
#: Which ops of the graph (by their Megatron module path) run inside each offload group.
GROUP_OPS: dict[str, tuple[str, ...]] = {
    "attn_norm": ("input_layernorm",),
    "qkv_linear": ("self_attention.linear_qkv", "self_attention.linear_q", "self_attention.linear_kv",
                   "self_attention.q_layernorm", "self_attention.kv_layernorm", "self_attention.rotary"),
    "core_attn": ("self_attention.core_attention",),
    "attn_proj": ("self_attention.linear_proj",),
    "mlp_norm": ("pre_mlp_layernorm",),
    "expert_fc1": ("mlp.experts.linear_fc1",),
    "moe_act": ("mlp.experts.activation",),
    "fused_group_mlp": ("mlp.experts.",),
}


def offload_modules(c: TrainingConfig) -> tuple[str, ...]:
    """The modules whose groups are offloaded (`--offload-modules`; none without
    `--fine-grained-activation-offloading`)."""
    if not c.extra.get("fine_grained_activation_offloading"):
        return ()
    return list_words(c.extra.get("offload_modules")) or ()


def _fraction(c: TrainingConfig) -> float:
    value = c.extra.get("activation_offload_fraction")
    return 1.0 if value is None else min(1.0, max(0.0, float(value)))


def _min_elements(c: TrainingConfig) -> float:
    value = c.extra.get("min_offloaded_tensor_size")
    return float(MIN_OFFLOADED_ELEMENTS if value is None else value)


def group_tensors(c: TrainingConfig, blocks: tuple[Block, ...]) -> dict[str, list[float]]:
    """Elements of each tensor every offloadable module of a layer of `blocks` saves for its backward, per layer and
    micro-batch on one GPU: its blocks' (`predictor.layers.block.Block.offload_tensors`)."""
    out: dict[str, list[float]] = {}
    for block in blocks:
        out.update(block.offload_tensors(c))
    return out


def group_bytes(c: TrainingConfig, blocks: tuple[Block, ...]) -> dict[str, float]:
    """Bytes each offloaded module's group copies to the host (and back) per layer and micro-batch on one GPU: its
    saved tensors of at least `--min-offloaded-tensor-size` elements, in the training dtype, times
    `--activation-offload-fraction`."""
    modules = offload_modules(c)
    if not modules:
        return {}
    smallest, share = _min_elements(c), _fraction(c)
    tensors = group_tensors(c, blocks)
    return {m: share * c.dtype_bytes * sum(n for n in tensors[m] if n >= smallest)
            for m in modules if m in tensors}


def link_bytes_per_us(hardware: str) -> float:
    """Achievable bytes per µs of one direction of the copies: the GPU's host link (`host_link_gbs`), or, where the
    node's host memory is the narrower, half of this GPU's share of it (every GPU of the node offloads at once, and
    the copies out of one micro-batch run while those back of another do), both at `LINK_EFFICIENCY`; 0 when the
    datasheet has no host link."""
    spec = hardware_spec(hardware)
    if spec is None or not spec.host_link_gbs:
        return 0.0
    memory = host_memory_gbs(spec.name)
    gbs = min(spec.host_link_gbs, memory / 2) if memory else spec.host_link_gbs
    return gbs * 1e3 * LINK_EFFICIENCY


def group_of(name: str) -> str | None:
    """The offload group an op (by its module path) runs inside; None between groups."""
    for group, prefixes in GROUP_OPS.items():
        if group != "fused_group_mlp" and name.startswith(prefixes):
            return group
    return None


@dataclass(frozen=True)
class LayerCopies:
    """One layer's offload traffic per micro-batch: bytes per group, and the link's rate (bytes/µs)."""

    groups: dict[str, float]
    rate: float

    def copy_us(self, group: str) -> float:
        return self.groups.get(group, 0.0) / self.rate if self.rate > 0 else 0.0

    @property
    def total_us(self) -> float:
        return sum(self.copy_us(g) for g in self.groups)


def backward_exposed_us(ops: list[tuple[str, float]], copies: LayerCopies) -> float:
    """The compute stream's wait for the copies back of one layer's backward. `ops`: (module path, µs) of the
    layer's backward in order. A group's copy back starts when the backward of the group after it ends and is waited
    for where its own backward starts: the ops in between hide that much of it (module docstring)."""
    fused = "fused_group_mlp" in copies.groups
    exposed = between = 0.0
    current: str | None = None
    for name, us in ops:
        group = "fused_group_mlp" if fused and name.startswith(GROUP_OPS["fused_group_mlp"]) else group_of(name)
        if group is not None and group != current and group in copies.groups:
            exposed += max(0.0, copies.copy_us(group) - between)
            between = 0.0
        if group is None or group not in copies.groups:
            between += us
        current = group
    return exposed


def forward_exposed_us(copies_us: float, compute_us: float) -> float:
    """What the copies to the host of one chunk's forward add: their stream runs beside the compute, so only the
    part beyond the chunk's forward and backward work on the GPU (module docstring)."""
    return max(0.0, copies_us - compute_us)


def segment_copies(c: TrainingConfig, hardware: str, bwd: list[OpUse], dur) -> tuple[float, float]:
    """(µs the copies to the host take, µs the backward waits for the copies back) of one micro-batch of a segment,
    whose backward ops are `bwd` (per-layer ops carry their block and layer count) with µs per spec `dur`; (0, 0)
    without offloading or without a known host link."""
    rate = link_bytes_per_us(hardware)
    if not offload_modules(c) or rate <= 0:
        return 0.0, 0.0
    per_kind: dict[tuple[Block, ...], LayerCopies] = {}
    copies = waits = 0.0
    runs: list[tuple[str, int, list[tuple[str, float]]]] = []
    for op in bwd:
        if not op.per_layer:
            continue
        if not runs or runs[-1][0] != op.block or runs[-1][1] != op.count:
            runs.append((op.block, op.count, []))
        runs[-1][2].append(("" if op.recompute else op.name, float(dur[op.spec])))  # a replay is no group's
    for block, count, ops in runs:
        blocks = blocks_named(block)
        if blocks not in per_kind:
            per_kind[blocks] = LayerCopies(group_bytes(c, blocks), rate)
        layer = per_kind[blocks]
        copies += layer.total_us * count
        waits += backward_exposed_us(ops, layer) * count
    return copies, waits
