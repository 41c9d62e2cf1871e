"""Probe: does Megatron-core's GPT model train on CPU with gloo (what it would take to use real Megatron layers in the
CPU capture loop instead of tracekit's reference trainer)?

Run one process per rank (world size = tp), from a Megatron-LM source tree whose import chain works here (it needs
torch and triton; the snapshot targets Python ≥ 3.12, so on 3.11 `typing.override` is taken from typing_extensions):

    pip install --target /tmp/triton triton
    tar -xzf ../shared/vendor/megatron-lm-<commit>.tar.gz -C /tmp/meg
    for r in 0 1; do RANK=$r WORLD_SIZE=2 PYTHONPATH=/tmp/meg/megatron-lm:/tmp/triton \
        .venv/bin/python tools/megatron_core_cpu.py --tp 2 & done; wait

It builds a 2-layer GPTModel with the local (no Transformer Engine) layer spec, `use_cpu_initialization`, runs one
forward and backward, and prints what worked. Two things in Megatron-core assume a GPU and are replaced here, in this
process only: `torch.cuda.current_device()` (the global memory buffer of the unfused attention allocates on it) is
made to answer "cpu", and the CUDA RNG state tracker (`model_parallel_cuda_manual_seed`, `get_cuda_rng_tracker().fork()`
around dropout and initialisation) becomes a tracker that forks nothing. `--sequence-parallel` shows the next limit:
the local spec's torch LayerNorm refuses sequence parallelism (it needs Transformer Engine or Apex).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import time
import typing
import warnings


class _NoForkTracker:
    """Stands in for Megatron's CUDA RNG tracker on CPU: one generator, forks are no-ops."""

    def add(self, *args, **kwargs): ...
    def get_states(self): return {}
    def set_states(self, states): ...
    def is_initialized(self): return True
    def reset(self): ...

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng"):
        yield


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--tp", type=int, default=1)
    cli.add_argument("--sequence-parallel", action="store_true")
    args = cli.parse_args()
    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override
    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29631")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.current_device = lambda: "cpu"
    import megatron.core.tensor_parallel.random as megatron_random
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    megatron_random._CUDA_RNG_STATE_TRACKER = _NoForkTracker()
    megatron_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    torch.manual_seed(1)
    parallel_state.initialize_model_parallel(args.tp, 1)
    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True,
                               tensor_model_parallel_size=args.tp, sequence_parallel=args.sequence_parallel,
                               params_dtype=torch.float32, pipeline_dtype=torch.float32)
    try:
        model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=128,
                         max_sequence_length=32)
    except AssertionError as exc:
        print(f"rank {rank}: model construction refused: {exc}")
        return
    tokens = torch.randint(0, 128, (2, 32))
    positions = torch.arange(32).unsqueeze(0).expand(2, -1)
    mask = torch.tril(torch.ones(1, 1, 32, 32)) < 0.5
    start = time.perf_counter()
    loss = model(tokens, positions, mask, labels=tokens)
    loss.float().mean().backward()
    print(f"rank {rank}: tp={args.tp} forward+backward ran on CPU over gloo in {time.perf_counter() - start:.2f} s "
          f"({sum(p.numel() for p in model.parameters())} parameters on this rank)")


if __name__ == "__main__":
    main()
