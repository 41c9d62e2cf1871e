"""TEGroupedMLP's passes around the experts' GEMMs (predictor.layers.moe.grouped_mlp) and the Megatron-Bridge providers'
architecture (extractors.jobs.bridge.providers): bytes moved from the tensors' sizes, zero when the feature is off, the
direction of the change, and the published GPT-OSS rows read as their provider defines the model."""
from __future__ import annotations

import csv

import pytest

from extractors.jobs.bridge.providers import provider_settings
from extractors.jobs.rows import parse_row
from predictor.assembly.graph import build_graph
from tests.conftest import E2E
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError

HW = "H100-80GB-HBM3"
BRIDGE = E2E / "megatron_bridge_perf.csv"


def gpt_oss_like(**kw) -> TrainingConfig:
    """A small GPT-OSS-shaped MoE: biased linears, a clamped GLU, grouped GEMMs."""
    base = dict(num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=1024, micro_batch_size=2,
                global_batch_size=16, swiglu=True, add_bias_linear=True, num_experts=8, moe_router_topk=2,
                moe_grouped_gemm=True, moe_ffn_hidden_size=512, activation_func_clamp_value=7.0)
    base.update(kw)
    return TrainingConfig.from_mapping(base)


def moved(config: TrainingConfig, prefix: str) -> tuple[float, float]:
    """(forward, backward) element-moves of the ops named `prefix` in one micro-batch of the first segment, as the
    operator rows state them (an elementwise row moves 2 per element forward, 3 backward)."""
    g = build_graph(config, HW)
    seg = g.segments[0]
    fwd = sum(2 * g.specs[o.spec]["numel"] * o.count for o in seg.fwd if o.name.startswith(prefix))
    bwd = sum(3 * g.specs[o.spec]["numel"] * o.count for o in seg.bwd if o.name.startswith(prefix))
    return fwd, bwd


def test_clamp_moves_four_then_three_elements_per_fc1_output_element():
    """Two clamps (each half read and written) and the concatenation (all read and written) forward; the clamps'
    gradient masks (gradient and input read, gradient written) backward; per layer over the [tokens·k, 2·ffn]
    FC1 output."""
    c = gpt_oss_like()
    rows = 1024 * 2 * 2  # tokens of the micro-batch · top-k, all on the one EP rank
    fc1 = rows * 2 * 512
    fwd, bwd = moved(c, "mlp.experts.activation_clamp")
    assert fwd == pytest.approx(4 * fc1 * 4)  # 4 layers
    assert bwd == pytest.approx(3 * fc1 * 4)


def test_fc2_bias_moves_six_elements_per_output_element_each_way():
    c = gpt_oss_like()
    out = 1024 * 2 * 2 * 1024  # [tokens·k, hidden]
    fwd, bwd = moved(c, "mlp.experts.apply_bias")
    assert fwd == pytest.approx(6 * out * 4) and bwd == pytest.approx(6 * out * 4)


def test_the_passes_scale_with_the_tokens_the_experts_receive():
    for prefix in ("mlp.experts.activation_clamp", "mlp.experts.apply_bias"):
        top2, top4 = moved(gpt_oss_like(), prefix), moved(gpt_oss_like(moe_router_topk=4), prefix)
        assert top2[0] > 0 and top4[0] == pytest.approx(2 * top2[0]) and top4[1] == pytest.approx(2 * top2[1])


@pytest.mark.parametrize("off", [dict(activation_func_clamp_value=None), dict(use_transformer_engine_op_fuser=True),
                                 dict(swiglu=False)])
def test_no_clamp_pass_without_a_clamped_glu_or_under_tes_op_fuser(off):
    assert moved(gpt_oss_like(**off), "mlp.experts.activation_clamp") == (0.0, 0.0)


@pytest.mark.parametrize("off", [dict(add_bias_linear=False), dict(use_transformer_engine_op_fuser=True),
                                 dict(moe_grouped_gemm=False)])
def test_no_bias_pass_without_biases_grouped_gemms_or_with_tes_op_fuser(off):
    assert moved(gpt_oss_like(**off), "mlp.experts.apply_bias") == (0.0, 0.0)


def test_the_passes_make_the_iteration_longer_and_the_recompute_replays_the_clamp():
    from predictor.costs.learned.models import ModelSet
    from predictor.predict import predict
    from tracekit.core.cluster import preset

    models, cluster = ModelSet.load(), preset("dgx-h100")

    def time(**kw):
        return predict(gpt_oss_like(world_size=8, expert_model_parallel_size=8, **kw), cluster,
                       models).iteration_time_s

    plain = time(activation_func_clamp_value=None, add_bias_linear=False)
    assert time(add_bias_linear=False) > plain
    assert time() > time(add_bias_linear=False)
    assert time(use_transformer_engine_op_fuser=True, add_bias_linear=False) == pytest.approx(plain)
    recomputed = build_graph(gpt_oss_like(recompute_granularity="selective", recompute_modules=["moe_act"]), HW)
    replayed = [o for o in recomputed.segments[0].bwd if o.name == "mlp.experts.activation_clamp"]
    assert replayed, "the moe_act recompute replays the clamp in backward"


def test_a_clamp_value_must_be_positive():
    with pytest.raises(ConfigError, match="activation_func_clamp_value"):
        gpt_oss_like(activation_func_clamp_value=0)


def test_provider_names_in_the_notes():
    assert provider_settings("a | arch: GPTOSSProvider120B + GPTOSSProvider in src/x.py | b")[0] == "GPTOSSProvider"
    assert provider_settings("arch: Llama3ModelProvider8B (+Llama3ModelProvider qg=8) in")[0] == "Llama3ModelProvider"
    assert provider_settings("arch: DeepSeekV3ModelProvider + DeepSeekModelProvider (MLA)")[0] == \
        "DeepSeekV3ModelProvider"
    assert provider_settings("no architecture here") == (None, {})
    assert provider_settings("arch: SomeOtherProvider in src/y.py") == (None, {})


def test_the_published_rows_are_read_as_their_provider_defines_the_model():
    """Every GPT-OSS row: biased linears and the clamped GLU; every other model of the set: no linear biases; the
    runs through TE's fused grouped MLP (`cutedsl_fused_grouped_mlp`, `use_transformer_engine_op_fuser`) say so."""
    with open(BRIDGE, newline="") as fh:
        cells = list(csv.DictReader(fh))
    oss = other = fused = 0
    for i, row in enumerate(cells):
        parsed = parse_row(row, i + 2, None, None)
        if parsed.config is None:
            continue
        c = parsed.config
        if "OSS" in row["model_name"]:
            oss += 1
            assert c.add_bias_linear and c.act is not None and c.act.activation_func_clamp_value == 7.0
            assert c.hidden_dropout == 0.0 and c.untie_embeddings_and_output_weights
            if any(f"{key}=True" in row["notes"] for key in ("cutedsl_fused_grouped_mlp",
                                                              "use_transformer_engine_op_fuser")):
                fused += 1
                assert c.act.use_transformer_engine_op_fuser
        else:
            other += 1
            assert not c.add_bias_linear, row["model_name"]
    assert oss == 18 and other > 60 and fused == 3


def test_a_launch_line_wins_over_the_provider():
    with open(BRIDGE, newline="") as fh:
        row = next(r for r in csv.DictReader(fh) if "OSS" in r["model_name"])
    parsed = parse_row({**row, "megatron_args": "--activation-func-clamp-value 10"}, 2, None, None)
    assert parsed.config is not None and parsed.config.act.activation_func_clamp_value == 10.0


def test_gradients_stated_without_fp32_accumulation_are_kept_and_reduced_in_bf16():
    """Megatron-Bridge's `grad_reduce_in_fp32=False` (GPT-OSS's recipes): 2-byte gradient buffers (plus the fp32
    copy of its shard the distributed optimizer makes: less memory, not half) and half the bytes each data-parallel
    reduce-scatter moves; unstated, bf16 keeps Megatron's fp32 main gradients."""
    from predictor.memory.stages import config_memory

    common = dict(world_size=8, data_parallel_size=8, use_distributed_optimizer=True)  # the recipes' optimizer
    fp32 = gpt_oss_like(**common)
    bf16 = gpt_oss_like(**common, accumulate_allreduce_grads_in_fp32=False)
    assert (fp32.grad_bytes, bf16.grad_bytes) == (4, 2)
    assert config_memory(bf16, HW)[0]["gradients"] < config_memory(fp32, HW)[0]["gradients"]

    def reduced(c):
        g = build_graph(c, HW)
        return sum(s["bytes"] for s in g.specs if s["primitive"] == "reduce_scatter")

    assert reduced(bf16) == pytest.approx(reduced(fp32) / 2)
