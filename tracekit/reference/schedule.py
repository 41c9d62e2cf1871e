"""Megatron's non-interleaved 1F1B pipeline schedule with point-to-point activation/gradient transfers.

Stage r runs min(pp − r − 1, micro-batches) warm-up forwards, then alternates one forward and one backward, then
drains the remaining backwards. Sends and receives that happen together go out as one batch_isend_irecv, as in
Megatron's p2p_communication."""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch.profiler import record_function

from .parallel import Topology


class P2P:
    """Activation/gradient exchange with the neighbouring pipeline stages."""

    def __init__(self, topo: Topology, shape: tuple[int, ...], dtype):
        self.topo, self.shape, self.dtype = topo, shape, dtype
        self.prev = topo.stage_rank(topo.pp_rank - 1) if not topo.first_stage else None
        self.next = topo.stage_rank(topo.pp_rank + 1) if not topo.last_stage else None

    def _exchange(self, send: torch.Tensor | None, send_to: int | None, recv_from: int | None) -> torch.Tensor | None:
        ops, received = [], None
        if send is not None and send_to is not None:
            ops.append(dist.P2POp(dist.isend, send.contiguous(), send_to))
        if recv_from is not None:
            received = torch.empty(self.shape, dtype=self.dtype, device=self.topo.device)
            ops.append(dist.P2POp(dist.irecv, received, recv_from))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return received

    def recv_forward(self):
        with record_function("pipeline/recv_forward"):
            x = self._exchange(None, None, self.prev)
        return x.requires_grad_() if x is not None else None

    def send_forward(self, y):
        with record_function("pipeline/send_forward"):
            self._exchange(y if self.next is not None else None, self.next, None)

    def recv_backward(self):
        with record_function("pipeline/recv_backward"):
            return self._exchange(None, None, self.next)

    def send_backward(self, grad):
        with record_function("pipeline/send_backward"):
            self._exchange(grad if self.prev is not None else None, self.prev, None)

    def send_forward_recv_backward(self, y):
        with record_function("pipeline/send_forward_recv_backward"):
            return self._exchange(y if self.next is not None else None, self.next, self.next)

    def send_backward_recv_forward(self, grad):
        with record_function("pipeline/send_backward_recv_forward"):
            x = self._exchange(grad if self.prev is not None else None, self.prev, self.prev)
        return x.requires_grad_() if x is not None else None


def one_f_one_b(topo: Topology, p2p: P2P, forward: Callable[[int, torch.Tensor | None], torch.Tensor],
                num_microbatches: int, check: bool = False) -> list[float]:
    """Run one iteration's forward and backward passes; returns the last stage's per-micro-batch losses. `check`:
    each loss is checked for NaN and then for Inf on the host, as Megatron's loss function does."""
    warmup = min(topo.pp - topo.pp_rank - 1, num_microbatches)
    remaining = num_microbatches - warmup
    inputs, outputs, losses = [], [], []
    index = 0

    def run_forward(x):
        nonlocal index
        y = forward(index, x)
        index += 1
        if topo.last_stage:
            if check and (bool(torch.isnan(y)) or bool(torch.isinf(y))):
                raise RuntimeError("found NaN or Inf in local forward loss calculation")
            losses.append(float(y.detach()))
            y = y / num_microbatches
        inputs.append(x)
        outputs.append(y)
        return y

    def run_backward(grad_y):
        x, y = inputs.pop(0), outputs.pop(0)
        torch.autograd.backward(y, grad_tensors=None if topo.last_stage else grad_y)
        return x.grad if x is not None else None

    for _ in range(warmup):
        y = run_forward(p2p.recv_forward())
        p2p.send_forward(None if topo.last_stage else y.detach())
    x = p2p.recv_forward() if remaining else None
    for i in range(remaining):
        y = run_forward(x)
        grad_y = p2p.send_forward_recv_backward(None if topo.last_stage else y.detach())
        grad_x = run_backward(grad_y)
        if i == remaining - 1:
            x = None
            p2p.send_backward(grad_x)
        else:
            x = p2p.send_backward_recv_forward(grad_x)
    for _ in range(warmup):
        p2p.send_backward(run_backward(p2p.recv_backward()))
    return losses
