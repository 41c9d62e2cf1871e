"""The host calls of Megatron-core's MoE layer (predictor.layers.moe.host_calls): counts per MoE layer derived by hand
from the settings and Megatron-core's code, on CI rows' own launch lines and on small configurations; what changes them
(Sinkhorn, aux-loss coefficients, dispatcher, grouped GEMM, permute fusion, local experts) and what does not (a dense
model)."""
from __future__ import annotations

import pytest

from extractors import jobs as B
from predictor.assembly.graph import build_graph
from tests.conftest import CORPUS
from tracekit.core.config import TrainingConfig

HW = "H100-80GB-HBM3"
CI = CORPUS / "e2e" / "megatron_ci_golden.csv"


def ci_config(test_case: str) -> TrainingConfig:
    """The configuration of the first CI row of `test_case`, parsed from its launch line as `predict --batch` does."""
    if not CI.exists():
        pytest.skip(f"{CI} not present")
    _, cells = B.read_rows(CI)
    for i, c in enumerate(cells):
        if c["row_ref"].split("/")[0] == test_case:
            row = B.parse_row(c, i + 2, None, None)
            assert not row.error, row.error
            return row.config
    raise AssertionError(f"no CI row of {test_case}")


def small(**kw) -> TrainingConfig:
    """A small GELU MoE on one GPU (Megatron's defaults otherwise: all-gather dispatcher, aux_loss type, no coeff)."""
    base = dict(num_layers=2, hidden_size=512, num_attention_heads=8, seq_length=1024, micro_batch_size=2,
                global_batch_size=8, num_experts=8, moe_router_topk=2, disable_bias_linear=True)
    base.update(kw)
    return TrainingConfig.from_mapping(base)


def layer_ops(config: TrainingConfig) -> tuple[list, list]:
    """(forward, backward) ops of one MoE layer of the first segment that has one (per-layer ops once, whatever
    their count)."""
    seg = next(s for s in build_graph(config, HW).segments if any(o.name == "mlp.router" for o in s.fwd))
    block = next(o.block for o in seg.fwd if o.name == "mlp.router")
    return ([o for o in seg.fwd if o.per_layer and o.block == block],
            [o for o in seg.bwd if o.per_layer and o.block == block])


def launches(ops: list, prefix: str = "") -> int:
    """Host-launched compute ops (what `host_op_us` is charged for) whose name starts with `prefix`."""
    return sum(1 for o in ops if o.group is None and o.launch and o.name.startswith(prefix))


def syncs(ops: list) -> int:
    return sum(o.syncs for o in ops)


def test_sinkhorn_all_gather_row_counts_its_router_and_dispatcher_calls():
    """te_8experts2parallel (groupedGEMM): Sinkhorn top-1, all-gather dispatcher, TP 2, EP 2, 8 experts. Router: the
    gating GEMM, the routing call (`sinkhorn_load_balancing`) and `sinkhorn()` inside it, which synchronises (its loop
    test); dispatcher: the permute (with `masked_select`'s synchronisation), the unpermute; the token counts'
    synchronisation before the experts; three all-gathers (tokens, routing map, probabilities) and the
    reduce-scatter over TP·EP."""
    fwd, bwd = layer_ops(ci_config("gpt3_mcore_te_tp2_pp1_frozen_resume_torch_dist_te_8experts2parallel_groupedGEMM"))
    assert launches(fwd, "mlp.router") == 3 and launches(bwd, "mlp.router") == 2  # sinkhorn() has no gradient
    assert launches(fwd, "mlp.token_dispatcher.") == 2
    assert syncs(fwd) == 3 and syncs(bwd) == 0
    exchanges = {o.name for o in fwd if o.group == "tpep"}
    assert exchanges == {f"mlp.token_dispatcher.{n}" for n in ("all_gather", "routing_map_all_gather",
                                                                "probs_all_gather", "reduce_scatter")}
    # the one-GPU all-gather dispatcher gathers nothing, but still selects the probabilities on the device
    one = layer_ops(small())[0]
    assert not [o for o in one if o.group] and syncs(one) == 2


def test_aux_loss_counts_only_with_a_coefficient():
    """aux_loss with coefficient 0.01 (the top2router row): the scores for the loss, the token counts, the loss, its
    attach-and-log forward (4); the scores', the loss's and the auto-scaler's gradients backward (3). Megatron's
    default coefficient 0.0 computes no loss (the ep8 rows name aux_loss without a coefficient)."""
    fwd, bwd = layer_ops(ci_config("gpt3_mcore_te_tp2_zp_z3_resume_torch_dist_te_8experts2parallel_top2router"))
    assert launches(fwd, "mlp.router.aux") == 4
    assert launches(bwd, "mlp.router.aux") == 3
    fwd, bwd = layer_ops(ci_config("gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_muon"))
    assert launches(fwd, "mlp.router.aux") == 0 and launches(bwd, "mlp.router.aux") == 0
    assert launches(layer_ops(small(moe_aux_loss_coeff=0.01))[0], "mlp.router.aux") == 4
    assert launches(layer_ops(small())[0], "mlp.router.aux") == 0
    both = small(moe_router_load_balancing_type=["aux_loss", "seq_aux_loss"], moe_aux_loss_coeff=[0.01, 0.001])
    assert launches(layer_ops(both)[0], "mlp.router.") - launches(layer_ops(small())[0], "mlp.router.") == 1 + 3 + 3


def test_z_loss_and_expert_bias_add_their_calls():
    fwd, bwd = layer_ops(small())
    z_fwd, z_bwd = layer_ops(small(moe_z_loss_coeff=1e-3))
    assert launches(z_fwd, "mlp.router.") == launches(fwd, "mlp.router.") + 2
    assert launches(z_bwd, "mlp.router.") == launches(bwd, "mlp.router.") + 2
    assert launches(layer_ops(small(moe_router_enable_expert_bias=True))[0], "mlp.router.") \
        == launches(fwd, "mlp.router.") + 1


def test_sequential_mlp_launches_each_local_experts_gemms():
    """Grouped GEMM off: SequentialMLP runs each local expert's MLP (FC1, GELU, FC2); on: one FC1, one FC2."""
    seq_fwd, seq_bwd = layer_ops(small(moe_grouped_gemm=False))
    assert launches(seq_fwd, "mlp.experts.linear_fc1") == 8 and launches(seq_fwd, "mlp.experts.linear_fc2") == 8
    assert launches(seq_fwd, "mlp.experts.") == 3 * 8
    assert launches(layer_ops(small(moe_grouped_gemm=True))[0], "mlp.experts.") == 3


def test_more_local_experts_launch_more_calls():
    """SequentialMLP: three calls per local expert; the all-to-all dispatcher sorts the chunks of more than one."""
    counts = [launches(layer_ops(small(num_experts=e, moe_router_topk=1))[0]) for e in (1, 2, 4, 8, 16)]
    assert [b - a for a, b in zip(counts, counts[1:])] == [3, 6, 12, 24]
    a2a = [launches(layer_ops(small(num_experts=e, moe_router_topk=1, moe_token_dispatcher_type="alltoall"))[0])
           for e in (1, 2, 4)]
    assert a2a[1] - a2a[0] == 3 + 2  # one more expert, and sort_chunks_by_idxs before and after the experts
    assert a2a[2] - a2a[1] == 6


def test_permute_fusion_changes_kernels_inside_calls_not_the_calls():
    kw = dict(moe_token_dispatcher_type="alltoall", moe_router_topk=2)
    assert launches(layer_ops(small(**kw))[0]) == launches(layer_ops(small(moe_permute_fusion=True, **kw))[0])


def test_a_dense_model_has_no_moe_host_calls():
    dense = small(num_experts=None, moe_router_topk=None)
    g = build_graph(dense, HW)
    assert not [s for s in g.specs if s["variant"] == "moe_host_call"]
    seg = g.segments[0]
    assert not [o for o in seg.fwd + seg.bwd if o.name.startswith(("mlp.router", "mlp.token_dispatcher"))]
    assert sum(o.syncs for o in seg.fwd + seg.bwd if o.per_layer) == 0  # the loss's checks are not the layers'


def test_alltoall_row_with_fp32_probabilities_expert_bias_and_shared_experts():
    """tp4_ep2_etp2_pp2_scoped_cudagraph: all-to-all dispatcher, expert-TP 2, EP 2, 8 experts (L = 4), fp32 router,
    expert bias, `global_aux_loss` without a coefficient (none computed), shared experts. Router: gating, routing,
    `_apply_expert_bias` (3). Dispatcher: permute, `preprocess`, the host copies, `sort_chunks_by_idxs` before and
    after the experts, the casts around the expert-TP reduce-scatter, unpermute (7). Shared experts' sum (1)."""
    fwd, bwd = layer_ops(ci_config("gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph"))
    assert launches(fwd, "mlp.router") == 3 and launches(bwd, "mlp.router") == 2  # the bias update has no gradient
    assert launches(fwd, "mlp.token_dispatcher.") == 7
    assert launches(bwd, "mlp.token_dispatcher.") == 5  # permute, sorts ×2, casts, unpermute
    assert launches(fwd, "mlp.shared_experts.add") == 1
    assert {o.name for o in fwd if o.group == "ep"} >= {"mlp.token_dispatcher.dispatch",
                                                       "mlp.token_dispatcher.probs_dispatch"}
    # bf16 probabilities: no casts
    assert launches(layer_ops(small(moe_token_dispatcher_type="alltoall", expert_model_parallel_size=1))[0],
                    "mlp.token_dispatcher.combine_cast") == 0


def test_all_gather_casts_around_its_reduce_scatter_with_fp32_probabilities():
    """ep8 (TP 1, EP 8, fp32 router): `token_combine` casts to fp32 for the reduce-scatter over TP·EP and back."""
    fwd, bwd = layer_ops(ci_config("gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_muon"))
    assert launches(fwd, "mlp.token_dispatcher.combine_cast") == 1
    assert launches(bwd, "mlp.token_dispatcher.combine_cast") == 1
    one = layer_ops(small(moe_router_dtype="fp32"))[0]  # one GPU: no reduce-scatter, no casts
    assert launches(one, "mlp.token_dispatcher.combine_cast") == 0
