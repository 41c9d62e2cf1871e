"""The Megatron-core runs the GPU kit captures (`benchmarks/gpu/harvest.py`), in the order the budget serves them.

Each run is one GPU's `pretrain_gpt.py` of the vendored Megatron-LM snapshot on mock data: its model (`shape`: sizes,
batch, sequence) and its features (`features`: layer implementation, attention, MLP, recompute, MoE), so that the CPU
check (`benchmarks/gpu/megatron_cpu.py`) builds each run's model with the same features at a size a CPU runs.

What the flags are for, learned on an H200 (../shared/gpu/README.md of the first harvest): Megatron's local
transformer implementation without Transformer Engine or apex needs `--no-persist-layer-norm`,
`--no-masked-softmax-fusion` and `--no-gradient-accumulation-fusion`, and `--no-rope-fusion` with RoPE; otherwise it
stops at model construction or at the first forward. The Transformer Engine runs are added where the machine has it.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass

#: Every run: mock data, no tokenizer, bf16, a log line per iteration, no evaluation.
COMMON = ("--mock-data --tokenizer-type NullTokenizer --vocab-size 32000 --bf16 --lr 1e-4 --min-lr 1e-5 "
          "--log-interval 1 --eval-iters 0 --eval-interval 100000 --seed 1234 --distributed-timeout-minutes 3")
#: Megatron-core's local layers without Transformer Engine or apex (see the module docstring).
LOCAL = ("--transformer-impl local --no-persist-layer-norm --no-masked-softmax-fusion "
         "--no-gradient-accumulation-fusion")
TE = "--transformer-impl transformer_engine"
GPT = "--max-position-embeddings 2048 --seq-length 2048"
LLAMA = ("--position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear "
         "--untie-embeddings-and-output-weights --attention-dropout 0 --hidden-dropout 0")
#: Iterations of each run and the steps profiled: 7 iterations before the profiler (the first ones warm up), 3
#: recorded (tracekit capture needs at least 3), 3 after it, all logged.
TRAIN_ITERS = 14
STEPS = "8-11"


@dataclass(frozen=True)
class Run:
    name: str
    shape: str  # model size, batch and sequence
    features: str  # what the layers are: the flags the CPU check keeps
    te: bool = False  # needs Transformer Engine
    seconds: int = 100  # time limit of the run (start-up included: ~40 s on the H200)

    def flags(self) -> list[str]:
        """The `pretrain_gpt.py` arguments of the run."""
        return shlex.split(f"{COMMON} {self.features} {self.shape} --train-iters {TRAIN_ITERS}")


RUNS = (
    Run("gpt-1.3b", f"--num-layers 24 --hidden-size 2048 --num-attention-heads 16 {GPT} --micro-batch-size 4 "
        "--global-batch-size 16", LOCAL),
    Run("llama-1b-gqa", "--num-layers 16 --hidden-size 2048 --num-attention-heads 32 --ffn-hidden-size 8192 "
        "--seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 2 --global-batch-size 8",
        f"{LOCAL} {LLAMA} --no-rope-fusion --group-query-attention --num-query-groups 8"),
    Run("moe-8x-top2", f"--num-layers 12 --hidden-size 1024 --num-attention-heads 16 --ffn-hidden-size 2816 {GPT} "
        "--micro-batch-size 4 --global-batch-size 16",
        f"{LOCAL} {LLAMA} --no-rope-fusion --num-experts 8 --moe-router-topk 2 --moe-aux-loss-coeff 1e-2"),
    Run("gpt-1.3b-recompute", f"--num-layers 24 --hidden-size 2048 --num-attention-heads 16 {GPT} "
        "--micro-batch-size 4 --global-batch-size 16",
        f"{LOCAL} --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"),
    Run("gpt-1.3b-te", f"--num-layers 24 --hidden-size 2048 --num-attention-heads 16 {GPT} --micro-batch-size 4 "
        "--global-batch-size 16", TE, te=True),
    Run("llama-1b-gqa-te", "--num-layers 16 --hidden-size 2048 --num-attention-heads 32 --ffn-hidden-size 8192 "
        "--seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 2 --global-batch-size 8",
        f"{TE} {LLAMA} --group-query-attention --num-query-groups 8", te=True),
)
BY_NAME = {run.name: run for run in RUNS}
