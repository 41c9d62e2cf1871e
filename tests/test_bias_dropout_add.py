"""Megatron-core's unfused bias-dropout-add (predictor.layers.mlp.bias_dropout_add): the bias add a kernel of its own
before the residual add where `bias_dropout_fusion` is off and the linears have biases (the attention's and a dense
MLP's, not an MoE layer's), sized as the [tokens, hidden] output it reads and writes; the flag slows a prediction and is
no longer named unmodelled; Megatron-Bridge's GPT-OSS rows run it unfused, as their provider sets."""
from __future__ import annotations

import pytest

from extractors.jobs.rows import parse_row
from predictor.assembly.graph import build_graph
from predictor.costs.learned.models import ModelSet
from predictor.layers.local_kernels import RES_ADD_MOVES
from predictor.predict import predict
from tests.conftest import bridge_rows
from tracekit.core.cluster import preset
from tracekit.core.config import TrainingConfig
from tracekit.core.megatron_arguments import unmodelled_warning

HW = "H100-80GB-HBM3"
SEQ, MB, HIDDEN = 2048, 2, 1024


def config(**kw) -> TrainingConfig:
    base = dict(num_layers=2, hidden_size=HIDDEN, num_attention_heads=16, seq_length=SEQ, micro_batch_size=MB,
                global_batch_size=16, add_bias_linear=True, bias_dropout_fusion=False)
    return TrainingConfig.from_mapping({**base, **kw})


def bias_adds(c: TrainingConfig) -> dict[str, tuple[int, int, float]]:
    """name → (forward instances, backward instances, numel) of the bias adds of the first segment, one
    micro-batch."""
    g = build_graph(c, HW)
    seg = g.segments[0]
    out: dict[str, tuple[int, int, float]] = {}
    for name in ("self_attention.bias_add", "mlp.bias_add"):
        fwd = [o for o in seg.fwd if o.name == name]
        bwd = [o for o in seg.bwd if o.name == name]
        if fwd or bwd:
            out[name] = (sum(o.count for o in fwd), sum(o.count for o in bwd), g.specs[fwd[0].spec]["numel"])
    return out


def test_an_unfused_bias_add_reads_and_writes_the_layers_output_once_per_layer_and_only_forward():
    adds = bias_adds(config())
    assert set(adds) == {"self_attention.bias_add", "mlp.bias_add"}
    for fwd, bwd, numel in adds.values():
        assert (fwd, bwd) == (2, 0)  # one per layer, forward only
        # it reads the [tokens, hidden] output and writes it: 2 element moves each, asked of the element-wise
        # kernel that moves 3 per numel (predictor.layers.local_kernels.streaming)
        assert numel * RES_ADD_MOVES == pytest.approx(2 * SEQ * MB * HIDDEN)


@pytest.mark.parametrize("kw", [dict(bias_dropout_fusion=True), dict(add_bias_linear=False), {}])
def test_no_bias_add_with_the_fusion_or_without_biases(kw):
    if not kw:  # Megatron's default: fused
        c = TrainingConfig.from_mapping(dict(num_layers=2, hidden_size=HIDDEN, num_attention_heads=16,
                                             seq_length=SEQ, micro_batch_size=MB, global_batch_size=16))
    else:
        c = config(**kw)
    assert bias_adds(c) == {}


def test_an_moe_layer_returns_no_bias_to_add():
    c = config(num_experts=8, moe_router_topk=2, moe_grouped_gemm=True, expert_model_parallel_size=8,
               world_size=8, global_batch_size=16, moe_token_dispatcher_type="alltoall")
    assert set(bias_adds(c)) == {"self_attention.bias_add"}


def test_the_unfused_add_slows_the_step_and_is_modelled():
    models, cluster = ModelSet.load(), preset("dgx-h100")
    unfused = predict(config(), cluster, models)
    fused = predict(config(bias_dropout_fusion=True), cluster, models)
    assert unfused.iteration_time_s > fused.iteration_time_s
    assert unmodelled_warning(config().extra) is None


def test_the_bridge_gpt_oss_rows_run_it_unfused_and_the_llama_rows_fused():
    seen: dict[str, set[bool]] = {}
    for line, c in bridge_rows():
        row = parse_row(c, line, None, None)
        if not row.error:
            seen.setdefault(c["model_name"].split()[0], set()).add(bool(bias_adds(row.config)))
    assert seen["GPT"] == {True}
    assert seen["LLAMA3_8B"] == seen["LLAMA3_70B"] == {False}
