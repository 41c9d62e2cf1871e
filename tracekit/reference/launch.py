"""Command lines that launch the reference trainer (importing this module does not import torch)."""
from __future__ import annotations

import sys


def megatron_flags(**arguments) -> list[str]:
    """`num_layers=2, bf16=True` → `--num-layers 2 --bf16` (False/None are left out; lists become several words)."""
    flags: list[str] = []
    for name, value in arguments.items():
        if value is None or value is False:
            continue
        flags.append("--" + name.replace("_", "-"))
        if isinstance(value, (list, tuple)):
            flags.extend(str(v) for v in value)
        elif value is not True:
            flags.append(str(value))
    return flags


def launch_argv(nproc: int = 2, **arguments) -> list[str]:
    """`python -m torch.distributed.run --standalone --nproc-per-node N -m tracekit.reference <Megatron flags>`.

    Example: launch_argv(2, num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
    tensor_model_parallel_size=2, train_iters=8, log_interval=1)
    """
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "-m", "tracekit.reference", *megatron_flags(**arguments)]
