"""Precision recipes: how tables spell them, what they put around each GEMM (casts: bytes per element, which
tensors, which layers stay bf16), and that each recipe setting changes the graph it should."""
from __future__ import annotations

import pytest

from extractors.jobs.megatron import config_from_argv
from predictor.assembly.graph import build_graph
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError
from tracekit.core.precision import RECIPES, recipe_name

HW = "B200-180GB"


@pytest.mark.parametrize("cell, recipe", [
    ("amp_bf16", "bf16"), ("amp_fp8", "fp8"), ("fp8-cs", "fp8-cs"), ("fp8-mx", "mxfp8"), ("mxfp8", "mxfp8"),
    ("nvfp4", "nvfp4"), ("FP8", "fp8"), ("blockwise", "fp8-block"), ("bfloat16", "bf16"), ("fp16", "fp16"),
])
def test_recipes_are_read_as_published_tables_write_them(cell, recipe):
    assert recipe_name(cell) == recipe


def test_unknown_recipes_are_refused_with_a_suggestion():
    with pytest.raises(ConfigError, match="did you mean 'nvfp4'"):
        recipe_name("nvpf4")


@pytest.mark.parametrize("flags, recipe", [
    ("--bf16", "bf16"), ("--bf16 --fp8-format hybrid", "fp8"), ("--fp8-format hybrid --bf16", "fp8"),
    ("--bf16 --fp8-format e4m3 --fp8-recipe tensorwise", "fp8-cs"),
    ("--bf16 --fp8-format e4m3 --fp8-recipe mxfp8", "mxfp8"), ("--bf16 --fp8-format hybrid --fp8-recipe blockwise",
                                                               "fp8-block"),
    ("--bf16 --fp4-format e2m1 --fp4-recipe nvfp4", "nvfp4"), ("--fp16", "fp16"),
])
def test_megatron_flags_select_the_recipe_whatever_their_order(flags, recipe):
    c = config_from_argv(f"--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
                                          f"{flags}")
    assert c.precision == recipe


def model(precision: str, **kw) -> TrainingConfig:
    base = dict(num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=1024, micro_batch_size=2,
                swiglu=True, precision=precision)
    return TrainingConfig.from_mapping({**base, **kw})


def casts(graph) -> list:
    return [o for seg in graph.segments for o in seg.fwd + seg.bwd if o.name.endswith((".quantize_input",
                                                                                      ".quantize_grad"))]


def test_each_low_precision_gemm_has_its_input_and_gradient_casts_and_bf16_has_none():
    assert not casts(build_graph(model("bf16"), HW))
    g = build_graph(model("mxfp8"), HW)
    gemms = [o for o in g.segments[0].fwd if o.per_layer and g.specs[o.spec]["primitive"] == "gemm"]
    assert gemms and all(g.specs[o.spec]["dtype"] == "mxfp8" for o in gemms)
    fwd_casts = [o for o in g.segments[0].fwd if o.name.endswith(".quantize_input")]
    bwd_casts = [o for o in g.segments[0].bwd if o.name.endswith(".quantize_grad")]
    assert len(fwd_casts) == len(gemms) == len(bwd_casts)  # QKV, proj, FC1, FC2
    head = [o for o in g.segments[0].fwd if o.name == "output_layer"]
    assert g.specs[head[0].spec]["dtype"] == "bf16"  # the LM head is not a TE linear
    assert g.casts[0] and g.specs[g.casts[0][0].spec]["variant"] == "quantize"  # weights, once per iteration


def test_cast_bytes_follow_the_recipe():
    """A cast reads bf16 (2 B) and writes two copies of the recipe's format, scales included; current scaling and
    NVFP4 read the tensor once more for the amax."""
    numel = {}
    for name in ("fp8", "fp8-cs", "mxfp8", "nvfp4"):
        g = build_graph(model(name), HW)
        (op,) = [o for o in g.segments[0].fwd if o.name == "mlp.linear_fc1.quantize_input"]
        numel[name] = g.specs[op.spec]["numel"]
    tokens_h = 1024 * 2 * 1024  # FC1's input
    assert numel["fp8"] * 4 == pytest.approx(tokens_h * (2 + 2 * 1))
    assert numel["fp8-cs"] * 4 == pytest.approx(tokens_h * (2 + 2 * 1 + 2))
    assert numel["mxfp8"] * 4 == pytest.approx(tokens_h * (2 + 2 * (1 + 1 / 32)))
    assert numel["nvfp4"] * 4 == pytest.approx(tokens_h * (2 + 2 * (0.5 + 1 / 16) + 2))
    assert RECIPES["nvfp4"].gemm_dtype == "nvfp4" and RECIPES["fp8-cs"].gemm_dtype == "fp8"


def test_first_and_last_layers_stay_bf16_when_asked():
    g = build_graph(model("fp8", first_last_layers_bf16=True), HW)
    runs = []
    for o in g.segments[0].fwd:
        if o.per_layer and (not runs or runs[-1][0] != o.block):
            runs.append((o.block, o.count))
    assert runs == [("dense-bf16", 1), ("dense", 2), ("dense-bf16", 1)]  # layers 0 and 3 bf16, 1-2 fp8
    dtypes = {g.specs[o.spec]["dtype"] for o in g.segments[0].fwd if o.per_layer and o.name == "mlp.linear_fc1"}
    assert dtypes == {"fp8", "bf16"}


def test_fp8_parameter_gather_halves_the_gather_bytes():
    plain = build_graph(model("fp8", use_distributed_optimizer=True, world_size=8), HW)
    fp8 = build_graph(model("fp8", use_distributed_optimizer=True, world_size=8, fp8_param_gather=True), HW)
    b0 = sum(plain.specs[o.spec]["bytes"] for o in plain.param_gather[0])
    b1 = sum(fp8.specs[o.spec]["bytes"] for o in fp8.param_gather[0])
    assert b1 == pytest.approx(b0 / 2)


def test_recipes_change_the_prediction_in_the_right_direction():
    """Lower-precision GEMMs are faster, keeping layers in bf16 slower, current scaling's extra amax pass slower
    than delayed scaling; the same model in bf16 is the reference."""
    from predictor.costs.learned.models import ModelSet
    from predictor.predict import predict
    from tracekit.core.cluster import preset

    models = ModelSet.load()

    def time(precision: str, hardware: str = "B200-180GB", **kw) -> float:
        c = model(precision, hidden_size=4096, num_attention_heads=32, seq_length=4096, global_batch_size=16,
                  world_size=8, **kw)
        cluster = preset("dgx-b200" if hardware.startswith("B200") else "dgx-h100", hardware)
        return predict(c, cluster, models).iteration_time_s

    bf16 = time("bf16")
    assert time("mxfp8") < bf16 and time("nvfp4") < time("mxfp8")
    assert time("fp8") < time("fp8", first_last_layers_bf16=True) < bf16
    assert time("fp8") < time("fp8-cs")
    assert time("fp8", "H100-80GB-HBM3") < time("bf16", "H100-80GB-HBM3")
