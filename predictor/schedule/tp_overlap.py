"""The tensor-parallel collectives a column-parallel linear's backward runs beside its own GEMMs.

Megatron's linear (`LinearWithGradAccumulationAndAsyncCommunication`, megatron/core/tensor_parallel/layers.py) and
Transformer Engine's issue the backward's collectives asynchronously and compute while they run (with
CUDA_DEVICE_MAX_CONNECTIONS=1, which Megatron asserts with tensor parallelism before Blackwell, the collective is
queued before the GEMM): without sequence parallelism the input gradient's all-reduce runs beside the
weight-gradient GEMM; with it, the re-gather of the layer's input beside the input-gradient GEMM and the input
gradient's reduce-scatter beside the weight-gradient GEMM. A collective so placed costs the pass only its time beyond
that GEMM's. Transformer Engine's userbuffers (`tp_comm_overlap` with sequence parallelism) hide the layer's TP
collectives under all its GEMMs instead (`predictor.schedule.stage_work.Hiding.tp_cover`).

Not modelled: the SMs and memory bandwidth NCCL's kernels take from the GEMM beside them (the GEMM is timed as if
alone), the output layer's own pair (its collective stays exposed; with `defer_embedding_wgrad_compute` its weight
gradient leaves the pass). Whether a run overlaps is `async_tensor_model_parallel_allreduce`
(tracekit.core.runtime: on unless a profile or the input says otherwise); not on a CPU (the reference trainer's
gloo collectives), nor with a schedule that runs the weight gradients as tasks of their own (PyTorch's zero-bubble
schedules: torchtitan, whose profile has it off anyway).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from predictor.ir.graph import Graph
from predictor.ir.ops import OpUse, part_share
from tracekit.core.pipeline_layout import SPLIT_BACKWARD, torch_schedule
from tracekit.core.runtime import RuntimeSettings

#: A column-parallel linear's backward collective (its name's suffix, predictor.ir.ops.OpBuilder.tp_in) → the part
#: of the linear's GEMM backward it runs beside.
BESIDE = {".grad_all_reduce": "wgrad", ".grad_reduce_scatter": "wgrad", ".input_all_gather": "dgrad"}
PARTS = ("dgrad", "wgrad")


def applies(graph: Graph) -> bool:
    """Whether the graph's run overlaps its linears' backward collectives with their GEMMs (module docstring)."""
    c = graph.config
    run = c.run or RuntimeSettings()
    ub = c.tp_comm_overlap and c.sequence_parallel  # Transformer Engine's userbuffers hide them their own way
    return c.tp > 1 and run.tp_backward_overlap and not ub and not graph.hardware.startswith("cpu-") \
        and torch_schedule(c) not in SPLIT_BACKWARD


def covered(name: str) -> tuple[str, str] | None:
    """(the linear, the part of its GEMM backward) a backward collective named `name` runs beside, or None."""
    for suffix, part in BESIDE.items():
        if name.endswith(suffix):
            return name[: -len(suffix)], part
    return None


def hidden_us(ops: Sequence[OpUse], dur: np.ndarray, specs: Sequence[dict[str, Any]]) -> dict[int, float]:
    """Per index into `ops` (one pass of a segment), the µs of a decoder layer's column-parallel backward collective
    that runs beside its linear's GEMM: up to that GEMM part's time. A backward lists each linear's GEMM before its
    collectives (predictor.assembly.graph mirrors the forward), so each pairs with the latest GEMM of its linear in
    its layer block: a role's own op (dgrad, wgrad), or half of a whole backward (`part_share`)."""
    latest: dict[tuple[str, int, str, str], float] = {}  # (block, count, linear, part) → µs
    out = {}
    for i, op in enumerate(ops):
        if not op.per_layer:
            continue
        spec = specs[op.spec]
        if op.group is None and spec.get("primitive") == "gemm" and spec.get("pass") == "bwd":
            for part in PARTS:
                share = part_share(spec.get("role"), part)
                if share:
                    latest[(op.block, op.count, op.name, part)] = share * float(dur[op.spec])
            continue
        pair = covered(op.name) if op.group == "tp" else None
        key = None if pair is None else (op.block, op.count, *pair)
        if key in latest:
            out[i] = min(float(dur[op.spec]), latest[key])
    return out
