"""Time one compute operator shape, forward and backward, on the local device (median of repeats after warm-up).

Backward is the operator's whole backward (e.g. a linear's dgrad + wgrad GEMMs), timed with the forward's
features, as the seed paper's samples and the predictor's operator graph both use it."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import statistics
import tempfile
from contextlib import contextmanager
from typing import Callable

import torch
import torch.nn.functional as F

from tracekit.core.samples import (
    DTENSOR_SUFFIX,
    FSDP2_UNIT,
    FSDP_COPIES,
    FSDP_COPY_IN,
    FSDP_COPY_OUT,
    FSDP_GRAD_COPY_IN,
)

from .clocks import clock_for
from .optimizer_steps import adamw_step
from .shapes import (
    FSDP_COPY_RANKS,
    OPTIMIZER_SHARDS,
    Case,
    Point,
    layer_cases,
    layer_shapes,
    shard_shapes,
    stage_shapes,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Timer:
    """Median timings after warm-up, read by `clock` (tracekit.sampling.clocks: on CUDA the kernels' time on the
    device by default, the host's clock with `on_host`; on a CPU the host's). `first_touch` (default: on a CPU) times
    allocations into pages touched for the first time, as a training step makes them (`fwd_bwd`, `once`)."""

    def __init__(self, device: torch.device, warmup: int, repeats: int, first_touch: bool | None = None,
                 on_host: bool = False):
        self.device, self.warmup, self.repeats = device, warmup, repeats
        self.first_touch = device.type == "cpu" if first_touch is None else first_touch
        self.clock = clock_for(device, on_host)

    def host(self, repeats: int | None = None, first_touch: bool | None = None) -> Timer:
        """A timer of the same device on the host's clock (host costs: what a call spends beyond its kernels)."""
        return Timer(self.device, self.warmup, self.repeats if repeats is None else repeats,
                     self.first_touch if first_touch is None else first_touch, on_host=True)

    def fwd_bwd(self, leaves: list[torch.Tensor], forward: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]],
                prepare: Callable[[], torch.Tensor] | None = None) -> tuple[float, float]:
        """Median forward and backward µs of `forward()` (its result, a tensor or a tuple of them, is reduced by
        backward with ones). With `prepare`, each forward is `forward(prepare())`, `prepare` untimed: the input an
        operator writes into in place (a fresh one per call, as each step's is).

        With `first_touch` (on a CPU) the forwards run first, each keeping its activations, into memory just
        returned to the system, then the backwards. A training step runs so: its forward keeps a pass's activations
        for the backward in pages the allocator returned to the system at the end of the last iteration (glibc trims
        a heap whose free top outgrows its threshold; a looped operator never frees enough to reach it). A forward's
        first touch of those pages is part of its time in a step: ~1.5× a linear's and ~5× a GELU's time writing
        over the previous repeat's output (`benchmarks/step_linears.py`); a backward's gradients reuse the pages the
        activations free. Otherwise (on CUDA) the two alternate: the caching allocator hands back blocks it holds
        (no first touch), and large shapes' activations would not fit many times over."""
        keep = self.first_touch
        if keep:
            return_freed_memory()
        outs, fwd, bwd = [], [], []
        grad = None
        for _ in range(self.warmup + self.repeats):
            call = forward if prepare is None else functools.partial(forward, prepare())
            seconds, out = self.clock.time(call, "fwd")
            fwd.append(seconds)
            if grad is None:
                grad = tuple(torch.ones_like(o) for o in out) if isinstance(out, tuple) else torch.ones_like(out)
            if keep:
                outs.append(out)
            else:
                bwd.append(self._backward(leaves, out, grad))
        bwd += [self._backward(leaves, out, grad) for out in outs]
        return _median_us(fwd[self.warmup:]), _median_us(bwd[self.warmup:])

    def _backward(self, leaves: list[torch.Tensor], out, grad) -> float:
        """µs of `out`'s backward into fresh gradients (none accumulated from the last repeat)."""
        for leaf in leaves:
            leaf.grad = None
        return self.clock.time(lambda: torch.autograd.backward(out, grad), "bwd")[0]

    def once(self, step: Callable[[], object]) -> float:
        """Median µs of `step()`. With `first_touch` each run's allocations are pages touched for the first time, as
        in a training step, where the memory the last pass freed has gone back to the system (`fwd_bwd`): FSDP2's
        copy out of a layer's gathered parameters then takes ~6× its time writing over the last run's freed buffer."""
        times = []
        for i in range(self.warmup + self.repeats):
            if self.first_touch:
                return_freed_memory()
            seconds, _ = self.clock.time(step, "once")
            if i >= self.warmup:
                times.append(seconds)
        return _median_us(times)


def _median_us(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1e6


def return_freed_memory() -> None:
    """Have glibc's allocator return the memory this process has freed to the system (`malloc_trim(0)`), so the
    next allocations are pages touched for the first time, as a training step's forward activations are. Called
    through ctypes: no maintained package wraps it. Elsewhere (macOS, musl) there is no such call; nothing is done."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def leaf(shape, dtype, device, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, device=device, dtype=torch.float32) * scale).to(dtype).requires_grad_()


def time_case(case: Case, dtype_name: str, timer: Timer) -> dict[str, float]:
    """{pass: µs} for one case: {'fwd', 'bwd'} for layer operators, {'optimizer'} for an optimizer step."""
    dtype, dev = DTYPES[dtype_name], timer.device
    f = dict(case.features)
    kind = case.primitive
    if kind == "gemm":
        x, w = leaf((int(f["m"]), int(f["k"])), dtype, dev), leaf((int(f["n"]), int(f["k"])), dtype, dev, 0.02)
        fwd, bwd = timer.fwd_bwd([x, w], lambda: F.linear(x, w))
    elif kind == "attention":  # grouped-query attention: fewer key/value heads, each serving a group of queries
        batch, heads, kv_heads = int(f["batch"]), int(f["heads"]), int(f.get("kv_heads", f["heads"]))
        q = leaf((batch, heads, int(f["seq"]), int(f["head_dim"])), dtype, dev)
        k, v = (leaf((batch, kv_heads, int(f["seq_kv"]), int(f["head_dim"])), dtype, dev) for _ in range(2))
        fwd, bwd = timer.fwd_bwd([q, k, v], lambda: F.scaled_dot_product_attention(  # Megatron default dropout
            q, k, v, is_causal=True, dropout_p=0.1, enable_gqa=kv_heads != heads))
    elif kind == "norm":
        x = leaf((int(f["rows"]), int(f["width"])), dtype, dev)
        norm = torch.nn.LayerNorm(int(f["width"]), device=dev, dtype=dtype)
        fwd, bwd = timer.fwd_bwd([x, *norm.parameters()], lambda: norm(x))
    elif kind == "elementwise" and case.variant in FSDP_COPIES:
        micros = timer.once(_fsdp_copy(case.variant, case.get("hidden"), dtype, dev))
        return {"fwd": micros, "bwd": micros}  # the same op in either pass: FSDP2 gathers for both
    elif kind == "elementwise":
        a, b = (leaf((int(f["rows"]), int(f["width"])), dtype, dev) for _ in range(2))
        fwd, bwd = timer.fwd_bwd([a, b], lambda: a + F.dropout(b, p=0.1))
    elif kind == "activation":
        x = leaf((int(f["rows"]), int(f["width"])), dtype, dev)
        fwd, bwd = timer.fwd_bwd([x], lambda: F.gelu(x))
    elif kind == "embedding":
        weight = leaf((int(f["params"]), int(f["width"])), dtype, dev, 0.02)
        tokens = torch.randint(0, int(f["params"]), (int(f["rows"]),), device=dev)
        fwd, bwd = timer.fwd_bwd([weight], lambda: F.embedding(tokens, weight))
    elif kind == "cross_entropy":
        logits = leaf((int(f["rows"]), int(f["width"])), dtype, dev)
        target = torch.randint(0, int(f["width"]), (int(f["rows"]),), device=dev)
        fwd, bwd = timer.fwd_bwd([logits], lambda: F.cross_entropy(logits.float(), target, reduction="none"))
    elif kind == "optimizer" and case.variant.endswith(DTENSOR_SUFFIX):
        shapes = stage_shapes(int(f["layers"]), int(f["width"]), int(f["tp"]), case.get("stage_params"))
        return {"optimizer": _dtensor_optimizer_step(shard_shapes(shapes, OPTIMIZER_SHARDS), timer)}
    elif kind == "optimizer":
        shapes = stage_shapes(int(f["layers"]), int(f["width"]), int(f["tp"]), int(f["params"]))
        return {"optimizer": _optimizer_step(shapes, dtype, timer)}
    elif kind == "framework" and case.variant == FSDP2_UNIT:  # host costs, on the host's clock; a difference of
        # differences, which more repeats steady
        return _fsdp2_unit_overhead(case.get("point"), dtype_name, timer.host(3 * timer.repeats, False))
    elif kind == "framework":
        return _framework_overhead(case.get("point"), dtype_name, timer.host())
    else:
        raise ValueError(f"no timing recipe for primitive {kind!r}")
    return {"fwd": fwd, "bwd": bwd}


def _fsdp_copy(variant: str, hidden: int, dtype, dev: torch.device, n: int = FSDP_COPY_RANKS) -> Callable[[], None]:
    """One of FSDP2's copies (tracekit.core.samples.FSDP_COPIES) of a GPT layer's parameters over `n` shard ranks
    (rank 0's part), as FSDP2 calls it: into a buffer allocated for the call (on a CPU, its first touch is part of
    the copy's time, as in a training step)."""
    import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  (registers torch.ops.fsdp)

    shapes = layer_shapes(hidden)
    shards = [torch.randn(s, device=dev).to(dtype).view(-1) for s in shard_shapes(shapes, n)]  # flat, as FSDP2's
    split = [t.numel() for t in shards]
    shard_numel = sum(split)
    if variant == FSDP_COPY_IN:
        return lambda: torch.ops.fsdp.all_gather_copy_in(
            shards, torch.empty(shard_numel * n, device=dev, dtype=dtype), split, shard_numel, 0)
    if variant == FSDP_COPY_OUT:
        gathered = torch.randn((n, shard_numel), device=dev).to(dtype)
        return lambda: torch.ops.fsdp.split_with_sizes_copy(
            gathered, split, dim=1, out=[torch.empty((n, size), device=dev, dtype=dtype) for size in split])
    grads = [torch.randn(s, device=dev).to(dtype) for s in shapes]
    return lambda: torch.ops.fsdp.chunk_cat(
        grads, dim=0, num_chunks=n, out=torch.empty((n, shard_numel), device=dev, dtype=dtype))


def _optimizer_step(shapes: list[tuple[int, ...]], dtype, timer: Timer) -> float:
    """The step of a stage's parameters as a run on this device takes it: on a GPU Megatron's (torch's AdamW,
    `foreach`, on fp32 main copies: tracekit.sampling.optimizer_steps), on a CPU the reference trainer's (Adam, fp32
    main copies for fp16/bf16, as Megatron)."""
    from tracekit.reference.train import MixedPrecisionAdam

    if timer.device.type == "cuda":
        return adamw_step(shapes, dtype, timer, fused=False)

    tensors = [torch.nn.Parameter(torch.randn(shape, device=timer.device).to(dtype)) for shape in shapes]
    for t in tensors:
        t.grad = torch.randn_like(t) * 1e-3
    if dtype == torch.float32:
        optimizer = torch.optim.Adam(tensors, lr=1e-4, weight_decay=0.01)
        return timer.once(optimizer.step)
    args = type("Args", (), {"lr": 1e-4, "adam_beta1": 0.9, "adam_beta2": 0.999, "weight_decay": 0.01})()
    return timer.once(MixedPrecisionAdam(tensors, args).step)


def _dtensor_optimizer_step(shapes: list[tuple[int, ...]], timer: Timer) -> float:
    """Adam over fp32 DTensor shards of these (local) shapes on a one-rank mesh, as torch FSDP2 steps its sharded
    parameters: fp32 whatever the compute dtype (its mixed-precision policy casts a copy for compute), every op of the
    step dispatched through DTensor (on a CPU, Adam's per-tensor loop: foreach is for CUDA tensors)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dev = timer.device
    with one_rank_group():
        mesh = init_device_mesh(dev.type, (1,))
        params = []
        for shape in shapes:
            param = torch.nn.Parameter(distribute_tensor(torch.randn(shape, device=dev), mesh, [Shard(0)]))
            param.grad = distribute_tensor(torch.randn(shape, device=dev) * 1e-3, mesh, [Shard(0)])
            params.append(param)
        optimizer = torch.optim.Adam(params, lr=1e-4, weight_decay=0.01)
        return timer.once(optimizer.step)


def _framework_overhead(point: Point, dtype_name: str, timer: Timer) -> dict[str, float]:
    """{pass: µs per operator} that a layer pass spends beyond its operators' own times: the reference trainer's
    transformer layer (Megatron's structure on one rank) timed whole, minus each of its operators timed alone as the
    other samples are, divided by the number of operators the predictor counts in a layer pass."""
    from tracekit.reference.model import TransformerLayer

    dtype, dev = DTYPES[dtype_name], timer.device
    args, topo = _reference_layer_setup(point, dtype_name, dev)
    with one_rank_group():
        layer = TransformerLayer(args, topo, 0, dtype).train()
        x = leaf((point.seq, point.micro_batch, point.hidden), dtype, dev)
        whole = timer.fwd_bwd([x, *layer.parameters()], lambda: layer(x))
    parts, cases = [0.0, 0.0], layer_cases(point)
    for case, count in cases:
        alone = time_case(case, dtype_name, timer)
        parts[0] += count * alone["fwd"]
        parts[1] += count * alone["bwd"]
    operators = sum(count for _, count in cases)
    return {"fwd": (whole[0] - parts[0]) / operators, "bwd": (whole[1] - parts[1]) / operators}


def _reference_layer_setup(point: Point, dtype_name: str, dev: torch.device):
    """(arguments, one-rank topology) of the reference trainer's transformer layer at `point`: one layer, no
    vocabulary, on one rank of `dev`."""
    from tracekit.reference.arguments import parse_args
    from tracekit.reference.launch import megatron_flags
    from tracekit.reference.parallel import Topology

    flags = megatron_flags(num_layers=1, hidden_size=point.hidden, num_attention_heads=point.heads,
                           seq_length=point.seq, micro_batch_size=point.micro_batch,
                           global_batch_size=point.micro_batch, vocab_size=1, train_iters=1,  # no vocabulary
                           bf16=dtype_name == "bf16", fp16=dtype_name == "fp16")
    return parse_args(flags, 1, dev.type == "cuda"), Topology(0, 1, 1, 1, 1, 0, 0, 0, None, None, None, dev)


def _fsdp2_unit_overhead(point: Point, dtype_name: str, timer: Timer) -> dict[str, float]:
    """{pass: µs per unit} that torch FSDP2 spends on each unit (a transformer layer it shards) beyond the layer's own
    operators and the copies the predictor counts as operators: its hooks before and after the unit's forward and
    backward, issuing and waiting for its collectives, resharding and accumulating its gradients. Stacks of 1 and 3
    reference layers are timed plain and sharded (each layer a unit, reshard after forward, under a root that holds
    no parameters) on a one-rank mesh; per unit: the sharded stacks' difference less the plain stacks', halved, less
    the unit's copies timed alone (forward: shard in and out; backward: those again and the gradients in). The
    one-rank collectives stay in (on one rank a gather is a copy, a reduce-scatter FSDP2 skips). Everything here is
    timed reusing freed memory (no `first_touch`): inside the stacks a unit's copies write over the buffers the unit
    before freed, so the copies subtracted must too (the copies' own samples carry the first touch a step pays)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from tracekit.reference.model import TransformerLayer

    dtype, dev = DTYPES[dtype_name], timer.device
    args, topo = _reference_layer_setup(point, dtype_name, dev)
    times: dict[tuple[bool, int], tuple[float, float]] = {}
    with one_rank_group():
        mesh = init_device_mesh(dev.type, (1,))
        for sharded in (False, True):
            for layers in (1, 3):
                stack = torch.nn.Sequential(*(TransformerLayer(args, topo, i, dtype).train() for i in range(layers)))
                if sharded:
                    for layer in stack:
                        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
                    fully_shard(stack, mesh=mesh)
                x = leaf((point.seq, point.micro_batch, point.hidden), dtype, dev)
                times[(sharded, layers)] = timer.fwd_bwd([x], lambda: stack(x))
        copy = {variant: timer.once(_fsdp_copy(variant, point.hidden, dtype, dev, 1)) for variant in FSDP_COPIES}
    per_unit = [((times[(True, 3)][i] - times[(True, 1)][i]) - (times[(False, 3)][i] - times[(False, 1)][i])) / 2
                for i in (0, 1)]
    gather = copy[FSDP_COPY_IN] + copy[FSDP_COPY_OUT]
    return {"fwd": per_unit[0] - gather, "bwd": per_unit[1] - gather - copy[FSDP_GRAD_COPY_IN]}


@contextmanager
def one_rank_group():
    """A one-process gloo group for the reference layer's parallel mappings (identities on one rank) and DTensor's
    one-rank meshes, unless a group is already set up. `tracekit sample` holds one for its whole compute phase: a
    group set up per shape leaves gloo's transport threads behind (DTensor keeps a reference), and dozens of them
    waking on their own make this machine's later collective samples ~1.5× quicker than a training step's."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory(prefix="tracekit-store-") as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()
