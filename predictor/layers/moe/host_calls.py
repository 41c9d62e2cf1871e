"""The calls Megatron-core's MoE layer makes on the host beyond the GEMMs, exchanges, permutes and activation that
predictor.layers.moe.ops builds, as `Pair`s (predictor.ir.ops) of their own, and the host synchronisations they make:
the router's loss bookkeeping and Sinkhorn, the token dispatchers' metadata and probabilities. Read in Megatron-core's
code (`megatron/core/transformer/moe/`: `router.py`, `token_dispatcher.py`, `moe_utils.py`, `moe_logging.py`).

One op per call of a Megatron function or method, as everywhere in the graph (`OpUse.launch`): however many PyTorch
operators and kernels a function runs inside, it counts once, as the unfused core attention's module call does
(predictor.layers.attention.ops), so the fitted `host_op_us` keeps its meaning (the PyTorch operators a function issues
are part of its call's host time). Each call is an `elementwise` row over the tensor it reads (a small memory pass: its
kernels' time is real too), with a backward row where a gradient flows through it. Per MoE layer forward, by setting
(T local tokens, E experts, L = E / EP local experts):

- **Sinkhorn routing** (`moe_router_load_balancing_type sinkhorn`): `sinkhorn_load_balancing` is the routing call
  predictor.layers.moe.ops already counts (`router.topk`); inside it, `sinkhorn()` is a function of its own (1 call, no
  gradient), and its `while error > tol` reads a device tensor on the host each pass: one synchronisation per pass.
  The passes are data-dependent, so one (the least the loop makes) is counted.
- **Auxiliary losses**, each of `aux_loss`, `seq_aux_loss`, `global_aux_loss` named by
  `moe_router_load_balancing_type` with a coefficient `moe_aux_loss_coeff` > 0 (Megatron's default 0.0 computes
  none): once, `compute_routing_scores_for_aux_loss` (a gradient); per loss, `get_tokens_per_expert_and_token_count`
  (no gradient), `switch_load_balancing_loss_func` (a gradient) and `attach_and_log_load_balancing_loss` (the
  metrics tracker's record; its `MoEAuxLossAutoScaler` launches nothing forward, and in backward its own call,
  `ones_like(aux_loss) * scale`): 3 forward and 2 backward calls per loss, 1 + 1 more for the scores.
- **z-loss** (`moe_z_loss_coeff`): `z_loss_func` (a gradient) and the tracker's record with the auto-scaler (its
  backward call): 2 forward, 2 backward.
- **Expert bias** (`moe_router_enable_expert_bias`): `_apply_expert_bias` (one `jit_fuser` call).
- **All-gather dispatcher**: with TP · EP > 1, `token_dispatch` all-gathers the routing map and the probabilities
  besides the tokens (two more all-gathers over the TP·EP group; the probabilities' backward a reduce-scatter); on
  any group, `dispatch_postprocess` (the permute's call) selects the local probabilities with `masked_select`, whose
  output size is data-dependent: one synchronisation besides the token counts' `.cpu()`
  (`host_syncs.token_count_syncs`).
- **All-to-all dispatcher**: `preprocess` (the token counts and, with EP or expert-TP > 1, the splits and their
  all-gather over the expert TP·EP group: the TP·EP group where expert-TP = TP, else the EP group) and
  `_maybe_dtoh_and_synchronize`'s device-to-host copies (its synchronisation is `token_count_syncs`'): 2 calls, no
  gradient; the probabilities' all-to-all beside the tokens' (and their expert-TP all-gather); with L > 1
  `sort_chunks_by_idxs` before the experts and after them (1 call each, a gradient; fused or not, one call).
- **fp32 routing probabilities** (`moe_router_dtype fp32`, activations in 16 bits): the combine casts the experts'
  output to the probabilities' dtype for its reduce-scatter and back (`token_combine` of the all-gather dispatcher
  with TP · EP > 1, `combine_preprocess` of the all-to-all one with expert-TP > 1): 1 call, a gradient.
- **Shared experts**: `postprocess` adds their output to the routed experts' (1 call, a gradient).

Not counted: the flex dispatcher's calls (its fused kernels are predictor.layers.moe.ops' exchanges); the aux losses'
all-reduce of the token counts over the TP·CP group (a small collective on a group the graph does not place); the
PyTorch operators inside the counted calls (e.g. `SequentialMLP`'s per-expert probability product sits in its
expert's activation call; `--moe-permute-fusion` and `--moe-router-fusion` change the kernels inside a call, not the
calls); Sinkhorn's passes beyond the first. No constant is fitted here.
"""
from __future__ import annotations

from predictor.ir.ops import OpBuilder, Pair

#: The load-balancing losses the router computes when their coefficient is > 0.
AUX_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss")


def _call(b: OpBuilder, name: str, numel: float, width: float, grad: bool, syncs: int = 0) -> Pair:
    """One launched call: an elementwise row over `numel` elements, its backward where a gradient flows."""
    fwd, bwd = b.elementwise(name, "moe_host_call", numel, width)
    fwd.syncs = syncs
    return fwd, bwd if grad else None, "moe"


def _backward_only(b: OpBuilder, name: str, numel: float, width: float) -> Pair:
    _, bwd = b.elementwise(name, "moe_host_call", numel, width)
    return None, bwd, "moe"


def _words(value: object) -> tuple[str, ...]:
    items = value if isinstance(value, (list, tuple)) else str(value).strip("[]").replace(",", " ").split()
    return tuple(str(v).strip().strip("'\"") for v in items)


def aux_losses(b: OpBuilder) -> tuple[str, ...]:
    """The auxiliary losses the router computes: those named with a coefficient > 0 (`get_aux_loss_coeff`)."""
    moe = b.c.moe
    assert moe is not None
    types = _words(moe.moe_router_load_balancing_type)
    raw = b.c.extra.get("moe_aux_loss_coeff")
    coeffs = tuple(float(w) for w in _words(raw)) if raw is not None else ()
    if len(coeffs) == 1 and len(types) > 1:
        coeffs = coeffs * len(types)
    return tuple(t for t, k in zip(types, coeffs) if t in AUX_TYPES and k > 0)


def _set(value: object) -> bool:
    return value not in (None, False, 0, 0.0, "0", "0.0", "false", "False", "None", "")


def router_calls(b: OpBuilder) -> list[Pair]:
    """The router's calls beyond the gating GEMM and the routing function (module docstring)."""
    moe = b.c.moe
    assert moe is not None
    e = moe.num_experts
    scores = b.sp_tokens * e
    pairs: list[Pair] = []
    if _set(b.c.extra.get("moe_z_loss_coeff")):
        pairs.append(_call(b, "mlp.router.z_loss", scores, e, True))
        pairs.append(_call(b, "mlp.router.z_loss.attach", 1, 1, False))
        pairs.append(_backward_only(b, "mlp.router.z_loss.scaler", 1, 1))
    if str(moe.moe_router_load_balancing_type) == "sinkhorn":
        pairs.append(_call(b, "mlp.router.sinkhorn", scores, e, False, syncs=1))
    losses = aux_losses(b)
    if losses:
        pairs.append(_call(b, "mlp.router.aux_scores", scores, e, True))
    for kind in losses:
        name = f"mlp.router.{kind}"
        pairs.append(_call(b, f"{name}.tokens_per_expert", scores, e, False))
        pairs.append(_call(b, name, scores, e, True))
        pairs.append(_call(b, f"{name}.attach", 1, 1, False))
        pairs.append(_backward_only(b, f"{name}.scaler", 1, 1))
    if _set(b.c.extra.get("moe_router_enable_expert_bias")):
        pairs.append(_call(b, "mlp.router.expert_bias", scores, e, False))
    return pairs


def dispatch_calls(b: OpBuilder) -> tuple[list[Pair], list[Pair], int]:
    """The dispatcher's calls before the experts and after them, and the synchronisations its permute call makes
    beyond the token counts' (module docstring)."""
    moe = b.c.moe
    assert moe is not None
    t, e, k, h = b.sp_tokens, moe.num_experts, moe.moe_router_topk, b.h
    ep, etp, local = moe.ep, moe.etp(b.c.tp), moe.local_experts
    fp32 = str(moe.moe_router_dtype or "").lower() in ("fp32", "float32")
    probs_bytes = 4 if fp32 else b.bytes
    before: list[Pair] = []
    after: list[Pair] = []
    if moe.dispatcher == "allgather":
        before.append((b.collective("mlp.token_dispatcher.routing_map_all_gather", "all_gather", "tpep", t * e),
                       None, "moe"))
        before.append((b.collective("mlp.token_dispatcher.probs_all_gather", "all_gather", "tpep",
                                    t * e * probs_bytes),
                       b.collective("mlp.token_dispatcher.probs_all_gather.grad", "reduce_scatter", "tpep",
                                    t * e * probs_bytes), "moe"))
        if fp32 and b.dtype != "fp32" and b.groups["tpep"].size > 1:  # token_combine's casts around its reduce-scatter
            rows = t * b.groups["tpep"].size
            after.append(_call(b, "mlp.token_dispatcher.combine_cast", rows * h, h, True))
        return before, after, 1  # masked_select
    if moe.dispatcher != "alltoall":
        return before, after, 0
    before.append(_call(b, "mlp.token_dispatcher.preprocess", t * e, e, False))
    if ep > 1 or etp > 1:
        before.append((b.collective("mlp.token_dispatcher.counts_all_gather", "all_gather",
                                    "tpep" if etp == b.c.tp else "ep", e * 8), None, "moe"))
    before.append(_call(b, "mlp.token_dispatcher.dtoh", e, e, False))
    nbytes = t * k * probs_bytes
    before.append((b.collective("mlp.token_dispatcher.probs_dispatch", "all_to_all", "ep", nbytes),
                   b.collective("mlp.token_dispatcher.probs_dispatch.grad", "all_to_all", "ep", nbytes), "moe"))
    if etp > 1:
        before.append((b.collective("mlp.token_dispatcher.probs_etp_all_gather", "all_gather", "etp", nbytes),
                       b.collective("mlp.token_dispatcher.probs_etp_all_gather.grad", "reduce_scatter", "etp",
                                    nbytes), "moe"))
    if local > 1:
        received = t * k * moe.load_factor() * etp
        before.append(_call(b, "mlp.token_dispatcher.sort_chunks", received * h, h, True))
        after.append(_call(b, "mlp.token_dispatcher.unsort_chunks", received * h, h, True))
    if fp32 and b.dtype != "fp32" and etp > 1:  # combine_preprocess's casts around its reduce-scatter
        after.append(_call(b, "mlp.token_dispatcher.combine_cast", t * k * moe.load_factor() * etp * h, h, True))
    return before, after, 0


def shared_add(b: OpBuilder) -> list[Pair]:
    """`postprocess`'s sum of the routed and the shared experts' outputs (none without shared experts)."""
    moe = b.c.moe
    assert moe is not None
    if not moe.moe_shared_expert_intermediate_size:
        return []
    return [_call(b, "mlp.shared_experts.add", b.sp_tokens * b.h, b.h, True)]
