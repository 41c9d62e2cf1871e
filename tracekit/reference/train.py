"""The training loop: Megatron's iteration (1F1B forward/backward, gradient sync, Adam on fp32 main weights), its
log lines, and its PyTorch-profiler integration (same schedule, same trace locations)."""
from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from tracekit.core.hardware import cpu_hardware_id

from .arguments import arguments_block, parse_args
from .fsdp import fully_shard_model
from .model import GPTStage
from .parallel import Topology, init_topology
from .schedule import P2P, one_f_one_b

DTYPES = {"torch.bfloat16": torch.bfloat16, "torch.float16": torch.float16, "torch.float32": torch.float32}


def _all_reduce_grads(params: list[torch.nn.Parameter], group, scale: float = 1.0, fp32: bool = False,
                      check: bool = False) -> None:
    """Sum the (pre-scaled) gradients of `params` over `group` in one flat buffer, as Megatron's grad buffer does;
    `fp32` reduces bf16 gradients in fp32 (Megatron's accumulate_allreduce_grads_in_fp32, on for bf16); `check`: the
    buffer's norm is checked for NaN and then for Inf on the host first, on one rank too (Megatron's check_grads)."""
    grads = [p.grad for p in params if p.grad is not None]
    alone = dist.get_world_size(group) == 1
    if not grads or (alone and not check):
        return
    flat = _flatten_dense_tensors(grads)
    if fp32:
        flat = flat.float()
    if check:
        norm = torch.linalg.vector_norm(flat)
        if bool(torch.isnan(norm)) or bool(torch.isinf(norm)):
            raise RuntimeError("found NaN or Inf in local grad norm before data-parallel communication collective")
        if alone:
            return
    if scale != 1.0:
        flat.mul_(scale)
    dist.all_reduce(flat, group=group)
    for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(synced)


class MixedPrecisionAdam:
    """Adam on fp32 copies of fp16/bf16 weights (Megatron's Float16Optimizer without loss scaling)."""

    def __init__(self, params: list[torch.nn.Parameter], args):
        self.params = params
        self.main = [p.detach().float().clone().requires_grad_() for p in params]
        self.adam = torch.optim.Adam(self.main, lr=args.lr, betas=(args.adam_beta1, args.adam_beta2),
                                     weight_decay=args.weight_decay)

    def step(self) -> None:
        for param, main in zip(self.params, self.main):
            main.grad = param.grad.float() if param.grad is not None else None
        self.adam.step()
        with torch.no_grad():
            for param, main in zip(self.params, self.main):
                param.copy_(main)


def _profiler(args, topo: Topology):
    """Megatron's torch.profiler set-up, or None when this rank is not profiled."""
    if not (args.profile and args.use_pytorch_profiler and topo.rank in args.profile_ranks):
        return None
    from torch.profiler import (
        ProfilerActivity,
        profile,
        schedule,
        tensorboard_trace_handler,
    )

    if args.trace_layout == "torch_profile":
        path = os.path.join(args.tensorboard_dir, "..", "torch_profile", f"rank-{topo.rank}.json.gz")

        def handler(prof):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            prof.export_chrome_trace(path)

        record_shapes = args.pytorch_profiler_collect_shapes
    else:
        handler, record_shapes = tensorboard_trace_handler(args.tensorboard_dir), True
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if topo.device.type == "cuda" else [])
    start, end = args.profile_step_start, args.profile_step_end
    prof = profile(
        activities=activities,
        schedule=schedule(wait=max(start - 1, 0), warmup=1 if start > 0 else 0, active=end - start, repeat=1),
        on_trace_ready=handler,
        record_shapes=record_shapes,
    )
    if topo.device.type == "cpu":  # tracekit's convention: CPU traces name their CPU (torch does not)
        prof.preset_metadata_json("cpu_model", json.dumps(cpu_hardware_id().removeprefix("cpu-")))
    return prof


def _batch(args, topo: Topology, iteration: int, micro: int):
    """Mock data as Megatron's mock dataset gives it: random tokens, labels shifted by one. Samples are numbered
    globally (data-parallel rank r takes micro-batches r·n … r·n + n − 1), so every split sees the same batch."""
    index = topo.dp_rank * args.num_micro_batches + micro
    generator = torch.Generator().manual_seed(args.seed + 7919 * iteration + index)
    tokens = torch.randint(0, args.vocab_size, (args.micro_batch_size, args.seq_length + 1), generator=generator)
    tokens = tokens.to(topo.device)
    return tokens[:, :-1], tokens[:, 1:]


def train(argv: list[str] | None = None) -> int:
    cuda = torch.cuda.is_available()
    args = parse_args(argv, int(os.environ.get("WORLD_SIZE", "1")), cuda)
    nccl = cuda and args.distributed_backend == "nccl"
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}") if nccl else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    topo = init_topology(args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
                         args.distributed_backend, device)
    if topo.rank == 0:
        print(arguments_block(args), flush=True)
    dtype = DTYPES[args.params_dtype]
    torch.manual_seed(args.seed + 100 * topo.pp_rank + topo.tp_rank)  # dropout streams; weights are seeded per layer
    # FSDP keeps fp32 parameters and casts them for compute; otherwise the weights are in the training dtype
    model = GPTStage(args, topo, torch.float32 if args.use_torch_fsdp2 else dtype)
    if args.use_torch_fsdp2:
        fully_shard_model(model, model.layers, topo, dtype, args.torch_fsdp2_reshard_after_forward)
    shared = model.shared_embedding()
    if shared is not None:  # Megatron zeroes the last stage's copy and sums it from the first stage
        with torch.no_grad():
            if topo.last_stage:
                shared.zero_()
            dist.all_reduce(shared.data, group=topo.embedding_group)
    params = [p for p in model.parameters()]
    master = dtype != torch.float32 and not args.use_torch_fsdp2  # FSDP's sharded fp32 parameters are the master
    optimizer = MixedPrecisionAdam(params, args) if master else torch.optim.Adam(
        params, lr=args.lr, betas=(args.adam_beta1, args.adam_beta2), weight_decay=args.weight_decay)
    seq = args.seq_length // topo.tp if args.sequence_parallel else args.seq_length
    p2p = P2P(topo, (seq, args.micro_batch_size, args.hidden_size), dtype)
    sp_params = [p for p in params if getattr(p, "sequence_parallel", False)]
    prof = _profiler(args, topo)
    if prof is not None:
        prof.start()

    dist.barrier()
    interval_start, interval_losses = time.perf_counter(), []
    for iteration in range(args.train_iters):
        if prof is not None:
            prof.step()
        for param in params:
            param.grad = None
        model.train()

        def forward(micro: int, x):
            tokens, labels = _batch(args, topo, iteration, micro)
            return model(x, tokens if topo.first_stage else None, labels if topo.last_stage else None)

        losses = one_f_one_b(topo, p2p, forward, args.num_micro_batches, args.check_for_nan_in_loss_and_grad)
        if sp_params:
            _all_reduce_grads(sp_params, topo.tp_group)
        if shared is not None:
            _all_reduce_grads([shared], topo.embedding_group, fp32=args.accumulate_allreduce_grads_in_fp32)
        if not args.use_torch_fsdp2:  # FSDP reduce-scatters (and averages) each unit's gradients in backward
            _all_reduce_grads(params, topo.dp_group, scale=1.0 / topo.dp, fp32=args.accumulate_allreduce_grads_in_fp32,
                              check=args.check_for_nan_in_loss_and_grad)
        optimizer.step()
        if topo.last_stage:
            loss = torch.tensor([sum(losses) / len(losses)], device=device)
            if topo.dp > 1:
                dist.all_reduce(loss, group=topo.dp_group)
                loss /= topo.dp
            interval_losses.append(float(loss))
        done = iteration + 1
        if done % args.log_interval == 0:
            dist.barrier()
            elapsed = (time.perf_counter() - interval_start) / args.log_interval
            if topo.rank == topo.world_size - 1:
                print(_log_line(args, done, elapsed, sum(interval_losses) / len(interval_losses)), flush=True)
            interval_start, interval_losses = time.perf_counter(), []
    if prof is not None:
        prof.stop()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _log_line(args, iteration: int, elapsed_s: float, loss: float) -> str:
    """Megatron's training_log line."""
    return (
        f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S')}]"
        f" iteration {iteration:8d}/{args.train_iters:8d} |"
        f" consumed samples: {iteration * args.global_batch_size:12d} |"
        f" elapsed time per iteration (ms): {elapsed_s * 1000.0:.1f} |"
        f" learning rate: {args.lr:.6E} |"
        f" global batch size: {args.global_batch_size:5d} |"
        f" lm loss: {loss:.6E} |"
        f" loss scale: 1.0 |"
        f" number of skipped iterations:   0 |"
        f" number of nan iterations:   0 |"
    )


def main() -> None:
    sys.exit(train(sys.argv[1:]))
