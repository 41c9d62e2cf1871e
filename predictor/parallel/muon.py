"""Megatron-core's Muon optimizer (`--optimizer muon`, `dist_muon`, `adaptive_muon`) as work of the optimizer step,
read in Megatron-core's `megatron/core/optimizer/emerging_optimizers.py`, `layer_wise_optimizer.py` and
`megatron/training/arguments.py`:

- Muon takes every 2-D weight that is not the embedding or the output layer (the attention and MLP projections, the
  router, each expert's FC1 and FC2); the rest (norms, biases, embedding, output layer) goes to the scalar optimizer
  (`--muon-scalar-optimizer`, Adam by default) — the step `predictor.parallel.data_parallel` already costs over all the
  stage's parameters, which also stands for Muon's element-wise momentum and update of the matrices.
- Each step orthogonalises each matrix's momentum by `--muon-num-ns-steps` (5) Newton–Schulz iterations; with X the
  matrix (transposed so that it has m ≤ n rows), one iteration is A = X·Xᵀ (m×m×n), B = b·A + c·A·A (m×m×m) and
  X = a·X + B·X (m×n×m): 4·m²·n + 2·m³ FLOPs (`ns_step_flops`), three GEMMs asked of the GEMM models in bf16 (the
  fp32 matmuls run at `--muon-fp32-matmul-prec medium`, PyTorch's bf16 tensor-core precision). QKV is split into its
  q, k and v parts first (`--muon-no-split-qkv` turns it off; not for MLA, whose projections are separate matrices).
- Tensor parallelism (`--muon-tp-mode`): `duplicated` (default) all-gathers a TP-split matrix over TP and every rank
  runs the whole iteration; `distributed` splits the iteration over TP (its FLOPs / tp, the small Gram matrices
  all-reduced); `blockwise` orthogonalises each rank's shard alone.
- Distributed Muon (`--optimizer dist_muon`, or `muon` with `--use-distributed-optimizer`): the layer-wise
  distributed optimizer gives each data-parallel rank whole matrices to orthogonalise (the dense ones over the dp·cp
  ranks, the experts' over the expert data-parallel ranks), then gathers the updated parameters: the gradient
  reduce-scatter and parameter all-gather of the distributed optimizer (`predictor.parallel.data_parallel`). Without it,
  every rank orthogonalises every matrix it holds.
- Host: each Newton–Schulz iteration issues its three GEMMs from Python, and each matrix a few more calls (the
  norm, the scale, the transposes, the update): `host_steps` per stage, at the stack's `tensor_op_us` each
  (`predictor.schedule.framework_costs`).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from predictor.layers.decoder import layer_blocks, mtp_layer
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError, did_you_mean
from tracekit.core.pipeline_layout import chunks

if TYPE_CHECKING:
    from predictor.ir.ops import OpBuilder, OpUse

OPTIMIZERS = ("muon", "dist_muon", "adaptive_muon")
TP_MODES = ("blockwise", "duplicated", "distributed")
#: Megatron's `--muon-num-ns-steps` default.
NS_STEPS = 5
#: Python calls per matrix besides the iterations' GEMMs: the norm and division that start the iteration, the
#: transposes in and out, the spectral scale, the momentum update and the weight update.
CALLS_PER_MATRIX = 7
GEMMS_PER_STEP = 3


@dataclass(frozen=True)
class MuonSettings:
    ns_steps: int = NS_STEPS
    tp_mode: str = "duplicated"
    split_qkv: bool = True
    layer_wise: bool = False  # the layer-wise distributed optimizer: whole matrices per data-parallel rank


def muon_settings(c: TrainingConfig) -> MuonSettings | None:
    """The run's Muon settings (Megatron's argument names in `extra`); None for another optimizer. ConfigError for a
    value Megatron refuses."""
    name = str(c.extra.get("optimizer") or "adam").strip().lower()
    if name == "adam":
        return None
    if name not in OPTIMIZERS:
        raise ConfigError(f"optimizer {name!r} is not modelled (tracekit models adam, {', '.join(OPTIMIZERS)})"
                          f"{did_you_mean(name, ('adam',) + OPTIMIZERS)}")
    steps = int(float(c.extra.get("muon_num_ns_steps", NS_STEPS)))
    if steps < 1:
        raise ConfigError(f"muon_num_ns_steps must be at least 1, got {steps}")
    mode = str(c.extra.get("muon_tp_mode") or "duplicated").strip().lower()
    if mode not in TP_MODES:
        raise ConfigError(f"muon_tp_mode must be one of {', '.join(TP_MODES)}, not {mode!r}"
                          f"{did_you_mean(mode, TP_MODES)}")
    split = c.extra.get("muon_split_qkv", True) is not False
    return MuonSettings(steps, mode, split, name == "dist_muon" or c.use_distributed_optimizer)


def ns_step_flops(rows: int, cols: int) -> float:
    """FLOPs of one Newton–Schulz iteration on a rows × cols matrix (module docstring)."""
    m, n = min(rows, cols), max(rows, cols)
    return 4.0 * m * m * n + 2.0 * m ** 3


def ns_gemms(rows: int, cols: int) -> tuple[tuple[int, int, int], ...]:
    """(m, n, k) of the three GEMMs of one iteration: X·Xᵀ, A·A, B·X."""
    m, n = min(rows, cols), max(rows, cols)
    return (m, m, n), (m, m, m), (m, n, m)


def layer_matrices(c: TrainingConfig, layer: int, settings: MuonSettings
                   ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(dense, expert) matrices Muon orthogonalises for decoder layer `layer` of one pipeline stage, as whole
    matrices before tensor parallelism (its blocks', `predictor.layers.block.Block.matrices`); the experts' are
    those of this GPU's expert-parallel rank."""
    dense: list[tuple[int, int]] = []
    expert: list[tuple[int, int]] = []
    for block in layer_blocks(c, layer):
        d, e = block.matrices(c, settings.split_qkv)
        dense += d
        expert += e
    return dense, expert


def _orthogonalised(rows: int, cols: int, split: int, mode: str) -> tuple[tuple[int, int], float]:
    """(shape one rank's iteration runs on, share of its FLOPs) of a matrix split over `split` TP ranks (along its
    larger side, as Megatron's column and row parallel linears split their output or input)."""
    if split <= 1:
        return (rows, cols), 1.0
    if mode == "blockwise":
        return ((rows // split, cols) if rows >= cols else (rows, cols // split)), 1.0
    return (rows, cols), (1.0 / split if mode == "distributed" else 1.0)


def stage_matrices(c: TrainingConfig, stage: int, settings: MuonSettings) -> dict[tuple[int, int], float]:
    """Matrices the busiest rank of pipeline stage `stage` orthogonalises per step: (rows, cols) → count (a share of
    the stage's matrices under the layer-wise distributed optimizer, the dense over dp·cp and the experts over the
    expert data-parallel ranks; `distributed` TP mode counts its 1/tp share as a fraction)."""
    moe = c.moe
    dp = c.dp * c.cp
    edp = (c.world_size // c.pp) // (moe.ep * moe.etp(c.tp)) if moe is not None else 1
    dense: dict[tuple[int, int], float] = defaultdict(float)
    expert: dict[tuple[int, int], float] = defaultdict(float)
    for part in chunks(c)[stage]:
        layers = list(part.layers) + [mtp_layer(c)] * part.mtp  # MTP layers (a GPT's: shaped like its last)
        for layer in layers:
            d, e = layer_matrices(c, layer, settings)
            for rows, cols in d:
                shape, share = _orthogonalised(rows, cols, c.tp, settings.tp_mode)
                dense[shape] += share
            etp = moe.etp(c.tp) if moe is not None else 1
            for rows, cols in e:
                shape, share = _orthogonalised(rows, cols, etp, settings.tp_mode)
                expert[shape] += share
    out: dict[tuple[int, int], float] = defaultdict(float)
    for held, ranks in ((dense, dp if settings.layer_wise else 1), (expert, edp if settings.layer_wise else 1)):
        for shape, count in held.items():
            out[shape] += count / ranks
    return dict(out)


def stage_ops(b: OpBuilder, stage: int) -> list[OpUse]:
    """The Newton–Schulz GEMMs of pipeline stage `stage`'s optimizer step (count: iterations × matrices, rounded up),
    and with `duplicated` TP mode the all-gather of each TP-split matrix; none without Muon."""
    c = b.c
    settings = muon_settings(c)
    if settings is None:
        return []
    out: list[OpUse] = []
    for (rows, cols), count in sorted(stage_matrices(c, stage, settings).items()):
        times = math.ceil(count * settings.ns_steps - 1e-9)
        for i, (m, n, k) in enumerate(ns_gemms(rows, cols)):
            fwd, _ = b.gemm(f"optimizer.muon.newton_schulz{i}", "muon", m, n, k, per_layer=False, bias=False,
                            dtype="bf16")
            fwd.count = times
            out.append(fwd)
    if settings.tp_mode == "duplicated" and c.tp > 1:  # each TP-split dense matrix gathered whole (fp32 momentum)
        dense = sum(rows * cols * count for (rows, cols), count in stage_matrices(c, stage, settings).items())
        gather = b.collective("optimizer.muon.tp_all_gather", "all_gather", "tp", 4.0 * dense / c.tp, False)
        if gather is not None:
            out.append(gather)
    return out


def host_steps(c: TrainingConfig, stage: int) -> float:
    """Python calls the busiest rank of stage `stage` makes for Muon per step (module docstring)."""
    settings = muon_settings(c)
    if settings is None:
        return 0.0
    matrices = sum(stage_matrices(c, stage, settings).values())
    return matrices * (settings.ns_steps * GEMMS_PER_STEP + CALLS_PER_MATRIX)
