"""Sharded data parallelism for the reference trainer: PyTorch FSDP2 (`fully_shard`) as Megatron's
`--use-torch-fsdp2` and torchtitan apply it — one unit per transformer layer, then the root (embedding, final norm,
output layer), over the data-parallel ranks; parameters kept in fp32 and cast for compute (bf16/fp16 runs), gradients
reduce-scattered in fp32, each unit's parameters freed after forward unless `--torch-fsdp2-no-reshard-after-forward`.
FSDP2 names its work in the trace: `FSDP::all_gather (layers.0)`, `FSDP::post_backward_reduce (layers.0)`, ..."""
from __future__ import annotations

import torch
from torch import nn

from .parallel import Topology


def fully_shard_model(model: nn.Module, layers: nn.ModuleList, topo: Topology, compute_dtype: torch.dtype,
                      reshard_after_forward: bool) -> None:
    """Shard `model` in place over the data-parallel ranks (tp = pp = 1: the whole world)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(topo.device.type, (topo.dp,), mesh_dim_names=("dp_shard",))
    policy = MixedPrecisionPolicy() if compute_dtype == torch.float32 else \
        MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)  # the root keeps its parameters from forward to backward
