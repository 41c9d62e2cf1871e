"""GEMM workspaces: fixed buffers the GEMM libraries take from PyTorch's caching allocator once and keep for the run.

They count in `torch.cuda.memory_allocated()` (what Megatron logs as `mem-allocated-bytes`) from the first GEMM on,
between steps as at the peak. Sizes by what each library documents:

- PyTorch's cuBLAS workspace: one per (cuBLAS handle, stream) pair that runs a GEMM, never freed (PyTorch's CUDA
  semantics notes, "cuBLAS workspaces"). Handles are per thread: the forward runs on the Python thread, the backward
  on autograd's device thread (autograd mechanics), each on the compute stream — two workspaces. Its size is
  `CUBLAS_WORKSPACE_CONFIG` (`:SIZE_KiB:COUNT` pairs, summed: `:4096:8` is 8 × 4 MiB), by default `:4096:8` on
  compute capability ≥ 9 (Hopper, Blackwell) and `:4096:2:16:8` (8.125 MiB) before.
- Transformer Engine's cuBLASLt workspace (`get_workspace`): one, sized as the cuBLAS documentation recommends
  (`cublasSetWorkspace`: 32 MiB on Hopper and later, 4 MiB before; TE adds 256 bytes of scales on Hopper+); with
  userbuffers TP overlap (`--tp-comm-overlap`) three of them in one buffer (one per overlap stream); with grouped
  expert GEMMs (`--moe-grouped-gemm` in TE) one more per cuBLAS stream of its multi-stream workspace (4 streams).
NCCL's buffers are allocated by NCCL itself, outside PyTorch's allocator: not counted here. AMD GPUs (hipBLASLt) and
CPUs: none counted.
"""
from __future__ import annotations

import re

from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError
from tracekit.core.hardware import architecture

MiB = 1 << 20
KiB = 1 << 10
#: PyTorch's default CUBLAS_WORKSPACE_CONFIG by compute capability: ≥ 9 and before.
TORCH_DEFAULT = {True: ":4096:8", False: ":4096:2:16:8"}
#: Transformer Engine's cuBLASLt workspace (cuBLAS's recommendation): Hopper+ and before.
TE_WORKSPACE = {True: 32 * MiB + 256, False: 4 * MiB}
TE_UB_STREAMS = 3  # userbuffers' overlap streams (TE `_NUM_MAX_UB_STREAMS`)
TE_GROUPED_STREAMS = 4  # TE's cuBLAS streams for grouped GEMMs
TORCH_THREADS = 2  # forward (Python thread) and backward (autograd's device thread): one cuBLAS handle each
NVIDIA = {"volta": False, "ampere": False, "hopper": True, "blackwell": True}
_PAIR = re.compile(r":(\d+):(\d+)")


def cublas_config_bytes(text: str) -> int:
    """Bytes of one cuBLAS workspace as CUBLAS_WORKSPACE_CONFIG `text` sizes it (`:4096:8` → 32 MiB)."""
    pairs = _PAIR.findall(text)
    if not pairs or "".join(f":{a}:{b}" for a, b in pairs) != text.strip():
        raise ConfigError(f"CUBLAS_WORKSPACE_CONFIG {text!r} is not ':SIZE_KiB:COUNT' pairs (e.g. ':4096:8')")
    return sum(int(size) * KiB * int(count) for size, count in pairs)


def uses_transformer_engine(c: TrainingConfig) -> bool:
    """Megatron's `--transformer-impl transformer_engine`, or a low-precision recipe (only TE runs one)."""
    return c.extra.get("transformer_impl") == "transformer_engine" or c.recipe.low_precision


def workspace_bytes(c: TrainingConfig, hardware: str | None) -> float:
    """Bytes of GEMM workspaces one GPU keeps (module docstring); 0 without a known NVIDIA GPU."""
    arch = architecture(hardware) if hardware else None
    if arch not in NVIDIA:
        return 0.0
    hopper = NVIDIA[arch]
    config = str(c.extra.get("cublas_workspace_config") or TORCH_DEFAULT[hopper])
    total = TORCH_THREADS * cublas_config_bytes(config)
    if uses_transformer_engine(c):
        te = TE_WORKSPACE[hopper]
        total += te * (TE_UB_STREAMS if c.tp_comm_overlap else 1)
        if c.moe is not None and c.moe.moe_grouped_gemm:
            total += te * TE_GROUPED_STREAMS
    return float(total)
