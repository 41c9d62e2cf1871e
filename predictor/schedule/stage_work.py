"""The schedule simulation's inputs of one prepared graph: each pipeline segment's forward and backward work for
one micro-batch (compute, blocking communication, other), and per stage the gradient-sync buckets, the embedding
sync, the optimizer step and the parameter gather. Megatron-core's own costs (`predictor.schedule.framework_costs`):
what CUDA graphs capture costs no host time per op; the per-parameter passes and timers the run asks for add to the
backward (per micro-batch) and to the optimizer step (per iteration).

    simulation_inputs(graph, est, cal) -> (calibrated µs per spec, (fwd, bwd, micro-batches, options))
    simulate_graph(graph, est, cal) -> (calibrated µs per spec, fwd, bwd, Timeline): one graph on its own (what
        calibration fitting repeats)

With one of PyTorch's zero-bubble schedules (`torch_pipeline_schedule`, predictor.schedule.zero_bubble) the backward is
split (`split_backward`): bwd holds the input part and the options a `wgrad` work per segment, the weight part.
"""
from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from predictor.costs.estimates import calibrated_durations
from predictor.ir.graph import Graph
from predictor.ir.ops import OpUse, part_share
from predictor.parallel import fsdp
from predictor.schedule import tp_overlap
from predictor.schedule.activation_offload import forward_exposed_us, segment_copies
from predictor.schedule.ep_overlap import alone_share, with_alone_passes
from predictor.schedule.framework_costs import SYNC_US, Capture, PassCosts, capture, pass_costs
from predictor.schedule.pipeline import Work
from predictor.schedule.zero_bubble import simulate_jobs
from tracekit.core.pipeline_layout import SPLIT_BACKWARD, torch_schedule
from tracekit.core.runtime import deferred_share

if TYPE_CHECKING:
    from predictor.costs.estimates import Estimates
    from predictor.schedule.pipeline import Timeline
    from tracekit.core.calibration import Calibration


#: Collectives of the expert layers: token dispatch and combine (EP), the experts' tensor parallelism, the
#: all-gather dispatcher's group.
EXPERT_GROUPS = ("ep", "etp", "tpep")


@dataclass
class Hiding:
    """Which blocking collectives of a layer pass run beside its compute (per spec masks over the graph's specs):
    TP collectives under the GEMMs with Transformer Engine's TP overlap (`tp_cover`: the GEMM specs); a column-parallel
    linear's backward collectives beside its own GEMMs (`tp_beside`, predictor.schedule.tp_overlap); the expert
    layers' dispatch and combine under the pass's compute with `overlap_moe_expert_parallel_comm` (`ep_all`), or under
    the shared experts' compute with `moe_shared_expert_overlap` (`ep_cover`: their specs)."""

    tp_cover: np.ndarray | None = None
    # the graph's specs where a column-parallel linear's backward collectives run beside its GEMMs (tp_overlap)
    tp_beside: Sequence[dict[str, Any]] | None = None
    ep_all: bool = False
    ep_cover: np.ndarray | None = None
    fsdp_overlap: bool = True  # FSDP's collectives beside the layers' compute (predictor.parallel.fsdp; not on a CPU)


@dataclass
class _Block:
    compute: float = 0.0
    ops: int = 0
    tp: float = 0.0
    ep: float = 0.0
    other_comm: float = 0.0
    tp_cover: float = 0.0
    ep_cover: float = 0.0
    regions: set[int] = field(default_factory=set)  # CUDA-graph regions its captured ops belong to
    fsdp: float = 0.0
    syncs: int = 0  # device synchronisations its host-issued ops make (predictor.layers.moe.host_syncs)


def _work(ops: list[OpUse], dur: np.ndarray, cal: Calibration, framework_us: float = 0.0,
          hiding: Hiding | None = None, graphs: Capture | None = None, passes: tuple[float, float, float] = (0, 0, 0)
          ) -> Work:
    """One micro-batch of a segment's forward or backward. Each layer block (the layers of one kind, `OpUse.block`,
    `count` of them) is summed once and multiplied by its count. A layer pass's compute lasts at least the host time to
    issue its compute operators (`host_op_us` each: a launch-bound layer waits on the CPU); the excess, and the
    framework time per compute operator no device hides (sampled: `framework_us`, plus the calibration's
    `op_overhead_us`), count as `other`. Blocking collectives add to it, except those `hiding` lets run beside the
    pass's compute: a layer pass then exposes only their time beyond the compute that covers them. Ops a CUDA graph
    captures (`graphs`) cost no host time; each captured region of a layer costs one host op (its launch); a graph
    of the full iteration takes the per-call overhead too. A device synchronisation of a host-issued op
    (`predictor.layers.moe.host_syncs`) makes the device idle for the sync's return and the next op's issue
    (`SYNC_US` + `host_op_us`) and costs the host `SYNC_US`: a layer pass lasts max(compute + idle, host); outside
    the layers (the loss function's checks, `tracekit.core.runtime.result_checks`) the idle time adds to the call's.
    `passes`: (device µs, host µs beyond it, fixed µs) of the per-parameter passes and timers of this call
    (`predictor.schedule.framework_costs`)."""
    compute = comm = root_fsdp = 0.0
    other_ops = other_syncs = 0
    blocks: dict[tuple[str, int], _Block] = {}
    hide = hiding or Hiding()
    cap = graphs or Capture()
    full, per_layer_graphs = cap.full, cap.whole_layer or bool(cap.regions)
    beside = tp_overlap.hidden_us(ops, dur, hide.tp_beside) if hide.tp_beside is not None else {}
    for i, op in enumerate(ops):
        t = float(dur[op.spec])
        if op.per_layer:
            blk = blocks.setdefault((op.block, op.count), _Block())
            if op.group in EXPERT_GROUPS:
                blk.ep += t
            elif op.group == "tp":
                blk.tp += t - beside.get(i, 0.0)
            elif op.group in fsdp.GROUPS:
                blk.fsdp += t
            elif op.group:
                blk.other_comm += t
            else:
                blk.compute += t
                region = cap.region(op) if per_layer_graphs else None
                if region is not None:
                    blk.regions.add(region)
                elif not full:
                    blk.ops += 1 if op.launch else 0
                    blk.syncs += op.syncs
                if hide.tp_cover is not None and hide.tp_cover[op.spec]:
                    blk.tp_cover += t
                if hide.ep_cover is not None and hide.ep_cover[op.spec]:
                    blk.ep_cover += t
        elif op.group in fsdp.GROUPS:
            root_fsdp += op.count * t
        elif op.group:
            comm += op.count * t
        else:
            compute += op.count * t
            other_ops += 0 if full or not op.launch else op.count
            other_syncs += 0 if full else op.count * op.syncs
    other = (0.0 if full else cal.microbatch_overhead_us) + (framework_us + cal.op_overhead_us) * other_ops \
        + (SYNC_US + cal.host_op_us) * other_syncs  # the device idles for each sync's return and the next issue
    for (_, count), blk in blocks.items():
        tp = max(0.0, blk.tp - blk.tp_cover) if hide.tp_cover is not None else blk.tp
        ep = max(0.0, blk.ep - (blk.compute if hide.ep_all else blk.ep_cover))
        compute += blk.compute * count
        comm += (tp + ep + blk.other_comm) * count
        host = cal.host_op_us * (blk.ops + len(blk.regions)) + SYNC_US * blk.syncs
        idle = (SYNC_US + cal.host_op_us) * blk.syncs  # the device waits for each sync's return and the next issue
        other += (max(idle, host - blk.compute) + (framework_us + cal.op_overhead_us) * blk.ops) * count
    comm += fsdp.exposed_us([(blk.fsdp, blk.compute, count) for (_, count), blk in blocks.items()], root_fsdp,
                            hide.fsdp_overlap)
    device, host, fixed = passes
    return Work(compute + device, comm, other + host + fixed)


def hiding_of(graph: Graph) -> Hiding:
    """What the configuration lets run beside compute (`Hiding`)."""
    c = graph.config
    tp = np.array([s["primitive"] == "gemm" for s in graph.specs]) \
        if c.tp_comm_overlap and c.sequence_parallel else None  # TE overlaps TP comm only with SP
    moe = c.moe
    ep_all = bool(moe and moe.overlap_moe_expert_parallel_comm)
    ep_cover = None
    if moe and moe.moe_shared_expert_overlap and not ep_all:
        shared = {o.spec for seg in graph.segments for o in seg.fwd + seg.bwd
                  if o.group is None and o.name.startswith("mlp.shared_experts")}
        ep_cover = np.isin(np.arange(len(graph.specs)), list(shared))
    # FSDP's gathers run beside compute (Megatron-FSDP only when asked to overlap them); not on a CPU
    mfsdp = c.sharding is not None and c.sharding.sharded_data_parallel == "megatron-fsdp"
    overlap = not graph.hardware.startswith("cpu-") and (not mfsdp or c.overlap_param_gather or c.overlap_grad_reduce)
    beside = graph.specs if tp_overlap.applies(graph) else None
    return Hiding(tp, beside, ep_all, ep_cover, overlap)


def simulation_inputs(graph: Graph, est: Estimates, cal: Calibration) -> tuple[np.ndarray, tuple]:
    """Calibrated durations and the schedule simulation's job (fwd, bwd, micro-batches, options) of one graph."""
    c = graph.config
    pp, vp = c.pp, c.vp
    dur = calibrated_durations(graph, est, cal)
    hiding = hiding_of(graph)
    graphs, passes = capture(c), _passes(graph)
    call = passes.call_fixed_us
    fwd = [[_work(graph.segment(s, k).fwd, dur, cal, est.framework_us.get("fwd", 0.0), hiding, graphs,
                  (0.0, 0.0, call)) for k in range(vp)] for s in range(pp)]
    schedule = torch_schedule(c)
    # a split-backward schedule runs the input part as the backward and the weight part as its own task (wgrad)
    split = split_backward(graph, dur) if schedule in SPLIT_BACKWARD else None
    bwd_dur = dur if split is None else split[0]
    # fine-grained activation offloading: the copies back the backward waits for, the copies out beyond the work
    offload = [[segment_copies(c, graph.hardware, graph.segment(s, k).bwd, dur) for k in range(vp)] for s in range(pp)]
    bwd = [[_work(graph.segment(s, k).bwd if split is None else split[1][s][k][0], bwd_dur, cal,
                  est.framework_us.get("bwd", 0.0), hiding, graphs,
                  (*passes.backward_us(s, k, cal.tensor_op_us), call + offload[s][k][1]))
            for k in range(vp)] for s in range(pp)]
    unit = est.fsdp_unit_us  # torch FSDP2's hooks per unit (host time, in `other`; predictor.parallel.fsdp)
    for s in range(pp):
        for k in range(vp):
            out = forward_exposed_us(offload[s][k][0], fwd[s][k].compute + bwd[s][k].compute)
            if unit:
                out += unit.get("fwd", 0.0) * fsdp.hooked_units(graph.segment(s, k).fwd, True)
                bwd[s][k] = dataclasses.replace(bwd[s][k], other=bwd[s][k].other + unit.get("bwd", 0.0) *
                                                fsdp.hooked_units(graph.segment(s, k).bwd, False))
            if out:
                fwd[s][k] = dataclasses.replace(fwd[s][k], other=fwd[s][k].other + out)
    bucket_ops = [[o for o in graph.grad_sync[s] if o.group in ("dpcp", "edp", *fsdp.GROUPS)] for s in range(pp)]
    buckets = [[float(dur[o.spec]) for o in ops] for ops in bucket_ops]
    embd = [float(sum(dur[o.spec] for o in graph.grad_sync[s] if o.group == "embd")) for s in range(pp)]
    optimizer = [step_us(graph, dur, s) + passes.iteration_us(s, cal.tensor_op_us, cal.host_op_us) for s in range(pp)]
    gather = [float(sum(dur[o.spec] for o in graph.param_gather[s])) for s in range(pp)]
    report = [float(sum(times * dur[o.spec] for o, times in graph.reports.get(s, []))) for s in range(pp)]
    extra: dict = {"pipeline_schedule": schedule} if schedule else {}
    share = alone_share(c) if hiding.ep_all and split is None else 0.0
    if share:  # the combined 1F1B schedule's first forward and last backward expose their EP collectives
        bare = dataclasses.replace(hiding, ep_all=False)
        fwd = [[with_alone_passes(fwd[s][k], _work(graph.segment(s, k).fwd, dur, cal, est.framework_us.get("fwd", 0.0),
                                                   bare, graphs, (0.0, 0.0, call)), share)
                for k in range(vp)] for s in range(pp)]
        bwd = [[with_alone_passes(bwd[s][k], _work(graph.segment(s, k).bwd, dur, cal, est.framework_us.get("bwd", 0.0),
                                                   bare, graphs, (*passes.backward_us(s, k, cal.tensor_op_us),
                                                                  call + offload[s][k][1])),
                                  share)
                for k in range(vp)] for s in range(pp)]
    if split is not None:
        extra["wgrad"] = [[_work(weight_ops, bwd_dur, cal, est.framework_us.get("bwd", 0.0), hiding, graphs,
                                 (0.0, 0.0, call)) for _, weight_ops in row] for row in split[1]]
    drain = deferred_wgrad_us(graph, dur)
    if drain:  # the last stage's output layer leaves its weight gradients to the flush: on average per micro-batch
        last = bwd[pp - 1][vp - 1]
        bwd[pp - 1][vp - 1] = dataclasses.replace(last, compute=last.compute - drain / c.num_microbatches)
        extra["drain_us"] = [0.0] * (pp - 1) + [drain]
    options = dict(
        p2p_us=hand_over_us(graph, dur),
        grad_buckets_us=buckets, overlap_grad=c.overlap_grad_reduce, embedding_sync_us=embd,
        grad_bucket_chunks=[[o.chunk for o in ops] for ops in bucket_ops],
        optimizer_us=optimizer, param_gather_us=gather, overlap_param_gather=c.overlap_param_gather, report_us=report,
        iteration_overhead_us=cal.iteration_overhead_us, overlap_p2p=c.overlap_p2p_comm and vp > 1,
        p2p_edges_block=not (c.run and c.run.overlap_p2p_comm_warmup_flush),
        microbatch_group=c.microbatch_group, **extra,
    )
    return dur, (fwd, bwd, c.num_microbatches, options)


def head_wgrad_parts(graph: Graph, dur: np.ndarray) -> list[tuple[OpUse, float]]:
    """Each output-layer GEMM backward of one micro-batch on the last stage (the main output's and each MTP depth's)
    with its weight-gradient part (µs): a `wgrad` row whole, a whole backward half (the weight part is one forward's
    FLOPs of the two, as `split_backward` halves it), a `dgrad` row none."""
    seg = graph.segment(graph.config.pp - 1, graph.config.vp - 1)
    out = []
    for o in seg.bwd:
        spec = graph.specs[o.spec]
        if spec["primitive"] == "gemm" and (o.name == "output_layer" or o.name.endswith(".output_layer")):
            out.append((o, float(dur[o.spec]) * part_share(spec.get("role"), "wgrad")))
    return out


def deferred_wgrad_us(graph: Graph, dur: np.ndarray) -> float:
    """The output-layer weight gradients the last stage computes in the pipeline flush under
    `defer_embedding_wgrad_compute` (µs per iteration; 0 without it): the deferred share of the iteration's calls
    (tracekit.core.runtime.deferred_share) of every micro-batch's output-layer weight gradients."""
    share = deferred_share(graph.config)
    if not share:
        return 0.0
    return share * graph.config.num_microbatches * sum(part for _, part in head_wgrad_parts(graph, dur))


def hand_over_us(graph: Graph, dur: np.ndarray) -> float:
    """One activation's hand-over between adjacent stages (µs): the transfer and, under Megatron-LM 2021's
    scatter/gather, the all-gather after it (predictor.parallel.pipeline_p2p); 0 without a pipeline."""
    if graph.p2p is None:
        return 0.0
    gather = float(dur[graph.p2p_gather]) if graph.p2p_gather is not None else 0.0
    return float(dur[graph.p2p]) + gather


def step_us(graph: Graph, dur: np.ndarray, stage: int) -> float:
    """The optimizer step of a stage and the recipe's once-per-iteration casts beside it (µs); the per-iteration passes
    (`framework_costs.pass_costs`) follow them."""
    casts = sum(o.count * dur[o.spec] for o in graph.casts.get(stage, []))
    return float(dur[graph.optimizer[stage].spec]) + float(casts)


def split_backward(graph: Graph, dur: np.ndarray) -> tuple[np.ndarray, list[list[tuple[list[OpUse], list[OpUse]]]]]:
    """Each segment's backward as (input part, weight part) and the durations to time them with, as PyTorch's
    zero-bubble schedules split it (`stage_backward_input` / `stage_backward_weight`): the weight part holds the
    GEMMs' `wgrad` and `bgrad` rows; a GEMM whose backward the models hold whole (no role) is in both parts at half
    its duration (its dgrad and wgrad are one forward's FLOPs each); everything else (attention's batched GEMMs,
    norms, elementwise ops, collectives, recompute) is the input part."""
    whole = np.array([s["primitive"] == "gemm" and s["pass"] == "bwd" and s.get("role") is None
                      for s in graph.specs])
    weight_role = np.array([s["primitive"] == "gemm" and s.get("role") in ("wgrad", "bgrad") for s in graph.specs])
    split = np.where(whole, 0.5 * dur, dur) if whole.any() else dur
    out = []
    for s in range(graph.config.pp):
        row = []
        for k in range(graph.config.vp):
            ops = graph.segment(s, k).bwd
            row.append(([o for o in ops if not weight_role[o.spec]],
                        [o for o in ops if weight_role[o.spec] or (whole[o.spec] and not o.recompute)]))
        out.append(row)
    return split, out


_PASSES: dict[int, tuple[weakref.ref, PassCosts]] = {}


def _passes(graph: Graph) -> PassCosts:
    """`framework_costs.pass_costs` of a graph, once per graph (calibration fitting simulates a graph many times)."""
    held = _PASSES.get(id(graph))
    if held is not None and held[0]() is graph:
        return held[1]
    costs = pass_costs(graph)
    key = id(graph)
    _PASSES[key] = (weakref.ref(graph, lambda _: _PASSES.pop(key, None)), costs)
    return costs


def simulate_graph(graph: Graph, est: Estimates, cal: Calibration
                   ) -> tuple[np.ndarray, list[list[Work]], list[list[Work]], Timeline]:
    """Calibrated durations, per-segment work and the simulated timeline (the cheap part of `compose`, which
    calibration fitting repeats)."""
    dur, job = simulation_inputs(graph, est, cal)
    return dur, job[0], job[1], simulate_jobs([job])[0]
