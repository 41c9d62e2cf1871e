"""The Megatron arguments the reference trainer implements (same names, same defaults), the values Megatron derives
from them (computed by `tracekit.core.config`'s functions, as TrainingConfig computes them), and Megatron's start-up
"arguments" block."""
from __future__ import annotations

import argparse

from tracekit.core.megatron_defaults import (
    data_parallel_size,
    default_ffn_hidden_size,
    default_kv_channels,
    num_microbatches,
    padded_vocab_size,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tracekit.reference",
        description="Small Megatron-style GPT trainer (TP/SP, 1F1B PP, DP) on plain PyTorch, for testing tracekit "
        "without a GPU cluster. Example: torchrun --standalone --nproc-per-node 2 -m tracekit.reference "
        "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 2 "
        "--global-batch-size 4 --tensor-model-parallel-size 2 --train-iters 10 --log-interval 1",
    )
    model = parser.add_argument_group("model")
    model.add_argument("--num-layers", type=int, required=True)
    model.add_argument("--hidden-size", type=int, required=True)
    model.add_argument("--ffn-hidden-size", type=int, default=None)
    model.add_argument("--num-attention-heads", type=int, required=True)
    model.add_argument("--kv-channels", type=int, default=None)
    model.add_argument("--seq-length", type=int, required=True)
    model.add_argument("--max-position-embeddings", type=int, default=None)
    model.add_argument("--vocab-size", type=int, default=50257)
    model.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    model.add_argument("--normalization", choices=("LayerNorm", "RMSNorm"), default="LayerNorm")
    model.add_argument("--swiglu", action="store_true")
    model.add_argument("--disable-bias-linear", dest="add_bias_linear", action="store_false")
    model.add_argument("--position-embedding-type", choices=("learned_absolute",), default="learned_absolute")
    model.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    model.add_argument("--hidden-dropout", type=float, default=0.1)
    model.add_argument("--attention-dropout", type=float, default=0.1)
    model.add_argument("--init-method-std", type=float, default=0.02)
    par = parser.add_argument_group("parallelism and batch")
    par.add_argument("--tensor-model-parallel-size", type=int, default=1)
    par.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    par.add_argument("--sequence-parallel", action="store_true")
    par.add_argument("--micro-batch-size", type=int, default=1)
    par.add_argument("--global-batch-size", type=int, default=None)
    par.add_argument("--use-torch-fsdp2", action="store_true",
                     help="shard parameters, gradients and optimizer state over the data-parallel ranks with "
                     "PyTorch FSDP2 (fully_shard per layer); needs tp = pp = 1")
    par.add_argument("--torch-fsdp2-no-reshard-after-forward", dest="torch_fsdp2_reshard_after_forward",
                     action="store_false", help="with --use-torch-fsdp2: keep each layer's gathered parameters from "
                     "forward to backward (one all-gather per micro-batch instead of two)")
    par.add_argument("--distributed-backend", choices=("nccl", "gloo"), default=None,
                     help="default: nccl when CUDA is available, else gloo")
    train = parser.add_argument_group("training")
    train.add_argument("--train-iters", type=int, required=True)
    train.add_argument("--lr", type=float, default=1e-4)
    train.add_argument("--weight-decay", type=float, default=0.01)
    train.add_argument("--adam-beta1", type=float, default=0.9)
    train.add_argument("--adam-beta2", type=float, default=0.999)
    train.add_argument("--seed", type=int, default=1234)
    train.add_argument("--log-interval", type=int, default=100)
    train.add_argument("--no-check-for-nan-in-loss-and-grad", dest="check_for_nan_in_loss_and_grad",
                       action="store_false", help="skip Megatron's checks of each micro-batch's loss and of the "
                       "gradients' norm before their reduction for NaN and Inf (off by themselves under --fp16: no "
                       "static loss scale here)")
    prec = train.add_mutually_exclusive_group()
    prec.add_argument("--bf16", action="store_true")
    prec.add_argument("--fp16", action="store_true")
    prof = parser.add_argument_group("profiling (Megatron's flags)")
    prof.add_argument("--profile", action="store_true")
    prof.add_argument("--use-pytorch-profiler", action="store_true")
    prof.add_argument("--profile-step-start", type=int, default=10)
    prof.add_argument("--profile-step-end", type=int, default=12)
    prof.add_argument("--profile-ranks", type=int, nargs="+", default=[0])
    prof.add_argument("--tensorboard-dir", default=None)
    prof.add_argument("--pytorch-profiler-collect-shapes", action="store_true",
                      help="Megatron core ≥ 0.17: record shapes; implies the ≥ 0.17 trace layout")
    prof.add_argument("--trace-layout", choices=("tensorboard", "torch_profile"), default=None,
                      help="reference trainer only: which Megatron's trace layout to emulate (core ≤ 0.16 tensorboard "
                      "handler, or ≥ 0.17 DIR/../torch_profile/rank-N.json.gz); default: torch_profile when "
                      "--pytorch-profiler-collect-shapes is given, else tensorboard")
    return parser


def parse_args(argv: list[str] | None, world_size: int, cuda: bool) -> argparse.Namespace:
    """Parse and fill in what Megatron derives (dp, ffn size, kv channels, padded vocabulary, batch, dtype)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if world_size % (tp * pp):
        parser.error(f"world size {world_size} is not divisible by tp·pp = {tp}·{pp}")
    args.world_size = world_size
    args.data_parallel_size = data_parallel_size(world_size, tp, pp)
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = default_ffn_hidden_size(args.hidden_size, args.swiglu)
    if args.num_attention_heads % tp or args.hidden_size % args.num_attention_heads:
        parser.error("--num-attention-heads must divide --hidden-size and be divisible by the tp size")
    if args.kv_channels is None:
        args.kv_channels = default_kv_channels(args.hidden_size, args.num_attention_heads)
    if args.num_layers % pp:
        parser.error(f"--num-layers {args.num_layers} is not divisible by the pp size {pp}")
    if args.ffn_hidden_size % tp:
        parser.error(f"--ffn-hidden-size {args.ffn_hidden_size} is not divisible by the tp size {tp}")
    if tp == 1:
        args.sequence_parallel = False
    if args.sequence_parallel and args.seq_length % tp:
        parser.error(f"--seq-length {args.seq_length} is not divisible by the tp size {tp} (sequence parallel)")
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    args.padded_vocab_size = padded_vocab_size(args.vocab_size, args.make_vocab_size_divisible_by, tp)
    if args.global_batch_size is None:
        args.global_batch_size = args.micro_batch_size * args.data_parallel_size
    if args.global_batch_size % (args.micro_batch_size * args.data_parallel_size):
        parser.error(f"--global-batch-size {args.global_batch_size} is not divisible by micro-batch·dp = "
                     f"{args.micro_batch_size}·{args.data_parallel_size}")
    args.num_micro_batches = num_microbatches(args.global_batch_size, args.micro_batch_size, args.data_parallel_size)
    args.params_dtype = "torch.bfloat16" if args.bf16 else "torch.float16" if args.fp16 else "torch.float32"
    args.accumulate_allreduce_grads_in_fp32 = bool(args.bf16)
    if args.fp16:  # Megatron turns the checks off under a dynamic loss scale; this trainer has no static one
        args.check_for_nan_in_loss_and_grad = False
    if args.distributed_backend is None:
        args.distributed_backend = "nccl" if cuda else "gloo"
    if args.use_torch_fsdp2 and (tp > 1 or pp > 1):
        parser.error("--use-torch-fsdp2: the reference trainer shards over the data-parallel ranks only (tp = pp = 1)")
    if args.trace_layout is None:
        args.trace_layout = "torch_profile" if args.pytorch_profiler_collect_shapes else "tensorboard"
    if args.profile and args.use_pytorch_profiler:
        if args.tensorboard_dir is None:
            parser.error("--profile --use-pytorch-profiler writes traces under --tensorboard-dir; give one")
        if args.profile_step_end <= args.profile_step_start:
            parser.error("--profile-step-end must be greater than --profile-step-start")
    return args


def arguments_block(args: argparse.Namespace) -> str:
    """Megatron's start-up listing: `  name ..... value`, sorted case-insensitively, between the markers."""
    lines = [f"  {name} {'.' * (48 - len(name))} {value}" for name, value in vars(args).items()]
    return "\n".join(
        ["------------------------ arguments ------------------------",
         *sorted(lines, key=str.lower),
         "-------------------- end of arguments ---------------------"]
    )
