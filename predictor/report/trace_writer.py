"""The events of one predicted rank's Kineto trace as PyTorch's profiler writes them on a GPU: for each kernel its
launching cpu_op (inside autograd's or the optimizer's op, as PyTorch nests them), the cudaLaunchKernel, the kernel on
its stream and the flow between them; collectives as the communication library's kernels with their
record_param_comms; the layer annotations around the ops (`predictor.report.trace_out` orders the ops and writes the
files). Kernels are named as the predicted hardware's libraries name them (`predictor.report.kernel_names`); a CPU's
trace is `predictor.report.cpu_trace_writer`'s."""
from __future__ import annotations

from predictor.ir.graph import Graph
from predictor.ir.ops import OpUse
from predictor.ir.placement import order_of, rank_coordinates, strides
from predictor.report.kernel_names import DeviceNames, device_names
from tracekit.core.precision import recipe

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
NCCL = {"all_reduce": ("allreduce", "AllReduce_Sum_{dt}_RING_LL"), "all_gather": ("_allgather_base",
         "AllGather_RING_LL"), "reduce_scatter": ("_reduce_scatter_base", "ReduceScatter_Sum_{dt}_RING_LL"),
         "send_recv": ("send", "SendRecv"), "all_to_all": ("all_to_all", "SendRecv")}
TORCH_DTYPE = {"fp16": ("c10::Half", "Half", "f16"), "bf16": ("c10::BFloat16", "BFloat16", "bf16"),
                "fp32": ("float", "Float", "f32"),
                **{d: ("c10::Float8_e4m3fn", "Float8_e4m3fn", "f8") for d in ("fp8", "fp8_block", "mxfp8")},
                **{d: ("c10::Float4_e2m1fn_x2", "Float4_e2m1fn_x2", "f4") for d in ("nvfp4", "mxfp4")}}


class TraceWriter:
    """The events of one rank's trace, appended op by op in time order."""

    def __init__(self, graph: Graph, rank: int, dtype: str, names: DeviceNames | None = None):
        self.graph = graph
        self.rank = rank
        self.events: list[dict] = []
        self.next_id = 1
        self.cpu_free = 0.0
        self.dtype = dtype if dtype in TORCH_DTYPE else recipe(dtype).gemm_dtype  # fp8-cs: its GEMMs' fp8
        self.names = names or device_names(graph.hardware)
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
            self.events.append(self._block_event(*self.block))
            self.block = None
        self.pending = name

    def _block_event(self, label: str, start: float) -> dict:
        """The closed layer annotation's event: to 0.25 µs after the last launch."""
        return {"ph": "X", "cat": "user_annotation", "name": label, "pid": PID, "tid": TID, "ts": start,
                "dur": self.cpu_free + 0.25 - start, "args": {"External id": 0}}

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
    def op(self, use: OpUse, pass_: str, start: float, dur: float, role: str | None = None) -> None:
        """One op of the timeline; `role` names the part of a GEMM's backward it is where its spec is the whole
        backward (the deferred output-layer weight gradients)."""
        spec = self.graph.specs[use.spec]
        prim = spec["primitive"]
        self.parent = {"bwd": f"autograd::engine::evaluate_function: {prim.title()}Backward0",
                       "optimizer": "Optimizer.step#FusedAdam.step"}.get(pass_)
        if use.group:
            self.collective(spec, use.group, start, dur)
            return
        torch_t = TORCH_DTYPE[self.dtype][0]
        if prim in ("gemm", "bmm"):
            m, n, k = int(spec["m"]), int(spec["n"]), int(spec["k"])
            b = int(spec.get("batch") or 1)
            name = "aten::mm" if prim == "gemm" else ("aten::baddbmm" if spec["variant"] == "baddbmm" else "aten::bmm")
            shapes = ([[m, k], [k, n]], [[m, n], [n, k]], [[n, m], [m, k]]) if prim == "gemm" else \
                ([[b, m, k], [b, k, n]], [[b, m, n], [b, n, k]], [[b, k, m], [b, m, n]])
            kernel = self.gemm_kernel()
            role = role or (spec.get("role") if pass_ == "bwd" else None)
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
        return self.names.gemm_kernel(self.dtype)

    def compute_names(self, spec: dict, pass_: str) -> tuple[str, str, list]:
        prim, variant = spec["primitive"], spec["variant"]
        bwd = pass_ == "bwd"
        half = TORCH_DTYPE[self.dtype][0]
        rows, width = int(spec.get("rows") or 0), int(spec.get("width") or 0)
        if prim == "attention":
            b, a, s, d = (int(spec[k]) for k in ("batch", "heads", "seq", "head_dim"))
            op, kernel = self.names.attention(self.dtype, bwd)
            return op, kernel, [[b, s, a, d]] * 3
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
        _, torch_name, short = TORCH_DTYPE[dtype]
        name, kern = NCCL[prim]
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
        kernel = self.names.collective_kernel(kern.format(dt=short))
        self.launch("record_param_comms", kernel, start, dur, STREAMS[group],
                    {**meta, "Input Dims": [[nelems_in]], "Input type": [TORCH_DTYPE[dtype][0]]}, meta)

    # -- the document around the events -------------------------------------------------------------------------
    def step(self, number: int, t0: float, period: float) -> None:
        """The `ProfilerStep#number` of one iteration drawn from t0: the CPU range around its launches and the GPU
        range of its kernels."""
        step = {"External id": 0}
        self.events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "pid": PID,
                            "tid": TID, "ts": t0 - LAUNCH_US - 2.0, "dur": period, "args": dict(step)})
        self.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{number}", "pid": 0,
                            "tid": 7, "ts": t0, "dur": period, "args": dict(step)})

    def finish(self) -> list[dict]:
        """The events in time order."""
        self.events.sort(key=lambda e: e["ts"])
        return self.events

    def metadata(self) -> list[dict]:
        """Process and thread names: the host process and its thread, the device and its streams."""
        return [
            {"name": "process_name", "ph": "M", "ts": 0, "pid": PID, "tid": 0, "args": {"name": "tracekit-predict"}},
            {"name": "process_labels", "ph": "M", "ts": 0, "pid": PID, "tid": 0, "args": {"labels": "CPU"}},
            {"name": "process_name", "ph": "M", "ts": 0, "pid": 0, "tid": 0, "args": {"name": "tracekit-predict"}},
            {"name": "process_labels", "ph": "M", "ts": 0, "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
            {"name": "thread_name", "ph": "M", "ts": 0, "pid": PID, "tid": TID,
             "args": {"name": "thread 4242 (python)"}},
        ] + [{"name": "thread_name", "ph": "M", "ts": 0, "pid": 0, "tid": s, "args": {"name": f"stream {s}"}}
             for s in sorted(set(STREAMS.values()))]

    def distributed_info(self) -> dict:
        """`distributedInfo`: the backend, this rank and the world."""
        return {"backend": self.names.backend, "rank": self.rank, "world_size": self.graph.config.world_size}

    def description(self, group: str) -> str:
        """Megatron's process-group description; without CP the dp·cp group is the data-parallel group itself."""
        if group == "dpcp" and self.graph.config.cp == 1:
            return GROUP_DESC["dp"]
        return GROUP_DESC[group]

    def group_ranks(self, group: str, n: int) -> list[int]:
        c = self.graph.config
        order = order_of(c)
        st = strides(c.tp, c.cp, c.dp, c.pp, order)
        coords = rank_coordinates(self.rank, c.tp, c.cp, c.dp, c.pp, order)
        if group in ("tp", "cp", "dp"):
            base = self.rank - coords[group] * st[group]
            return [base + i * st[group] for i in range(n)]
        place = self.graph.groups.get(group)
        # dpcp, world and the expert groups: every stride-th (dpcp over two axes in the tp-pp-dp order)
        if group not in ("embd", "p2p", "pp") and place is not None:
            return place.members(self.rank)[:n]
        if group == "embd":
            return [coords["tp"] + coords["cp"] * st["cp"] + coords["dp"] * st["dp"] + s * st["pp"]
                    for s in (0, c.pp - 1)]
        base = self.rank - coords["pp"] * st["pp"]  # p2p: this rank's whole pipeline group
        return [base + s * st["pp"] for s in range(c.pp)]
