"""The events of one predicted rank's Kineto trace as PyTorch's profiler writes them for a CPU run on gloo (what the
reference trainer's CPU captures hold): no device and no kernels; each operator a top-level cpu_op on the main thread
whose own duration is its time (`aten::mm`, `aten::native_layer_norm`, ...); a backward its autograd node
(`autograd::engine::evaluate_function: MmBackward0`) around the aten ops it runs; the optimizer step an
`Optimizer.step#Adam.step` range around its op; each collective gloo's work (`gloo:all_reduce`, `gloo:all_gather`,
`gloo:all_to_all`, `gloo:send`; a reduce-scatter is an all-reduce of the whole buffer, as gloo runs it) on a
`pt_gloo_runloop` thread of its process group, from the `c10d::` call that issues it; the process groups in
`distributedInfo.pg_config`, where a CPU run's trace names them. `extractors.kineto` reads it as it reads a real CPU
run (`extractors.kineto.cpu`), and finds the operators, passes and layers it finds in the same prediction's GPU trace.

Two departures from a real run, both so that the reader times each operator as predicted: the issuing `c10d::` call
sits on the worker thread at the start of its work and takes no time (the predicted timeline may start a collective
under a compute op, where a call on the main thread would be read as that op waiting for it), and a send runs on the
worker thread too (gloo runs it inside its call, on the caller's thread).
"""
from __future__ import annotations

import math

from predictor.ir.graph import Graph
from predictor.ir.ops import OpUse
from predictor.report.kernel_names import DeviceNames
from predictor.report.trace_writer import GROUP_DESC, PID, STREAMS, TID, TORCH_DTYPE, TraceWriter

#: gloo's worker threads: one per process-group stream, at this offset from the stream's number.
GLOO_TID = 20000
#: Collective → (the c10d:: call that issues it, gloo's work).
GLOO = {"all_reduce": ("c10d::allreduce_", "gloo:all_reduce"),
        "all_gather": ("c10d::_allgather_base_", "gloo:all_gather"),
        "reduce_scatter": ("c10d::_reduce_scatter_base_", "gloo:all_reduce"),
        "all_to_all": ("c10d::alltoall_base_", "gloo:all_to_all"),
        "send_recv": ("c10d::send", "gloo:send")}
#: The groups `pg_config` lists with their size (TrainingConfig's degree), besides those the graph communicates in.
DEGREES = {"tp": "tp", "cp": "cp", "dp": "dp", "pp": "pp"}


class CpuTraceWriter(TraceWriter):
    """The events of one rank's CPU trace, appended op by op in time order. An event's `_o` (removed by `finish`)
    keeps parents before their children where both start at the same time."""

    def __init__(self, graph: Graph, rank: int, dtype: str, names: DeviceNames | None = None):
        super().__init__(graph, rank, dtype, names)
        self.order = 0
        self.block_order = 0
        self.used: set[str] = set()  # process groups communicated in

    def _next(self) -> int:
        self.order += 1
        return self.order

    def _event(self, name: str, start: float, dur: float, args: dict | None = None, cat: str = "cpu_op",
               tid: int = TID) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": start, "dur": dur,
                            "args": {"External id": self.next_id, "Record function id": 0, **(args or {})},
                            "_o": self._next()})
        self.next_id += 1

    def _block_event(self, label: str, start: float) -> dict:
        """As the GPU writer's, the range spanning its operators exactly (they run back to back), in its order."""
        return {"ph": "X", "cat": "user_annotation", "name": label, "pid": PID, "tid": TID, "ts": start,
                "dur": span(start, self.cpu_free), "args": {"External id": 0}, "_o": self.block_order}

    def _main(self, start: float, dur: float) -> tuple[float, float]:
        """An operator on the main thread at [start, start + dur), after the one before it (the simulated timeline's
        sums may put it a rounding error earlier): (start, duration) as written. It opens the pending layer range."""
        end = start + max(dur, 0.001)
        start = max(start, self.cpu_free)
        dur = span(start, max(end, start + 0.001))
        if self.pending:
            self.block, self.block_order, self.pending = (self.pending, start), self._next(), None
        self.cpu_free = start + dur
        return start, dur

    # -- one operator instance ---------------------------------------------------------------------------------
    def op(self, use: OpUse, pass_: str, start: float, dur: float, role: str | None = None) -> None:
        """One op of the timeline (`role`: as `TraceWriter.op`'s)."""
        spec = self.graph.specs[use.spec]
        if use.group:
            self.collective(spec, use.group, start, dur)
            return
        start, dur = self._main(start, dur)
        torch_t = TORCH_DTYPE[self.dtype][0]
        if pass_ == "optimizer":
            self._event("Optimizer.step#Adam.step", start, dur, cat="user_annotation")
            self._event("aten::_fused_adam_", start, dur,
                        {"Input Dims": [[int(spec.get("params") or 0)]], "Input type": ["float"]})
            return
        forward, node, children = cpu_names(spec, role or (spec.get("role") if pass_ == "bwd" else None))
        if pass_ != "bwd":
            name, dims = forward
            self._event(name, start, dur, {"Input Dims": dims, "Input type": [torch_t] * len(dims)})
            return
        self._event(f"autograd::engine::evaluate_function: {node}", start, dur)
        share = dur / max(len(children), 1)
        for i, (name, dims) in enumerate(children):  # inside the node, its time shared out
            begin = start + i * share
            end = self.cpu_free if i == len(children) - 1 else start + (i + 1) * share
            self._event(name, begin, span(begin, end), {"Input Dims": dims, "Input type": [torch_t] * len(dims)})

    def collective(self, spec: dict, group: str, start: float, dur: float) -> None:
        prim = spec["primitive"]
        dtype = "fp32" if spec["bytes"] == 4 * spec["numel"] else self.dtype
        torch_t = TORCH_DTYPE[dtype][0]
        n = self.graph.config.pp if group in ("p2p", "pp") else int(spec["group_size"])
        numel = int(spec["numel"])
        call, work = GLOO[prim]
        self.used.add(group)
        tid = GLOO_TID + STREAMS[group]
        if prim in ("all_reduce", "send_recv"):  # a TensorList argument
            call_dims: list = [[[numel]], [], [], [], [], []] if prim == "all_reduce" else [[[numel]], [], [], []]
            call_types = ["TensorList"] + [""] * (len(call_dims) - 1)
        else:
            out, inp = {"all_gather": (numel * n, numel), "reduce_scatter": (numel, numel * n)}.get(prim,
                                                                                                     (numel, numel))
            call_dims, call_types = [[out], [inp], [], [], []], [torch_t, torch_t, "", "", ""]
        work_dims = [[numel * n]] if prim == "reduce_scatter" else [[numel]]
        self._event(call, start, 0.0, {"Input Dims": call_dims, "Input type": call_types}, tid=tid)
        self._event(work, start, max(dur, 0.001), {"Input Dims": work_dims, "Input type": [torch_t]},
                    cat="user_annotation", tid=tid)

    # -- the document around the events -------------------------------------------------------------------------
    def step(self, number: int, t0: float, period: float) -> None:
        """The `ProfilerStep#number` range of one iteration drawn from t0 (its operators run inside it)."""
        self.events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "pid": PID,
                            "tid": TID, "ts": t0, "dur": period, "args": {"External id": 0}, "_o": 0})

    def finish(self) -> list[dict]:
        self.events.sort(key=lambda e: (e["ts"], e["_o"]))
        for event in self.events:
            del event["_o"]
        return self.events

    def metadata(self) -> list[dict]:
        """The one process, its main thread and gloo's worker threads."""
        threads = [(TID, "python")] + [(GLOO_TID + s, "pt_gloo_runloop") for s in
                                       sorted({STREAMS[g] for g in self.used})]
        return [
            {"name": "process_name", "ph": "M", "ts": 0, "pid": PID, "tid": 0, "args": {"name": "tracekit-predict"}},
            {"name": "process_labels", "ph": "M", "ts": 0, "pid": PID, "tid": 0, "args": {"labels": "CPU"}},
        ] + [{"name": "thread_name", "ph": "M", "ts": 0, "pid": PID, "tid": tid,
              "args": {"name": f"thread {tid} ({what})"}} for tid, what in threads]

    def distributed_info(self) -> dict:
        """The backend, this rank, the world and its process groups (Megatron's descriptions, sizes and ranks)."""
        c = self.graph.config
        sizes = {group: getattr(c, degree) for group, degree in DEGREES.items()}
        groups = [("world", c.world_size)] + [(g, n) for g, n in sizes.items()]
        groups += [(g, int(self.graph.groups[g].size)) for g in sorted(self.used - set(sizes) - {"world"})
                   if g in self.graph.groups and g in GROUP_DESC]
        config: list[dict] = []
        for group, n in groups:
            desc = self.description(group)
            if any(entry["pg_desc"] == desc for entry in config):
                continue
            config.append({"pg_name": str(len(config)), "pg_desc": desc, "backend_config": "cpu:gloo,cuda:gloo",
                           "pg_size": n, "ranks": self.group_ranks(group, n)})
        return {"backend": self.names.backend, "rank": self.rank, "world_size": c.world_size,
                "pg_count": len(config), "pg_config": config}


def span(start: float, end: float) -> float:
    """The duration that ends an event starting at `start` no later than `end` in floating point (a range that
    overran the next operator by a rounding error would be read as holding it)."""
    dur = max(end - start, 0.0)
    while dur > 0 and start + dur > end:
        dur = math.nextafter(dur, 0.0)
    return dur


def cpu_names(spec: dict, role: str | None) -> tuple[tuple[str, list], str, list[tuple[str, list]]]:
    """(the forward op and its input shapes, the backward's autograd node, the ops the node runs with theirs) of one
    operator spec as PyTorch runs it on a CPU; `role` names the part of a split backward (dgrad, wgrad, bgrad; None:
    the whole backward)."""
    prim, variant = spec["primitive"], spec.get("variant")
    rows, width = int(spec.get("rows") or 0), int(spec.get("width") or 0)
    if prim in ("gemm", "bmm"):
        m, n, k = int(spec["m"]), int(spec["n"]), int(spec["k"])
        lead = [int(spec.get("batch") or 1)] if prim == "bmm" else []
        op = "aten::mm" if prim == "gemm" else ("aten::baddbmm" if variant == "baddbmm" else "aten::bmm")
        node = {"aten::mm": "MmBackward0", "aten::bmm": "BmmBackward0", "aten::baddbmm": "BaddbmmBackward0"}[op]
        child = "aten::bmm" if prim == "bmm" else "aten::mm"
        dgrad = (child, [lead + [m, n], lead + [n, k]])
        wgrad = (child, [lead + [k, m], lead + [m, n]])
        if role == "bgrad":  # the bias gradient: dY summed over its rows
            return (op, [lead + [m, k], lead + [k, n]]), "SumBackward0", [("aten::sum", [[m, n]])]
        parts = {"dgrad": [dgrad], "wgrad": [wgrad]}.get(str(role), [dgrad, wgrad])
        return (op, [lead + [m, k], lead + [k, n]]), node, parts
    if prim == "attention":
        b, a, s, d = (int(spec[k]) for k in ("batch", "heads", "seq", "head_dim"))
        op = "aten::_scaled_dot_product_flash_attention_for_cpu"
        return (op, [[b, a, s, d]] * 3), "ScaledDotProductFlashAttentionForCpuBackward0", [(op + "_backward",
                                                                                            [[b, a, s, d]] * 4)]
    if prim == "softmax":
        b, a, s = int(spec["batch"]), int(spec["heads"]), int(spec["seq"])
        return ("aten::_softmax", [[b * a, s, s]]), "SoftmaxBackward0", [("aten::_softmax_backward_data",
                                                                          [[b * a, s, s]] * 2)]
    if prim == "norm":
        op = "aten::_fused_rms_norm" if variant == "RMSlayernorm" else "aten::native_layer_norm"
        node = "FusedRmsNormBackward0" if variant == "RMSlayernorm" else "NativeLayerNormBackward0"
        return (op, [[rows, width]]), node, [(op + "_backward", [[rows, width]] * 2)]
    if prim == "activation":
        act = "silu" if variant == "swiglu" else "gelu"
        return (f"aten::{act}", [[rows, width]]), f"{act.title()}Backward0", [(f"aten::{act}_backward",
                                                                                [[rows, width]] * 2)]
    if prim == "embedding":
        return (("aten::embedding", [[int(spec["params"]), width], [rows]]), "EmbeddingBackward0",
                [("aten::embedding_dense_backward", [[rows, width], [rows]])])
    if prim == "cross_entropy":
        return (("aten::cross_entropy_loss", [[rows, width], [rows]]), "NllLossBackward0",
                [("aten::nll_loss_backward", [[], [rows, width], [rows]])])
    what = {"res_add": "add", "dropout": "native_dropout", "RoPE": "mul"}.get(str(variant), "add")
    numel = int(spec.get("numel") or rows * width)
    node = {"add": "AddBackward0", "native_dropout": "NativeDropoutBackward0", "mul": "MulBackward0"}[what]
    child = {"add": "aten::add", "native_dropout": "aten::native_dropout_backward", "mul": "aten::mul"}[what]
    return (f"aten::{what}", [[numel], [numel]]), node, [(child, [[numel], [numel]])]
