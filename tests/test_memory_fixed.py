"""Memory beside the model's tensors: GEMM workspaces, the quantised weight copies of low-precision recipes, and the
activations PyTorch's split-backward pipeline schedules hold until their weight backward.

Expected bytes are worked out here by hand from the libraries' documented sizes and the layers' shapes."""
from __future__ import annotations

import dataclasses

import pytest

from predictor.memory.stages import _in_flight, stage_memory
from predictor.memory.workspaces import cublas_config_bytes, workspace_bytes
from predictor.memory.zero_bubble import peak_stages
from predictor.schedule.zero_bubble import orders
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError
from tracekit.core.pipeline_layout import LayoutSettings

MiB = 1 << 20
H, FFN, LAYERS = 1024, 4096, 4


def _gpt(**kw) -> TrainingConfig:
    base = dict(num_layers=LAYERS, hidden_size=H, ffn_hidden_size=FFN, num_attention_heads=16, seq_length=1024,
                micro_batch_size=1, global_batch_size=8, data_parallel_size=1, add_bias_linear=False,
                normalization="RMSNorm")
    base.update(kw)
    return TrainingConfig(**base)


def test_cublas_workspace_config_is_read_as_its_pairs():
    assert cublas_config_bytes(":4096:8") == 8 * 4 * MiB
    assert cublas_config_bytes(":4096:2:16:8") == 8519680  # PyTorch's pre-Hopper default, as its allocator shows
    with pytest.raises(ConfigError, match="CUBLAS_WORKSPACE_CONFIG"):
        cublas_config_bytes("4096x8")


def test_workspaces_by_gpu_generation_and_library():
    te = dataclasses.replace(_gpt(), extra={"transformer_impl": "transformer_engine",
                                            "cublas_workspace_config": ":4096:8"})
    # two PyTorch handles (forward thread, autograd's thread) × 32 MiB, TE's one 4 MiB (A100) or 32 MiB + 256 (H100)
    assert workspace_bytes(te, "A100-SXM4-80GB") == 2 * 32 * MiB + 4 * MiB
    assert workspace_bytes(te, "H100-80GB-HBM3") == 2 * 32 * MiB + 32 * MiB + 256
    local = dataclasses.replace(te, extra={"transformer_impl": "local"})
    assert workspace_bytes(local, "A100-SXM4-80GB") == 2 * 8519680  # PyTorch's default before Hopper, no TE
    assert workspace_bytes(local, "H100-80GB-HBM3") == 2 * 32 * MiB  # its default from Hopper on
    overlap = dataclasses.replace(te, tp_comm_overlap=True)
    assert workspace_bytes(overlap, "H100-80GB-HBM3") - workspace_bytes(te, "H100-80GB-HBM3") == 2 * (32 * MiB + 256)
    assert workspace_bytes(te, "MI300X") == 0.0  # hipBLASLt: not modelled
    # they count between steps and at the peak alike, once per GPU
    rows = stage_memory(te, "A100-SXM4-80GB")
    assert rows[-1]["workspaces"] * 1e9 == pytest.approx(68 * MiB)
    assert rows[-1]["total"] - stage_memory(te)[-1]["total"] == pytest.approx(68 * MiB / 1e9)


def _lowp_weight_gb(precision: str, hardware: str, **lowp) -> float:
    from tracekit.core.precision import LowPrecisionSettings

    c = _gpt(precision=precision, lowp=LowPrecisionSettings(**lowp) if lowp else None)
    bf16 = _gpt(precision="bf16")
    return stage_memory(c, hardware)[-1]["weights"] - stage_memory(bf16, hardware)[-1]["weights"]


def test_fp8_weights_keep_the_copies_their_gemms_read():
    # per layer: QKV 3h², projection h², FC1 and FC2 2·h·ffn, two RMSNorms h each (counted with the GEMM weights)
    params = LAYERS * (4 * H * H + 2 * H * FFN + 2 * H)
    # Hopper: row-wise fp8 copy and its transpose (TN-only fp8 GEMMs); Blackwell: one copy serves both
    assert _lowp_weight_gb("fp8", "H100-80GB-HBM3") * 1e9 == pytest.approx(2 * params)
    assert _lowp_weight_gb("fp8-cs", "B200-180GB") * 1e9 == pytest.approx(1 * params)
    # MXFP8 keeps row- and column-wise copies everywhere, one E8M0 byte per 32 elements each
    assert _lowp_weight_gb("mxfp8", "B200-180GB") * 1e9 == pytest.approx(2 * (1 + 1 / 32) * params)
    # fp8 primary weights replace the 2-byte bf16 weight: Hopper keeps 1 + 1 bytes, Blackwell 1
    assert _lowp_weight_gb("fp8", "H100-80GB-HBM3", fp8_param_gather=True) == pytest.approx(0.0, abs=1e-12)
    assert _lowp_weight_gb("fp8-cs", "B200-180GB", fp8_param_gather=True) * 1e9 == pytest.approx(-params)
    # bf16 first and last layers keep no copy: half the layers here
    half = _lowp_weight_gb("fp8", "H100-80GB-HBM3", first_last_layers_bf16=True)
    assert half * 1e9 == pytest.approx(params)


def _zb(schedule: str, vp: int, m: int, pp: int = 4) -> TrainingConfig:
    return _gpt(num_layers=8 * vp, pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vp,
                global_batch_size=m, layout=LayoutSettings(torch_pipeline_schedule=schedule))


def test_peak_of_an_order_by_hand():
    order = [("F", 0, 0), ("F", 0, 1), ("I", 0, 0), ("F", 0, 2), ("I", 0, 1), ("W", 0, 0), ("W", 0, 1),
             ("I", 0, 2), ("W", 0, 2)]
    # with 40% waiting for W: 1, 2, 1.4, 2.4 (peak), 1.8, 1.4, 1.0, 0.4, 0
    assert peak_stages(order, 0.4) == pytest.approx(2.4)
    assert peak_stages(order, 0.0) == pytest.approx(2.0)  # nothing waits: as if each I were a full backward


@pytest.mark.parametrize("schedule,vp,m", [("InterleavedZeroBubble", 1, 8), ("InterleavedZeroBubble", 2, 8),
                                           ("ZBVZeroBubble", 2, 8), ("DualPipeV", 2, 8)])
def test_a_split_backward_holds_at_least_what_its_full_backward_would(schedule, vp, m):
    for rank in range(4):
        order = orders(schedule, 4, vp, m)[rank]
        as_full = [(("B" if kind == "I" else kind), g, i) for kind, g, i in order if kind != "W"]
        deferred = peak_stages(order, 0.5)
        assert deferred >= peak_stages(as_full, 0.5)
        # W right after its I: the full backward's peak
        adjacent: list = []
        for kind, g, i in order:
            if kind == "W":
                continue
            adjacent.append((kind, g, i))
            if kind == "I":
                adjacent.append(("W", g, i))
        assert peak_stages(adjacent, 0.5) == pytest.approx(peak_stages(as_full, 0.5))


def test_zero_bubble_in_flight_is_at_least_1f1b():
    for rank in range(4):
        one_f_one_b = _in_flight(_gpt(num_layers=8, pipeline_model_parallel_size=4, global_batch_size=8), rank)
        assert one_f_one_b == min(4 - rank, 8)
        assert _in_flight(_zb("InterleavedZeroBubble", 1, 8), rank) >= one_f_one_b


def _acts(c: TrainingConfig) -> float:
    return stage_memory(c)[-1]["activations"] * 1e9


def test_moe_act_recompute_frees_fc2_inputs_and_keeps_the_activation_input():
    """Megatron-core's `moe_act`: the activation runs under CheckpointWithoutOutput from FC1's output (kept) and its
    output, FC2's input, is freed after FC2 and replayed in the backward."""
    moe = TrainingConfig.from_mapping(dict(
        num_layers=LAYERS, hidden_size=H, ffn_hidden_size=FFN, num_attention_heads=16, seq_length=1024,
        micro_batch_size=1, global_batch_size=1, data_parallel_size=1, add_bias_linear=False, swiglu=True,
        num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=512, attention="flash",
        recompute_granularity="selective", recompute_modules=["core_attn"]))
    act = dataclasses.replace(moe, recompute_modules=("core_attn", "moe_act"))
    # every layer is MoE; each token's 2 routed copies each kept a 512-wide bf16 FC2 input: 2 · 2 · 512 bytes
    assert _acts(moe) - _acts(act) == pytest.approx(LAYERS * 1024 * 2 * 2 * 512)


def test_layernorm_recompute_frees_the_norm_outputs_the_gemms_read():
    """`layernorm`: the norms replay from their inputs (kept); QKV and FC1 lose their saved inputs, which under fp8
    are the bf16 norm outputs instead of 1-byte copies (Megatron's set_save_original_input), so fp8 frees 1 + 1
    bytes a token per layer of hidden width and bf16 2 + 2."""
    for precision, freed in (("bf16", 4), ("fp8", 2)):
        base = _gpt(precision=precision, global_batch_size=1, attention="flash", recompute_granularity="selective",
                    recompute_modules=("core_attn",))
        norm = dataclasses.replace(base, recompute_modules=("core_attn", "layernorm"))
        assert _acts(base) - _acts(norm) == pytest.approx(LAYERS * 1024 * freed * H)
