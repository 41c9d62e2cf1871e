"""The predicted timeline as Kineto-format Chrome traces (one `rank-{r}.json.gz` per simulated rank, or plain
`rank-{r}.json`), so Perfetto, HTA and `tracekit ingest` read predicted and real traces alike.

Each operator instance becomes a `cpu_op` (named as PyTorch/Megatron name it: aten::mm with `Input Dims`/`Input
type`, record_param_comms with the collective metadata of PyTorch ≥ 2.3) holding a `cudaLaunchKernel`
`cuda_runtime` event, the kernel on its GPU stream (compute 7; tensor/context-parallel collectives 20; data-parallel
24; pipeline send/recv 28) carrying `External id` and `correlation`, and an `ac2g` flow from launch to kernel.
A linear's backward is written as its two GEMMs (dgrad, wgrad), half the estimated time each. Iterations are
marked `ProfilerStep#N` (CPU user_annotation and GPU gpu_user_annotation). The forward ops (recomputed ones too)
sit inside `user_annotation` ranges named as the reference trainer's `record_function` ranges name Megatron's
modules (`layer_unit`): `embedding`, `layer_{i}/attention`, `layer_{i}/mlp` (i: the global layer number),
`output_layer`, `cross_entropy`; the reader takes them as each op's layer, so predicted and real traces compare
layer by layer. Times are µs relative to
`baseTimeNanoseconds`. The simulated ranks are the first rank of every pipeline stage (tp = cp = dp = 0).
"""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from tracekit.core.atomic import atomic_write_bytes
from tracekit.core.hardware import hardware_spec
from tracekit.core.pipeline_layout import SPLIT_BACKWARD, torch_schedule

from .graph import Graph, OpUse
from .placement import rank_coordinates, strides
from .stage_work import split_backward
from .zero_bubble import segment_of

if TYPE_CHECKING:
    from .predict import Prediction

BASE_NS = 1_700_000_000_000_000_000
PID, TID = 4242, 4242
STREAMS = {"compute": 7, "tp": 20, "cp": 20, "ep": 22, "etp": 22, "tpep": 22, "dp": 24, "dpcp": 24, "edp": 24,
           "embd": 24, "pp": 28, "p2p": 28,
           "fsdp": 24, "fsdp_replica": 24, "efsdp": 24, "world": 24}
GROUP_DESC = {"tp": "TENSOR_MODEL_PARALLEL_GROUP", "cp": "CONTEXT_PARALLEL_GROUP", "dp": "DATA_PARALLEL_GROUP",
              "dpcp": "DATA_PARALLEL_GROUP_WITH_CP", "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
              "p2p": "PIPELINE_MODEL_PARALLEL_GROUP", "embd": "EMBEDDING_GROUP", "ep": "EXPERT_MODEL_PARALLEL_GROUP",
              "etp": "EXPERT_TENSOR_PARALLEL_GROUP", "tpep": "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP",
              "edp": "EXPERT_DATA_PARALLEL_GROUP", "fsdp": "DATA_PARALLEL_SHARD_GROUP",
              "fsdp_replica": "DATA_PARALLEL_REPLICATE_GROUP", "efsdp": "EXPERT_DATA_PARALLEL_GROUP",
              "world": "default_pg"}
LAUNCH_US = 4.0  # CPU time of one launching op in the synthetic host timeline
_NCCL = {"all_reduce": ("allreduce", "AllReduce_Sum_{dt}_RING_LL"), "all_gather": ("_allgather_base",
         "AllGather_RING_LL"), "reduce_scatter": ("_reduce_scatter_base", "ReduceScatter_Sum_{dt}_RING_LL"),
         "send_recv": ("send", "SendRecv"), "all_to_all": ("all_to_all", "SendRecv")}
_TORCH_DTYPE = {"fp16": ("c10::Half", "Half", "f16"), "bf16": ("c10::BFloat16", "BFloat16", "bf16"),
                "fp32": ("float", "Float", "f32"),
                **{d: ("c10::Float8_e4m3fn", "Float8_e4m3fn", "f8") for d in ("fp8", "fp8_block", "mxfp8")},
                **{d: ("c10::Float4_e2m1fn_x2", "Float4_e2m1fn_x2", "f4") for d in ("nvfp4", "mxfp4")}}


def default_ranks(graph: Graph) -> list[int]:
    """The first global rank of every pipeline stage."""
    c = graph.config
    return [s * strides(c.tp, c.cp, c.dp, c.pp)["pp"] for s in range(c.pp)]


def write_traces(prediction: "Prediction", out_dir: str | Path, ranks: list[int] | None = None,
                 iterations: int = 2, compress: bool = True, progress: Callable[[Path], None] | None = None
                 ) -> list[Path]:
    """Write one trace per simulated rank (default: first rank of each stage), gzip-compressed unless `compress` is
    False (a 7B model's two ranks are ~160 MB of JSON, ~10 MB gzipped); `progress(path)` after each file. Returns
    the paths."""
    graph = prediction.graph
    ranks = ranks or default_ranks(graph)
    out = []
    for rank in ranks:
        path = Path(out_dir) / f"rank-{rank}.json{'.gz' if compress else ''}"
        data = dumps(rank_trace(prediction, rank, iterations))
        atomic_write_bytes(path, gzip.compress(data, compresslevel=3, mtime=0) if compress else data)
        out.append(path)
        if progress:
            progress(path)
    return out


def dumps(doc: dict) -> bytes:
    """Kineto's layout: header keys first, one event per line, `"rank": N` spaced as HTA's rank scan expects."""
    import json

    import orjson

    head = [f'  "{k}": {json.dumps(v)}' for k, v in doc.items() if k != "traceEvents"]
    events = b",\n".join(orjson.dumps(e, option=orjson.OPT_SERIALIZE_NUMPY) for e in doc["traceEvents"])
    return ("{\n" + ",\n".join(head) + ',\n  "traceEvents": [\n').encode() + events + b"\n]}\n"


class _Writer:
    def __init__(self, graph: Graph, rank: int, dtype: str):
        self.graph = graph
        self.rank = rank
        self.events: list[dict] = []
        self.next_id = 1
        self.cpu_free = 0.0
        self.dtype = dtype
        self.sm90 = not graph.hardware.upper().startswith(("A100", "A800", "V100"))
        self.parent: str | None = None
        self.block: tuple[str, float] | None = None  # (name, start) of the open layer annotation
        self.pending: str | None = None  # the layer annotation the next launch opens

    def annotate(self, name: str | None) -> None:
        """Close the open layer annotation; the next launch opens `name`'s (None: none) around the ops launched from
        then on. A range opens 1 µs after the last one closed, so that sibling ranges never touch."""
        if self.block is not None and self.block[0] == name:
            self.pending = None
            return
        if self.block is not None:
            label, start = self.block
            self.events.append({"ph": "X", "cat": "user_annotation", "name": label, "pid": PID, "tid": TID,
                                "ts": start, "dur": self.cpu_free + 0.25 - start, "args": {"External id": 0}})
            self.block = None
        self.pending = name

    def launch(self, op: str, kernel: str, start: float, dur: float, stream: int, args: dict | None = None,
               kernel_args: dict | None = None) -> None:
        """cpu_op + cudaLaunchKernel + kernel + ac2g flow for one kernel at [start, start + dur) on the GPU; inside
        the current `parent` op (autograd's evaluate_function in backward, Optimizer.step), as PyTorch nests them."""
        ext = self.next_id
        corr = ext + 1_000_000
        self.next_id += 1
        floor = self.cpu_free + (1.0 if self.pending else 0.0)
        cpu_start = max(floor, start - LAUNCH_US - 1.0) + (0.5 if self.parent else 0.0)
        if self.pending:
            self.block, self.pending = (self.pending, cpu_start - 0.5), None
        cpu_dur = LAUNCH_US
        self.cpu_free = cpu_start + cpu_dur + (0.5 if self.parent else 0.0)
        ev = self.events
        if self.parent:
            ev.append({"ph": "X", "cat": "cpu_op", "name": self.parent, "pid": PID, "tid": TID, "ts": cpu_start - 0.5,
                       "dur": cpu_dur + 1.0, "args": {"External id": ext + 500_000, "Record function id": 0}})
        ev.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": PID, "tid": TID, "ts": cpu_start,
                   "dur": cpu_dur, "args": {"External id": ext, "Record function id": 0, **(args or {})}})
        launch_ts = cpu_start + 1.0
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": TID,
                   "ts": launch_ts, "dur": 2.0, "args": {"External id": ext, "cbid": 211, "correlation": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": stream, "ts": start,
                   "dur": max(dur, 0.001), "args": {"External id": ext, "queued": 0, "device": 0, "context": 1,
                                                    "stream": stream, "correlation": corr, **(kernel_args or {})}})
        ev.append({"ph": "s", "id": corr, "pid": PID, "tid": TID, "ts": launch_ts, "cat": "ac2g", "name": "ac2g"})
        ev.append({"ph": "f", "id": corr, "pid": 0, "tid": stream, "ts": start, "cat": "ac2g", "name": "ac2g",
                   "bp": "e"})

    # -- one operator instance ---------------------------------------------------------------------------------
    def op(self, use: OpUse, pass_: str, start: float, dur: float) -> None:
        spec = self.graph.specs[use.spec]
        prim = spec["primitive"]
        self.parent = {"bwd": f"autograd::engine::evaluate_function: {prim.title()}Backward0",
                       "optimizer": "Optimizer.step#FusedAdam.step"}.get(pass_)
        if use.group:
            self.collective(spec, use.group, start, dur)
            return
        torch_t = _TORCH_DTYPE[self.dtype][0]
        if prim in ("gemm", "bmm"):
            m, n, k = int(spec["m"]), int(spec["n"]), int(spec["k"])
            b = int(spec.get("batch") or 1)
            name = "aten::mm" if prim == "gemm" else ("aten::baddbmm" if spec["variant"] == "baddbmm" else "aten::bmm")
            shapes = ([[m, k], [k, n]], [[m, n], [n, k]], [[n, m], [m, k]]) if prim == "gemm" else \
                ([[b, m, k], [b, k, n]], [[b, m, n], [b, n, k]], [[b, k, m], [b, m, n]])
            kernel = self.gemm_kernel()
            role = spec.get("role") if pass_ == "bwd" else None
            if role == "bgrad":  # the bias gradient: dY summed over its rows
                self.launch("aten::sum", "void at::native::reduce_kernel<512, 1>", start, dur, 7,
                            {"Input Dims": [[m, n]], "Input type": [torch_t]})
            elif role in ("dgrad", "wgrad"):  # one part of the backward, with that GEMM's own shapes
                self.launch(name, kernel, start, dur, 7,
                            {"Input Dims": shapes[1 if role == "dgrad" else 2], "Input type": [torch_t] * 2})
            elif pass_ == "bwd":  # the whole backward: dgrad then wgrad
                self.launch(name, kernel, start, dur / 2, 7, {"Input Dims": shapes[1], "Input type": [torch_t] * 2})
                self.launch(name, kernel, start + dur / 2, dur / 2, 7,
                            {"Input Dims": shapes[2], "Input type": [torch_t] * 2})
            else:
                self.launch(name, kernel, start, dur, 7, {"Input Dims": shapes[0], "Input type": [torch_t] * 2})
            return
        op_name, kernel, dims = self.compute_names(spec, pass_)
        self.launch(op_name, kernel, start, dur, 7, {"Input Dims": dims, "Input type": [torch_t] * len(dims)})

    def gemm_kernel(self) -> str:
        if self.sm90:
            t = "bf16bf16_bf16f32_f32" if self.dtype == "bf16" else "f16f16_f16f32_f32"
            return (f"sm90_xmma_gemm_{t}_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
                    "__5x_cublas")
        t = {"bf16": "bf16", "fp16": "fp16", "fp32": "sgemm"}[self.dtype]
        return f"ampere_{t}_s16816gemm_{t}_128x128_ldg8_f2f_stages_32x5_tn"

    def compute_names(self, spec: dict, pass_: str) -> tuple[str, str, list]:
        prim, variant = spec["primitive"], spec["variant"]
        bwd = pass_ == "bwd"
        half = _TORCH_DTYPE[self.dtype][0]
        rows, width = int(spec.get("rows") or 0), int(spec.get("width") or 0)
        if prim == "attention":
            b, a, s, d = (int(spec[k]) for k in ("batch", "heads", "seq", "head_dim"))
            kernel = "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel" if bwd else "flash_fwd_kernel"
            return ("FlashAttnFuncBackward" if bwd else "FlashAttnFunc",
                    f"void flash::{kernel}<Flash_kernel_traits<128, 128, 64, 4, {half}>, true>(Flash_params)",
                    [[b, s, a, d]] * 3)
        if prim == "softmax":
            b, a, s = int(spec["batch"]), int(spec["heads"]), int(spec["seq"])
            way = "backward" if bwd else "forward"
            return (f"scaled_upper_triang_masked_softmax_cuda::{way}",
                    f"void scaled_upper_triang_masked_softmax_warp_{way}<{half}, {half}, float, 11>", [[b * a, s, s]])
        if prim == "norm":
            rms = variant == "RMSlayernorm"
            op = ("aten::_fused_rms_norm" if rms else "aten::native_layer_norm") + ("_backward" if bwd else "")
            kern = ("rms_norm" if rms else "layer_norm") + ("_grad_input_kernel" if bwd else "_kernel")
            return op, f"void at::native::(anonymous namespace)::vectorized_{kern}<{half}, float>", [[rows, width]]
        if prim == "activation":
            act = "silu" if variant == "swiglu" else "gelu"
            return (f"aten::{act}_backward" if bwd else f"aten::{act}",
                    f"void at::native::vectorized_elementwise_kernel<4, at::native::{act}_kernel<{half}>>",
                    [[rows, width]])
        if prim == "embedding":
            return ("aten::embedding_dense_backward" if bwd else "aten::embedding",
                    "void at::native::embedding_backward_feature_kernel" if bwd else
                    "void at::native::(anonymous namespace)::indexSelectLargeIndex", [[int(spec["params"]), width],
                                                                                      [rows]])
        if prim == "cross_entropy":
            return ("vocab_parallel_cross_entropy_backward" if bwd else "vocab_parallel_cross_entropy",
                    f"void at::native::cross_entropy_reduce_kernel<{half}>", [[rows, width]])
        if prim == "optimizer":
            return "multi_tensor_adam", "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>", \
                [[int(spec.get("params") or 0)]]
        what = {"res_add": "add", "dropout": "native_dropout", "RoPE": "mul"}.get(variant, "add")
        kern = "fused_dropout_kernel_vec" if what == "native_dropout" else \
            f"vectorized_elementwise_kernel<4, at::native::CUDAFunctor_{what}<{half}>>"
        numel = int(spec.get("numel") or rows * width)
        return (f"aten::{what}" + ("_backward" if bwd and what != "add" else ""), f"void at::native::{kern}",
                [[numel], [numel]])

    def collective(self, spec: dict, group: str, start: float, dur: float) -> None:
        prim = spec["primitive"]
        dtype = "fp32" if spec["bytes"] == 4 * spec["numel"] else self.dtype  # fp32 main grads, CE partials
        _, torch_name, short = _TORCH_DTYPE[dtype]
        name, kern = _NCCL[prim]
        # a P2P transfer runs on the pipeline group, as Megatron's batch_isend_irecv does: the trace names that group
        n = self.graph.config.pp if group in ("p2p", "pp") else int(spec["group_size"])
        numel = int(spec["numel"])
        nelems_in, nelems_out = {"all_gather": (numel, numel * n), "reduce_scatter": (numel * n, numel)}.get(
            prim, (numel, numel))
        ranks = self.group_ranks(group, n)
        meta = {"Collective name": name, "In msg nelems": nelems_in, "Out msg nelems": nelems_out,
                "Group size": n, "dtype": torch_name, "In split size": "[]", "Out split size": "[]",
                "Process Group Name": str(sorted(GROUP_DESC).index(group) + 1),
                "Process Group Description": self.description(group), "Process Group Ranks": str(ranks)}
        kernel = f"ncclDevKernel_{kern.format(dt=short)}(ncclDevComm*, unsigned long, ncclWork*)"
        self.launch("record_param_comms", kernel, start, dur, STREAMS[group],
                    {**meta, "Input Dims": [[nelems_in]], "Input type": [_TORCH_DTYPE[dtype][0]]}, meta)

    def description(self, group: str) -> str:
        """Megatron's process-group description; without CP the dp·cp group is the data-parallel group itself."""
        if group == "dpcp" and self.graph.config.cp == 1:
            return GROUP_DESC["dp"]
        return GROUP_DESC[group]

    def group_ranks(self, group: str, n: int) -> list[int]:
        c = self.graph.config
        st = strides(c.tp, c.cp, c.dp, c.pp)
        coords = rank_coordinates(self.rank, c.tp, c.cp, c.dp, c.pp)
        if group in ("tp", "cp", "dp"):
            base = self.rank - coords[group] * st[group]
            return [base + i * st[group] for i in range(n)]
        place = self.graph.groups.get(group)
        # dpcp, world and the expert groups: every stride-th
        if group not in ("embd", "p2p", "pp") and place is not None:
            start = self.rank - (self.rank // place.stride % place.size) * place.stride
            return [start + i * place.stride for i in range(n)]
        if group == "embd":
            return [coords["tp"] + coords["cp"] * st["cp"] + coords["dp"] * st["dp"] + s * st["pp"]
                    for s in (0, c.pp - 1)]
        base = self.rank - coords["pp"] * st["pp"]  # p2p: this rank's whole pipeline group
        return [base + s * st["pp"] for s in range(c.pp)]


def _expand(ops: list[OpUse], backward: bool = False) -> Iterator[tuple[OpUse, int | None]]:
    """Per-layer blocks repeated layer by layer, in execution order (a block: consecutive per-layer ops of one kind of
    layer, `OpUse.block`, repeated `count` times): (op, the decoder layer's number within the segment, None for an
    op outside the decoder layers). A segment's backward runs its blocks, and their layers, last first."""
    runs: list[tuple[int, int]] = []  # (start, end) of each op run: one op outside the layers, or one block
    i = 0
    while i < len(ops):
        j = i + 1
        if ops[i].per_layer:
            while j < len(ops) and ops[j].per_layer and ops[j].block == ops[i].block and ops[j].count == ops[i].count:
                j += 1
        runs.append((i, j))
        i = j
    decoder = [(i, j) for i, j in runs if ops[i].per_layer and not str(ops[i].block or "").startswith("mtp")]
    total = sum(ops[i].count for i, _ in decoder)
    offset = total if backward else 0
    for i, j in runs:
        if not ops[i].per_layer:
            yield ops[i], None
            continue
        count = ops[i].count
        numbered = (i, j) in decoder
        if numbered and backward:
            offset -= count
        for layer in range(count):
            number = (offset + (count - 1 - layer if backward else layer)) if numbered else None
            for use in ops[i:j]:
                yield use, number
        if numbered and not backward:
            offset += count


#: Module-path prefixes → the range a forward op runs in (the reference trainer's record_function names).
_UNITS = (("embedding", "embedding"), ("input_layernorm", "attention"), ("self_attention", "attention"),
          ("pre_mlp_layernorm", "mlp"), ("mlp", "mlp"), ("final_layernorm", "output_layer"),
          ("output_layer", "output_layer"), ("loss", "cross_entropy"))


def layer_unit(name: str, layer: int | None) -> str | None:
    """The annotation a forward op of module path `name` runs in: `layer_{layer}/attention` or `/mlp` for the
    transformer layer's ops (`layer` global), `embedding`, `output_layer`, `cross_entropy` outside it; None for an
    op of no module the ranges name."""
    unit = next((u for prefix, u in _UNITS if name == prefix or name.startswith(prefix + ".")), None)
    if unit in ("attention", "mlp"):
        return None if layer is None else f"layer_{layer}/{unit}"
    return unit


def first_layers(graph: Graph) -> dict[tuple[int, int], int]:
    """(stage, chunk) → the global number of its first transformer layer: Megatron numbers the layers along the
    model chunks in the order chunk × pp + stage."""
    c = graph.config
    out, offset = {}, 0
    for chunk in range(c.vp):
        for stage in range(c.pp):
            out[(stage, chunk)] = offset
            offset += graph.segment(stage, chunk).layers
    return out


def rank_trace(prediction: "Prediction", rank: int, iterations: int = 2) -> dict:
    """The Kineto document of one simulated rank (`iterations` identical iterations back to back)."""
    graph, tl, dur = prediction.graph, prediction.timeline, prediction.durations_us
    c = graph.config
    stage = rank_coordinates(rank, c.tp, c.cp, c.dp, c.pp)["pp"]
    w = _Writer(graph, rank, c.precision)
    period = tl.iteration_us
    origin = 1000.0
    first = first_layers(graph)
    schedule = torch_schedule(c)
    split = split_backward(graph, dur) if schedule in SPLIT_BACKWARD else None  # input / weight backward parts
    if split is not None:
        dur = split[0]
    for it in range(iterations):
        t0 = origin + it * period
        for task in tl.tasks[stage]:
            where = segment_of(stage, task.chunk, c.pp, schedule)
            seg = graph.segment(*where)
            ops = seg.fwd if task.kind == "F" else seg.bwd if split is None or task.kind == "B" else \
                split[1][where[0]][where[1]][task.kind == "W"]
            t = t0 + task.start + task.work.other
            for use, layer in _expand(ops, backward=task.kind != "F"):
                d = float(dur[use.spec])
                forward = task.kind == "F" or use.recompute
                w.annotate(layer_unit(use.name, None if layer is None else first[where] + layer)
                           if forward else None)
                w.op(use, "fwd" if forward else "bwd", t, d)
                t += d
            w.annotate(None)
            if task.send and graph.p2p is not None:
                w.op(OpUse("p2p.send", graph.p2p, group="pp"), "comm", t, task.send)
        tail = tl.tails[stage]
        sync_ops = graph.grad_sync[stage]
        for use, (a, b) in zip(sync_ops, tail.sync_intervals):
            w.op(use, "comm", t0 + a, b - a)
        opt = graph.optimizer[stage]
        w.op(opt, "optimizer", t0 + tail.opt_start, tail.opt_end - tail.opt_start)
        t = t0 + tail.opt_end
        if tail.exposed_gather_us:
            for use in graph.param_gather[stage]:
                d = float(dur[use.spec])
                w.op(use, "comm", t, d)
                t += d
        for use, times in graph.reports.get(stage, []):  # the loss report, the logging barrier's share
            d = times * float(dur[use.spec])
            w.op(use, "comm", t, d)
            t += d
        step = {"External id": 0}
        w.events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{it + 1}", "pid": PID,
                         "tid": TID, "ts": t0 - LAUNCH_US - 2.0, "dur": period, "args": dict(step)})
        w.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{it + 1}", "pid": 0,
                         "tid": 7, "ts": t0, "dur": period, "args": dict(step)})
    w.events.sort(key=lambda e: e["ts"])
    meta = [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": PID, "tid": 0, "args": {"name": "tracekit-predict"}},
        {"name": "process_labels", "ph": "M", "ts": 0, "pid": PID, "tid": 0, "args": {"labels": "CPU"}},
        {"name": "process_name", "ph": "M", "ts": 0, "pid": 0, "tid": 0, "args": {"name": "tracekit-predict"}},
        {"name": "process_labels", "ph": "M", "ts": 0, "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"name": "thread_name", "ph": "M", "ts": 0, "pid": PID, "tid": TID, "args": {"name": "thread 4242 (python)"}},
    ] + [{"name": "thread_name", "ph": "M", "ts": 0, "pid": 0, "tid": s, "args": {"name": f"stream {s}"}}
         for s in sorted(set(STREAMS.values()))]
    hw = hardware_spec(graph.hardware)
    device = {"id": 0, "name": f"NVIDIA {prediction.cluster.hardware}", "computeMajor": 9 if w.sm90 else 8,
              "computeMinor": 0}
    if hw is not None:
        device.update(totalGlobalMem=int(hw.memory_gb * 2**30), numSms=hw.sms)
    return {
        "schemaVersion": 1,
        "deviceProperties": [device],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": c.world_size},
        "traceEvents": meta + w.events,
        "traceName": f"tracekit predicted rank {rank}",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_NS,
    }
