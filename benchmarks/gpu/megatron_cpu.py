"""The GPU kit's Megatron runs checked on a CPU before a GPU is at hand: each run's flags through Megatron's own
argument parser and checks, its model built as `pretrain_gpt.py` builds it (`gpt_builders.gpt_builder`) with
`--use-cpu-initialization`, and one forward and backward on a one-rank gloo group.

A flag set that stops Megatron at its argument checks, at model construction or at the first forward (the local
implementation's persistent LayerNorm, fused softmax and RoPE kernels: what the first harvest paid for on the H200)
stops here in seconds. The model keeps the run's features (`configs.Run.features`: layer implementation,
normalization, activation, attention, MoE, recompute) and its bf16 (Megatron's fused softmax is taken for half
inputs only) at a CPU's size (`TINY`), wrapped as Megatron's `get_model` wraps it (`Float16Module`).

    PYTHONPATH=.:MEGATRON_TREE:SITE python benchmarks/gpu/megatron_cpu.py [RUN ...] [--without FLAG ...]

`--without FLAG` takes a flag out of every run's features first: what Megatron does without it.

Megatron-core's import chain needs triton and einops; the snapshot is written for Python ≥ 3.12 (`typing.override`
is taken from typing_extensions below it). Three things assume a GPU and are stood in for, in this process only:
`torch.cuda.current_device()` (the global memory buffer of the unfused attention allocates on it) answers "cpu",
the CUDA RNG state tracker forks nothing, and activation recompute's save and restore of the CUDA RNG state around
each checkpointed layer takes the CPU's state and restores none. Prints one JSON line per run: {"run", "ok",
"stage", "error", "parameters", "loss"}; exit code 1 when any run failed.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import time
import typing
import warnings
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu import configs  # noqa: E402

#: The size every run is built at on a CPU (its features kept).
TINY = ("--num-layers 2 --hidden-size 128 --num-attention-heads 16 --ffn-hidden-size 256 --seq-length 32 "
        "--max-position-embeddings 32 --micro-batch-size 2 --global-batch-size 2 --vocab-size 128 --train-iters 1")
#: Flags the CPU check adds or takes out: CPU initialization; fp32 instead of bf16.
CPU_ONLY = "--use-cpu-initialization --no-bias-dropout-fusion"


class _NoForkTracker:
    """Stands in for Megatron's CUDA RNG tracker on a CPU: one generator, forks are no-ops."""

    def add(self, *args, **kwargs) -> None: ...
    def get_states(self) -> dict: return {}
    def set_states(self, states) -> None: ...
    def is_initialized(self) -> bool: return True
    def reset(self) -> None: ...

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng"):
        yield


def cpu_flags(run: configs.Run) -> list[str]:
    """The run's flags at the CPU's size: its features, Megatron's common flags less bf16, `TINY`, `CPU_ONLY`."""
    common = shlex.split(configs.COMMON)
    drop_values = {"--vocab-size"}
    kept, skip = [], False
    for flag in common:
        if skip:
            skip = False
            continue
        if flag in drop_values:
            skip = True
            continue
        kept.append(flag)
    return kept + shlex.split(run.features) + shlex.split(TINY) + shlex.split(CPU_ONLY)


def check_run(run: configs.Run) -> dict:
    """Parse, build and step one run's model on this CPU; what happened, by stage."""
    import torch
    from megatron.core import parallel_state  # type: ignore[import-not-found]
    from megatron.training import arguments, global_vars  # type: ignore[import-not-found]

    result: dict = {"run": run.name, "ok": False, "stage": "arguments"}
    saved = sys.argv
    try:
        sys.argv = ["pretrain_gpt.py", *cpu_flags(run)]
        args = arguments.parse_args()
        arguments.validate_args(args, {})
        args.padded_vocab_size = args.vocab_size
        global_vars.set_args(args)
        result["stage"] = "model"
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(1, 1)
        from gpt_builders import gpt_builder  # type: ignore[import-not-found]

        torch.manual_seed(1)
        model = gpt_builder(args, True, True)
        if args.bf16 or args.fp16:  # as Megatron's get_model wraps it: every parameter in the half dtype
            from megatron.core.transformer.module import Float16Module  # type: ignore[import-not-found]

            model = Float16Module(model.config, model)
        result["parameters"] = sum(p.numel() for p in model.parameters())
        result["stage"] = "forward"
        tokens = torch.randint(0, args.vocab_size, (args.micro_batch_size, args.seq_length))
        positions = torch.arange(args.seq_length).unsqueeze(0).expand(args.micro_batch_size, -1)
        mask = torch.tril(torch.ones(1, 1, args.seq_length, args.seq_length)) < 0.5
        start = time.perf_counter()
        loss = model(tokens, positions, mask, labels=tokens)
        result["stage"] = "backward"
        loss.float().mean().backward()
        result.update(ok=True, stage="done", loss=round(float(loss.float().mean()), 4),
                      seconds=round(time.perf_counter() - start, 2))
    except BaseException as exc:  # noqa: BLE001 - SystemExit from Megatron's argparse too: report the stage
        result["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    finally:
        sys.argv = saved
        with contextlib.suppress(Exception):
            global_vars.unset_global_variables()
    return result


def main(argv: list[str]) -> int:
    import argparse

    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("runs", nargs="*", choices=[[], *configs.BY_NAME], metavar="RUN")
    cli.add_argument("--without", action="append", default=[], help="a flag taken out of every run's features")
    args = cli.parse_args(argv)
    runs = [configs.BY_NAME[n] for n in args.runs] if args.runs else [r for r in configs.RUNS if not r.te]
    if args.without:
        runs = [replace(r, features=" ".join(f for f in shlex.split(r.features) if f not in args.without))
                for r in runs]
    return check_runs(runs)


def check_runs(runs: list[configs.Run]) -> int:
    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override  # type: ignore[attr-defined]
    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    import megatron.core.tensor_parallel.random as megatron_random  # type: ignore[import-not-found]

    megatron_random._CUDA_RNG_STATE_TRACKER = _NoForkTracker()
    megatron_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    # activation recompute saves and restores the CUDA RNG state around each checkpointed layer: the CPU's stands in
    megatron_random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    megatron_random._set_cuda_rng_state = lambda *args, **kwargs: None
    failed = 0
    for run in runs:
        result = check_run(run)
        failed += not result["ok"]
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
