"""The hybrid layer kinds' costs (predictor.layers): physics that cannot drift (the scan linear in the sequence where
attention is quadratic, all-to-all bytes equal to what is projected), parameters against tensor lists written here
from Megatron's module code, and Nemotron 3 Nano's published totals (its parameter count, its published model
TFLOP/s over its tokens/s) from the corpus rows."""
from __future__ import annotations

import csv
import math

import numpy as np
import pandas as pd
import pytest

from predictor.architecture.params import layer_params
from predictor.ir.ops import OpBuilder, parts
from predictor.layers import dsa, kernel_work, megatron_flops, mla
from predictor.layers.attention.block import attention_params
from predictor.layers.attention.ops import attention_block
from predictor.layers.ssm import gated_delta_net as gdn, mamba
from predictor.layers.ssm.scan_work import RECOMPUTED, SSD_KERNELS
from tests.conftest import E2E
from tracekit.core.attention import AttentionSettings
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError
from tracekit.core.hybrid import HybridSettings
from tracekit.core.hybrid_pattern import layer_counts
from tracekit.core.moe import MoESettings

HW = "H100-80GB-HBM3"
NANO = dict(hidden=2688, heads=32, groups=2, kv=128, vocab=131072, moe_ffn=1856, shared=3712, experts=128, topk=6)


def nano_rows() -> list[dict[str, str]]:
    with (E2E / "megatron_bridge_hybrid.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def builder(seq: int = 4096, tp: int = 1, cp: int = 1, sp: bool = False, mb: int = 1, **kw) -> OpBuilder:
    c = TrainingConfig(num_layers=2, hidden_size=2688, num_attention_heads=32, seq_length=seq, micro_batch_size=mb,
                       tensor_model_parallel_size=tp, context_parallel_size=cp, sequence_parallel=sp,
                       add_bias_linear=False, normalization="RMSNorm", **kw)
    return OpBuilder(c, HW, 8)


def nano_mamba():
    return HybridSettings(hybrid_layer_pattern="M", mamba_num_heads=64).mamba(2688)


def total_flops(pairs, prefix: str) -> float:
    return sum(op.flops for op, _, _ in pairs if op is not None and op.name.startswith(prefix))


# -- physics -------------------------------------------------------------------------------------------------------
def test_the_scan_grows_linearly_with_the_sequence_where_attention_grows_quadratically():
    shape = nano_mamba()
    scan = {s: total_flops(mamba.ops(builder(s), shape, True), "mixer.ssd_") for s in (2048, 4096, 8192)}
    attn = {s: total_flops(attention_block(builder(s), None, True), "self_attention.core_attention")
            for s in (2048, 4096, 8192)}
    assert scan[4096] == pytest.approx(2 * scan[2048]) and scan[8192] == pytest.approx(2 * scan[4096])
    assert attn[4096] == pytest.approx(4 * attn[2048]) and attn[8192] == pytest.approx(4 * attn[4096])
    # per token, the scan costs the same at any length; the projections are linear too
    per_token = [mamba.flops_per_token(shape, s) for s in (2048, 8192)]
    assert per_token[0] == pytest.approx(per_token[1])


def test_the_roofline_work_of_each_new_row_is_the_work_its_op_carries():
    b = builder(4096, tp=2, cp=2, sp=True, mb=2)
    pairs = mamba.ops(b, nano_mamba(), True)
    frame = pd.DataFrame(b.specs)
    flops, moved, _ = kernel_work.work(frame, np.full(len(frame), 2.0))
    seen = set()
    scan = {"fwd": [0.0, 0.0], "bwd": [0.0, 0.0]}  # FLOPs, bytes of the SSD kernels
    for fwd, bwd, _ in pairs:
        primitive = b.specs[fwd.spec]["primitive"] if fwd is not None else None
        if primitive in kernel_work.PRIMITIVES:
            assert flops[fwd.spec] == pytest.approx(fwd.flops)
            for part in parts(bwd):
                assert flops[part.spec] == pytest.approx(part.flops)  # the row's work is what its op carries
                if primitive == "causal_conv1d":  # the gradients: twice the forward
                    assert part.flops == pytest.approx(2 * fwd.flops)
                    assert moved[part.spec] == pytest.approx(2 * moved[fwd.spec])
                else:
                    scan["fwd"][0] += flops[fwd.spec]
                    scan["fwd"][1] += moved[fwd.spec]
                    scan["bwd"][0] += flops[part.spec]
                    scan["bwd"][1] += moved[part.spec]
            seen.add(primitive)
    assert seen == {"causal_conv1d", *SSD_KERNELS}
    # mamba_ssm's gradient kernels: each product's two operands (2× the forward's FLOPs, a little more with the
    # decays' gradients), in more passes over x and the output gradient than the forward makes over its inputs
    assert 2.0 * scan["fwd"][0] < scan["bwd"][0] < 3.0 * scan["fwd"][0]
    assert scan["bwd"][1] > 2.0 * scan["fwd"][1]


def test_a_mamba_layer_runs_one_combined_call_and_its_backward_recomputes_the_scans_inputs():
    b = builder(2048)
    pairs = mamba.ops(b, nano_mamba(), True)
    combined = [op for op, _, _ in pairs if op is not None and (op.name == "mixer.conv1d" or "ssd_" in op.name)]
    assert [op.launch for op in combined] == [True] + [False] * len(SSD_KERNELS)
    replayed = [bwd.name for op, bwd, _ in pairs if op is None and bwd is not None and bwd.recompute]
    assert replayed == ["mixer.conv1d.recompute"] + [f"mixer.{k}.recompute" for k in RECOMPUTED]
    # without the memory-efficient path the convolution is a call of its own and is not recomputed
    plain = mamba.ops(b, nano_mamba(), True, mem_eff=False)
    assert not any(bwd is not None and bwd.name == "mixer.conv1d.recompute" for _, bwd, _ in plain)


@pytest.mark.parametrize("tp,cp", [(1, 2), (2, 2), (1, 8), (2, 8)])
def test_context_parallel_all_to_alls_move_what_the_in_projection_makes(tp, cp):
    shape = nano_mamba()
    tokens = 4096 // cp
    pre, post = mamba.cp_all_to_all_bytes(shape, tp, cp, tokens)
    local = mamba.local(shape, tp, cp)
    assert sum(pre) == pytest.approx(tokens * 2 * (local.in_proj + 2 * local.groups * shape.state
                                                   * (local.group_repeat - 1)))
    assert post == pytest.approx(tokens * 2 * shape.d_inner / tp)
    # each rank's scan holds 1/(tp·cp) of the heads, whole groups where it can, a shared group where it cannot
    assert local.scan_heads * tp * cp == shape.heads
    assert local.scan_groups * tp * cp == shape.groups * local.group_repeat


def test_mamba_splits_megatron_refuses():
    with pytest.raises(ConfigError, match="nheads must be evenly divisible by tp_size \\* cp_size"):
        mamba.local(nano_mamba(), 8, 16)
    with pytest.raises(ConfigError, match="ngroups must be evenly divisible by tp_size"):
        mamba.local(nano_mamba(), 16)


# -- parameters ----------------------------------------------------------------------------------------------------
def test_mamba_parameters_are_the_tensors_megatrons_mixer_builds():
    """MambaMixer.__init__ with hybrid_stack_spec: in_proj (TELayerNormColumnParallelLinear: its norm weight
    replicated, weight [(2·d_inner + 2·G·N + H)/tp, h], no bias), conv1d weight [(d_inner + 2·G·N)/tp, 1, 4] and
    bias, dt_bias, A_log, D [H/tp], the gated RMSNorm weight [d_inner/tp], out_proj [h, d_inner/tp], no bias."""
    h, heads, p, n, g = 2688, 64, 64, 128, 8
    d_inner = heads * p
    for tp in (1, 2, 4, 8):
        tensors = [h, (2 * d_inner + 2 * g * n + heads) // tp * h, (d_inner + 2 * g * n) // tp * 1 * 4,
                   (d_inner + 2 * g * n) // tp, heads // tp, heads // tp, heads // tp, d_inner // tp,
                   h * (d_inner // tp)]
        assert mamba.params(nano_mamba(), tp) == sum(tensors)
    # LayerNorm models carry the fused norm's bias too
    assert mamba.params(nano_mamba(), 1, "LayerNorm") == mamba.params(nano_mamba(), 1) + h


def test_gdn_parameters_are_the_tensors_megatrons_layer_builds():
    """_GDNBase: in_proj [(2·qk + 2·v + 2·Hv)/tp, h] with its fused norm's weight, conv1d [(2·qk + v)/tp, 1, K] with
    no bias, dt_bias and A_log [Hv/tp], out_norm over one value head [dv], out_proj [h, v/tp]."""
    shape = HybridSettings(hybrid_layer_pattern="G").gdn(2048)
    qk, v, hv = 16 * 128, 32 * 128, 32
    for tp in (1, 2, 4):
        tensors = [2048, (2 * qk + 2 * v + 2 * hv) // tp * 2048, (2 * qk + v) // tp * 4, hv // tp, hv // tp, 128,
                   2048 * (v // tp)]
        assert gdn.params(shape, tp) == sum(tensors)
    wide = HybridSettings(hybrid_layer_pattern="G", experimental_attention_variant="gdn2").gdn(2048)
    assert wide.in_proj_dim - shape.in_proj_dim == 2 * qk + v - 2 * hv  # f, b, w instead of β, α


def test_an_mla_layer_holds_the_attention_half_of_a_gpt_mla_layer():
    a = AttentionSettings(multi_latent_attention=True, q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128,
                          qk_pos_emb_head_dim=64, v_head_dim=128)
    for tp in (1, 4):
        c = TrainingConfig(num_layers=2, hidden_size=4096, num_attention_heads=32, seq_length=1024, attn=a,
                           tensor_model_parallel_size=tp, add_bias_linear=False, normalization="RMSNorm")
        assert mla.params(a, 4096, 32, tp) == attention_params(c)


def test_the_dsa_indexer_adds_its_replicated_projections_to_mla_and_skipping_layers_have_none():
    a = AttentionSettings(multi_latent_attention=True, q_lora_rank=1536, kv_lora_rank=512)
    shape = HybridSettings(dsa_indexer_n_heads=64, dsa_indexer_head_dim=128, dsa_indexer_topk=2048,
                           dsa_indexer_topk_freq=2).dsa(7168, 1536, 64)
    indexer = 64 * 128 * 1536 + 128 * 7168 + 2 * 128 + 64 * 7168
    for tp in (1, 8):
        assert dsa.params(a, shape, 128, tp, 1) == mla.params(a, 7168, 128, tp) + indexer
        assert dsa.params(a, shape, 128, tp, 2) == mla.params(a, 7168, 128, tp)


def test_sparse_attention_is_linear_in_the_sequence_with_fused_kernels_and_the_indexer_is_not():
    a = AttentionSettings(multi_latent_attention=True, q_lora_rank=1536, kv_lora_rank=512)

    def shape(backend: str):
        return HybridSettings(dsa_indexer_n_heads=64, dsa_indexer_head_dim=128, dsa_indexer_topk=2048,
                              dsa_kernel_backend=backend).dsa(7168, 1536, 64)

    def core(backend: str, seq: int) -> float:
        b = builder(seq)
        return total_flops(dsa.ops(b, a, shape(backend), 1, True), "self_attention.core_attention")

    def index(backend: str, seq: int) -> float:
        return total_flops(dsa.ops(builder(seq), a, shape(backend), 1, True), "self_attention.indexer.scores")

    # far past top-k, each query reads top-k keys: doubling the sequence doubles the fused kernel's work
    assert core("tilelang", 65536) == pytest.approx(2 * core("tilelang", 32768), rel=0.04)
    assert core("none", 65536) == pytest.approx(4 * core("none", 32768))  # PyTorch's dense masked path
    for backend in ("tilelang", "none"):
        assert index(backend, 65536) == pytest.approx(4 * index(backend, 32768))
    assert dsa.mean_keys(100, 1000) == pytest.approx(50.5) and dsa.mean_keys(10_000, 10) == pytest.approx(9.9955)


# -- Nemotron 3 Nano: the published totals -------------------------------------------------------------------------
def nano_moe_layer() -> tuple[int, int]:
    """(dense, expert) parameters of one `E` layer: the pre-MLP norm, router, shared experts, experts."""
    c = TrainingConfig(num_layers=1, hidden_size=NANO["hidden"], num_attention_heads=NANO["heads"],
                       num_query_groups=NANO["groups"], kv_channels=NANO["kv"], seq_length=8192,
                       ffn_hidden_size=NANO["moe_ffn"], add_bias_linear=False, normalization="RMSNorm",
                       moe=MoESettings(num_experts=NANO["experts"], moe_router_topk=NANO["topk"],
                                       moe_shared_expert_intermediate_size=NANO["shared"]))
    dense, expert = layer_params(c, 0)
    return dense - attention_params(c), expert


def test_nano_has_its_published_parameter_count():
    row = nano_rows()[0]
    counts = layer_counts(row["hybrid_override_pattern"])
    h, vocab = NANO["hidden"], int(row["vocab_size"])
    attn = attention_params(TrainingConfig(num_layers=1, hidden_size=h, num_attention_heads=NANO["heads"],
                                           num_query_groups=NANO["groups"], kv_channels=NANO["kv"], seq_length=8192,
                                           add_bias_linear=False, normalization="RMSNorm"))
    moe_dense, moe_expert = nano_moe_layer()
    total = (counts["M"] * mamba.params(nano_mamba()) + counts["*"] * attn + counts["E"] * (moe_dense + moe_expert)
             + 2 * vocab * h + h)  # untied embedding and output layer, the final norm
    assert round(total / 1e9, 1) == float(row["params_billion"])


def test_megatrons_flop_count_of_nano_is_its_published_tflops_over_its_tokens():
    """Megatron-Bridge publishes model TFLOP/s/GPU (Megatron's count) and tokens/s/GPU: their ratio is the count per
    token. The tables give TFLOP/s as integers and tokens/s to the unit, or (26.04.01: 32768, 14336) in units of
    1,024, whose rows may differ by what that rounding allows; the others agree with each other to ~0.3%."""
    ratios = []
    for row in nano_rows():
        per_token = megatron_flops.hybrid_flops_per_token(
            row["hybrid_override_pattern"], hidden=int(row["hidden_size"]), seq=int(row["seq_length"]),
            vocab=int(row["vocab_size"]), heads=int(row["num_attention_heads"]),
            query_groups=int(row["num_query_groups"]), kv_channels=int(row["kv_channels"]),
            moe_ffn=int(row["moe_ffn_hidden_size"]), moe_shared=int(row["moe_shared_expert_intermediate_size"]),
            moe_topk=int(row["moe_router_topk"]), mamba_heads=64)
        tflops, tokens = float(row["model_tflops_per_gpu_reported"]), float(row["tokens_per_sec_per_gpu_reported"])
        if tokens % 1024 == 0:
            low, high = (tflops - 0.5) * 1e12 / (tokens + 512), (tflops + 0.5) * 1e12 / (tokens - 512)
            assert low <= per_token <= high, row["row_ref"]
        else:
            ratios.append(tflops * 1e12 / tokens)
            assert per_token == pytest.approx(ratios[-1], rel=0.005), row["row_ref"]
    assert len(ratios) >= 5
    assert per_token == pytest.approx(float(np.median(ratios)), rel=0.001)


def test_nanos_kernel_flops_are_below_megatrons_count_which_takes_d_inner_as_twice_hidden():
    shape = nano_mamba()  # d_inner 4096 < 2 · 2688
    assert mamba.flops_per_token(shape, 8192) < mamba.megatron_flops_per_token(2688, 128, 64, 8, 64)
    wide = HybridSettings(hybrid_layer_pattern="M").mamba(2688)  # d_inner = 2 · hidden: the projections agree
    gemms = 2.0 * 2688 * wide.in_proj_dim + 2.0 * wide.d_inner * 2688
    assert gemms == pytest.approx(mamba.megatron_flops_per_token(2688, 128, 64, 8, None) - 7.0 * 2 * 2688 * 128)


def test_state_and_activation_bytes_follow_the_shapes():
    shape = nano_mamba()
    one = mamba.state_bytes(shape, 1, 1, 1, 8192)
    assert one["chunk_states"] == pytest.approx(math.ceil(8192 / 128) * 64 * 64 * 128 * 4)
    assert mamba.state_bytes(shape, 2, 2, 1, 8192)["chunk_states"] == pytest.approx(one["chunk_states"] / 4)
    replicated, split = mamba.activation_bytes(shape)
    assert replicated == 4 * 2688
    assert split == 2 * shape.in_proj_dim + 6 * shape.d_inner + 4 * shape.groups


def test_the_indexer_runs_a_backward_only_when_its_loss_trains_it():
    a = AttentionSettings(multi_latent_attention=True, q_lora_rank=1536, kv_lora_rank=512)

    def indexer_backwards(coeff):
        shape = HybridSettings(dsa_indexer_n_heads=64, dsa_indexer_head_dim=128, dsa_indexer_topk=2048,
                               dsa_indexer_loss_coeff=coeff).dsa(7168, 1536, 64)
        pairs = dsa.ops(builder(4096), a, shape, 1, True)
        return [op.name for op, bwd, _ in pairs if op is not None and op.name.startswith("self_attention.indexer.")
                and bwd is not None]

    assert indexer_backwards(None) == [] and indexer_backwards(0.0) == []
    assert "self_attention.indexer.scores" in indexer_backwards(0.01)
