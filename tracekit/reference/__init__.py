"""A small Megatron-compatible GPT trainer on plain PyTorch (`python -m tracekit.reference`, or under torchrun).

It takes Megatron's argument names, implements tensor (+sequence), 1F1B pipeline and data parallelism with
torch.distributed (gloo on CPU, nccl on GPU), prints Megatron's arguments block and iteration log lines, and writes
profiler traces where Megatron writes them, so tracekit can be tested end to end without a GPU cluster.
It is a test vehicle, not a training framework.
"""
