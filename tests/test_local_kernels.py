"""Megatron-core's layer implementation as it runs (tracekit.core.layer_impl, predictor.layers.local_kernels): `local`
and `transformer_engine` build different operators where Megatron runs different kernels, each kernel flag moves a
prediction the way the kernels it swaps in move it, and what Megatron refuses is refused in one line. Predictions
run the bundled models (A100: the seed paper's softmax, fillmask, norm, GeLU and element-wise samples) with the
megatron-core stack's defaults and constants, as `tracekit predict` does; the job is large enough that the GPU, not
the host, sets the iteration."""
from __future__ import annotations

import json

import pytest

from extractors.jobs.megatron import config_from_argv
from predictor.assembly.graph import build_graph
from predictor.costs.learned.models import ModelSet
from predictor.layers.local_kernels import DROPOUT_MOVES, FOREACH_ADAM_BYTES, FUSED_ADAM_BYTES, RES_ADD_MOVES
from predictor.predict import predict_many
from tracekit.core.cluster import preset
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError
from tracekit.core.layer_impl import fused_softmax_takes, kernels
from tracekit.core.megatron_arguments import flag_classes
from tracekit.core.stacks import get_stack, stack_path

HW = "A100-SXM4-80GB"
GPT = ("--num-layers 4 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 "
       "--micro-batch-size 4 --global-batch-size 8 --bf16")
LLAMA = ("--num-layers 4 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 4 "
         "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 4 --global-batch-size 8 --bf16 "
         "--position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear "
         "--attention-dropout 0 --hidden-dropout 0 --no-persist-layer-norm")
LOCAL = "--transformer-impl local"
TE = "--transformer-impl transformer_engine"
BARE = {"apex_available": False, "te_available": False}  # a plain PyTorch install

#: name → (launch line, settings beyond the megatron-core stack's defaults)
JOBS: dict[str, tuple[str, dict]] = {
    "te": (f"{GPT} {TE}", {}),
    "local": (f"{GPT} {LOCAL}", {}),
    "local_flash": (f"{GPT} {LOCAL} --use-flash-attn", {}),
    "local_no_softmax_fusion": (f"{GPT} {LOCAL} --no-masked-softmax-fusion", {}),
    "local_no_softmax_fusion_fp32": (f"{GPT} {LOCAL} --no-masked-softmax-fusion --attention-softmax-in-fp32", {}),
    "local_no_softmax_fusion_scaled": (f"{GPT} {LOCAL} --no-masked-softmax-fusion --apply-query-key-layer-scaling",
                                       {}),
    "local_no_persist": (f"{GPT} {LOCAL} --no-persist-layer-norm", {}),
    "local_no_gelu_fusion": (f"{GPT} {LOCAL} --no-bias-gelu-fusion", {}),
    "local_no_accumulation_fusion": (f"{GPT} {LOCAL} --no-gradient-accumulation-fusion", {}),
    "local_no_attention_dropout": (f"{GPT} {LOCAL} --attention-dropout 0", {}),
    "local_unfused_bda": (f"{GPT} {LOCAL} --no-bias-dropout-fusion", {}),
    "local_unfused_bda_no_dropout": (f"{GPT} {LOCAL} --no-bias-dropout-fusion --hidden-dropout 0", {}),
    "local_bare": (f"{GPT} {LOCAL} --no-gradient-accumulation-fusion --no-masked-softmax-fusion "
                   "--no-persist-layer-norm", BARE),
    "local_apex": (f"{GPT} {LOCAL} --no-gradient-accumulation-fusion --no-masked-softmax-fusion "
                   "--no-persist-layer-norm", {}),
    "llama_local": (f"{LLAMA} {LOCAL}", {}),
    "llama_local_no_rope_fusion": (f"{LLAMA} {LOCAL} --no-rope-fusion", {}),
    "llama_local_no_swiglu_fusion": (f"{LLAMA} {LOCAL} --no-bias-swiglu-fusion", {}),
    "long_te": (f"{GPT.replace('2048 --max-position-embeddings 2048', '8192 --max-position-embeddings 8192')} {TE} "
                "--use-flash-attn", {}),
    "long_local": (f"{GPT.replace('2048 --max-position-embeddings 2048', '8192 --max-position-embeddings 8192')} "
                   f"{LOCAL} --use-flash-attn", {}),
}


def config(line: str, settings: dict | None = None) -> TrainingConfig:
    """A launch line as `tracekit predict --megatron-args` reads it, the megatron-core stack's defaults under it;
    `settings` as `--set` gives them."""
    return config_from_argv(line, {**get_stack("megatron-core").config, **(settings or {})})


@pytest.fixture(scope="module")
def predicted():
    stack = get_stack("megatron-core")
    configs = [config(line, settings) for line, settings in JOBS.values()]
    out = predict_many(configs, preset("dgx-a100"), ModelSet.load(), stack.calibration(HW))
    for name, result in zip(JOBS, out):
        assert not isinstance(result, Exception), f"{name}: {result}"
    return dict(zip(JOBS, out))


def seconds(predicted, name: str) -> float:
    return predicted[name].iteration_time_s


def ops(c: TrainingConfig) -> tuple[list[dict], list[dict]]:
    """(forward, backward) op rows of the first decoder layer of stage 0: name, primitive, variant, dtype, numel."""
    g = build_graph(c, HW)
    seg = g.segments[0]

    def rows(uses):
        block = next(o.block for o in uses if o.per_layer)
        return [{"name": o.name, **{k: g.specs[o.spec].get(k) for k in ("primitive", "variant", "dtype", "numel",
                                                                           "m", "n", "k", "batch")}}
                for o in uses if o.per_layer and o.block == block]
    return rows(seg.fwd), rows(seg.bwd)


# -- the operators each implementation runs ----------------------------------------------------------------------
def test_local_runs_dot_product_attention_where_transformer_engine_runs_flash_attention():
    te_fwd, _ = ops(config(f"{GPT} {TE}"))
    local_fwd, _ = ops(config(f"{GPT} {LOCAL} --use-flash-attn"))  # --use-flash-attn: nothing reads it in core 0.20
    assert [r["variant"] for r in te_fwd if r["primitive"] in ("attention", "bmm", "softmax")] == ["flash_atten"]
    core = [r for r in local_fwd if r["name"].startswith("self_attention.core_attention")]
    assert [r["variant"] for r in core if r["primitive"] in ("attention", "bmm", "softmax")] == \
        ["baddbmm", "ScaledUpperTriangMaskedSoftmax", "bmm"]
    b, heads, s, d = 4, 16, 2048, 128
    baddbmm = next(r for r in core if r["variant"] == "baddbmm")
    assert (baddbmm["batch"], baddbmm["m"], baddbmm["n"], baddbmm["k"]) == (b * heads, s, s, d)
    # DotProductAttention's context.permute(2, 0, 1, 3).contiguous(): a copy of [b, heads, s, d], read and written
    copy = next(r for r in core if r["variant"] == "context_copy")
    assert copy["numel"] * RES_ADD_MOVES == pytest.approx(2 * b * heads * s * d)


def test_local_linear_layers_add_the_qkv_bias_with_kernels_of_their_own():
    local_fwd, local_bwd = ops(config(f"{GPT} {LOCAL}"))
    te_fwd, te_bwd = ops(config(f"{GPT} {TE}"))
    tokens, qkv = 4 * 2048, 3 * 2048
    fwd = [r for r in local_fwd if r["name"] == "self_attention.linear_qkv.bias"]
    bwd = [r for r in local_bwd if r["name"] == "self_attention.linear_qkv.bias.grad"]
    assert fwd[0]["numel"] * RES_ADD_MOVES == pytest.approx(2 * tokens * qkv)  # read the output, write the sum
    assert bwd[0]["numel"] * RES_ADD_MOVES == pytest.approx(tokens * qkv)  # the gradient summed over the tokens
    assert not [r for r in te_fwd + te_bwd if ".bias" in r["name"] and "linear_qkv" in r["name"]]
    # without biases, no bias kernels
    no_bias, _ = ops(config(f"{GPT} {LOCAL} --disable-bias-linear"))
    assert not [r for r in no_bias if r["name"] == "self_attention.linear_qkv.bias"]


def test_a_qkv_bias_alone_is_the_qkv_projections_own():
    """`--add-qkv-bias` without `--add-bias-linear` (Qwen2's attention): Megatron builds linear_qkv with
    `bias=add_bias_linear or add_qkv_bias` and every other linear without one — the QKV bias adds its
    (heads + 2·groups)·head_dim / tp parameters per layer, its gradient's reduction in the backward, and on the local
    layers its own bias kernel; with biases on everywhere the flag changes nothing."""
    from predictor.architecture.params import layer_params
    from predictor.architecture.tensors import chunk_tensors

    for tp in (1, 2):
        plain = config(f"{LLAMA} {TE} --tensor-model-parallel-size {tp}")
        qwen = config(f"{LLAMA} {TE} --tensor-model-parallel-size {tp} --add-qkv-bias")
        assert layer_params(qwen, 0)[0] - layer_params(plain, 0)[0] == (16 + 2 * 4) * 128 // tp
        # one more parameter tensor per layer (the bias), and nothing else
        assert chunk_tensors(qwen, 0, 0).tensors - chunk_tensors(plain, 0, 0).tensors == 4
    g = build_graph(config(f"{LLAMA} {TE} --add-qkv-bias"), HW, backward_roles=("gemm",))  # a GEMM per role
    roles = {}
    for o in g.segments[0].bwd:
        if o.per_layer and g.specs[o.spec]["primitive"] == "gemm":
            roles.setdefault(o.name, set()).add(g.specs[o.spec]["role"])
    assert "bgrad" in roles["self_attention.linear_qkv"]
    assert not [name for name, r in roles.items() if "bgrad" in r and name != "self_attention.linear_qkv"]
    local_fwd, local_bwd = ops(config(f"{LLAMA} {LOCAL} --add-qkv-bias"))
    tokens, qkv = 4 * 2048, (16 + 2 * 4) * 128
    assert [r["numel"] * RES_ADD_MOVES for r in local_fwd if r["name"].endswith(".bias")] == \
        pytest.approx([2 * tokens * qkv])  # the QKV output read and the sum written; no other linear has a bias
    assert [r["name"] for r in local_bwd if r["name"].endswith(".bias.grad")] == ["self_attention.linear_qkv.bias.grad"]
    # with add_bias_linear the QKV projection has its bias already
    biased = f"{GPT} {LOCAL}"
    assert ops(config(f"{biased} --add-qkv-bias")) == ops(config(biased))


def test_local_norms_are_apex_or_torch_and_gqa_repeats_its_keys_and_values():
    assert {r["variant"] for r in ops(config(f"{GPT} {LOCAL}"))[0] if r["primitive"] == "norm"} == \
        {"layernorm_apex_persist"}  # apex's persistent kernel: width 2048 is one it has
    assert {r["variant"] for r in ops(config(f"{GPT} {LOCAL} --no-persist-layer-norm"))[0]
            if r["primitive"] == "norm"} == {"layernorm_apex"}
    bare = config(f"{GPT} {LOCAL} --no-gradient-accumulation-fusion --no-masked-softmax-fusion "
                  "--no-persist-layer-norm", BARE)
    assert {r["variant"] for r in ops(bare)[0] if r["primitive"] == "norm"} == {"layernorm_torch"}
    llama_fwd, _ = ops(config(f"{LLAMA} {LOCAL}"))
    assert {r["variant"] for r in llama_fwd if r["primitive"] == "norm"} == {"rmsnorm_torch"}
    # repeat_interleave of k and v from 4 groups to 16 heads: read the groups, write every head
    repeats = [r for r in llama_fwd if r["variant"] == "repeat_kv"]
    assert len(repeats) == 2
    for r in repeats:
        assert r["numel"] * RES_ADD_MOVES == pytest.approx(4 * 2048 * (4 + 16) * 128)
    te_fwd, _ = ops(config(f"{LLAMA.replace('--no-persist-layer-norm', '')} {TE}"))
    assert not [r for r in te_fwd if r["variant"] == "repeat_kv"]


def test_the_torch_softmax_chain_is_the_seed_papers_fillmask_and_softmax_in_the_softmax_dtype():
    fwd, bwd = ops(config(f"{GPT} {LOCAL} --no-masked-softmax-fusion"))
    chain = [r["variant"] for r in fwd if r["name"].startswith("self_attention.core_attention")]
    assert chain == ["baddbmm", "causal_mask", "causal_mask", "causal_mask", "fillmask", "softmax", "dropout", "bmm",
                     "context_copy"]
    scores = 4 * 16 * 2048 * 2048
    assert {r["numel"] for r in fwd if r["variant"] in ("fillmask", "softmax")} == {scores}
    assert {r["dtype"] for r in fwd if r["variant"] in ("fillmask", "softmax")} == {"bf16"}
    fp32, _ = ops(config(f"{GPT} {LOCAL} --no-masked-softmax-fusion --apply-query-key-layer-scaling"))
    assert {r["dtype"] for r in fp32 if r["variant"] in ("fillmask", "softmax")} == {"fp32"}
    # casts around it (2 + 4 bytes an element, 3 moves of bf16) and the 1/layer scale in fp32 (4 moves)
    casts = [r for r in fp32 if r["variant"] == "softmax_cast"]
    assert len(casts) == 2 and all(r["numel"] * RES_ADD_MOVES == pytest.approx(3 * scores) for r in casts)
    assert [r["numel"] * RES_ADD_MOVES for r in fp32 if r["variant"] == "softmax_scale"] == \
        [pytest.approx(4 * scores)]
    # the dropout on the probabilities: one element-wise pass over them each way (DROPOUT_MOVES)
    assert [r["numel"] * RES_ADD_MOVES for r in bwd if r["variant"] == "dropout"] == \
        [pytest.approx(DROPOUT_MOVES * scores)]


def test_local_moe_experts_are_a_sequential_mlp_whatever_moe_grouped_gemm_says():
    moe = "--num-experts 4 --moe-router-topk 2 --moe-grouped-gemm --moe-token-dispatcher-type alltoall"
    local_fwd, _ = ops(config(f"{LLAMA} {LOCAL} {moe}"))
    te_fwd, _ = ops(config(f"{LLAMA.replace('--no-persist-layer-norm', '')} {TE} {moe}"))
    assert {r["variant"] for r in te_fwd if r["name"].startswith("mlp.experts.linear_fc1")} == {"grouped_fc1"}
    local_fc1 = [r for r in local_fwd if r["name"].startswith("mlp.experts.linear_fc1")]
    assert {r["variant"] for r in local_fc1} == {"expert_fc1"} and len(local_fc1) == 4


def test_without_apex_and_te_the_optimizer_is_torch_adamw_foreach():
    bare = config(f"{GPT} {LOCAL} --no-gradient-accumulation-fusion --no-masked-softmax-fusion "
                  "--no-persist-layer-norm", BARE)
    apex = config(f"{GPT} {LOCAL} --no-gradient-accumulation-fusion --no-masked-softmax-fusion "
                  "--no-persist-layer-norm")
    assert kernels(bare).optimizer == "torch_foreach" and kernels(apex).optimizer == "fused"
    g, g_apex = build_graph(bare, HW), build_graph(apex, HW)
    assert not g_apex.casts[0]
    [extra] = g.casts[0]
    spec = g.specs[extra.spec]
    params = float(g.specs[g.optimizer[0].spec]["params"])
    # foreach's passes beyond a fused Adam's (80 − 28 bytes a parameter) and the per-tensor copy's 8, in bf16 moves
    per_param = FOREACH_ADAM_BYTES - FUSED_ADAM_BYTES + 8
    assert spec["variant"] == "foreach_adam" and spec["numel"] * RES_ADD_MOVES * 2 == pytest.approx(per_param * params)


# -- each flag moves the prediction the way its kernels do ---------------------------------------------------------
@pytest.mark.parametrize("slower, faster", [
    ("local_no_softmax_fusion", "local"),  # masked_fill + softmax instead of one fused kernel
    ("local_no_softmax_fusion_fp32", "local_no_softmax_fusion"),  # casts to fp32 and back, fp32 kernels
    ("local_no_softmax_fusion_scaled", "local_no_softmax_fusion_fp32"),  # and the scale's pass
    ("local_no_gelu_fusion", "local"),  # the bias added by a kernel of its own before GeLU
    ("local_no_accumulation_fusion", "local"),  # main_grad += grad per weight and micro-batch
    ("local", "local_no_attention_dropout"),  # the dropout kernel on the probabilities
    ("local_unfused_bda", "local"),  # bias add and dropout kernels before each residual add
    ("local_unfused_bda", "local_unfused_bda_no_dropout"),  # the hidden dropout's kernel
    ("local_bare", "local_apex"),  # torch AdamW foreach and per-tensor loops instead of FusedAdam
    ("llama_local_no_rope_fusion", "llama_local"),  # RoPE's element-wise chain instead of TE's fused kernel
    ("llama_local_no_swiglu_fusion", "llama_local"),  # silu, add, mul forward; four kernels backward
    ("local", "te"),  # DotProductAttention's chain against flash attention
    ("long_local", "long_te"),  # at 8k tokens a sequence, the more so
])
def test_a_kernel_flag_moves_the_prediction_its_way(predicted, slower, faster):
    assert seconds(predicted, slower) > seconds(predicted, faster)


def test_use_flash_attn_does_nothing_for_the_local_implementation_and_no_persist_changes_no_time(predicted):
    assert seconds(predicted, "local_flash") == seconds(predicted, "local")
    # apex's persistent and plain LayerNorm kernels move the same bytes: no sample tells them apart
    assert seconds(predicted, "local_no_persist") == seconds(predicted, "local")
    gap = seconds(predicted, "long_local") / seconds(predicted, "long_te")
    assert gap > seconds(predicted, "local") / seconds(predicted, "te")  # the unfused chain grows with s²


def test_the_prediction_says_what_was_assumed_installed(predicted):
    notes = [w for w in predicted["local"].warnings if w.startswith("local implementation")]
    assert len(notes) == 1 and "apex installed" in notes[0] and "assumed" not in notes[0]  # the stack states it
    bare = [w for w in predicted["local_bare"].warnings if w.startswith("local implementation")]
    assert "apex not installed" in bare[0] and "torch AdamW (foreach)" in bare[0]
    assert not [w for w in predicted["te"].warnings if "installed" in w]
    assert not [w for w in predicted["local_flash"].warnings if "not modelled" in w]


# -- what Megatron refuses ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("line, settings, message", [
    (f"{GPT} {LOCAL} --no-masked-softmax-fusion --no-persist-layer-norm", BARE, "--no-gradient-accumulation-fusion"),
    (f"{GPT} {LOCAL} --no-gradient-accumulation-fusion --no-masked-softmax-fusion", BARE,
     "add --no-persist-layer-norm"),
    (f"{GPT} {LOCAL} --no-gradient-accumulation-fusion --no-persist-layer-norm", BARE, "--no-masked-softmax-fusion"),
    (f"{LLAMA.replace('--no-persist-layer-norm', '')} {LOCAL}", {}, "add --no-persist-layer-norm"),
    (f"{GPT} {TE}", {"te_available": False}, "needs Transformer Engine"),
    (f"{LLAMA} {LOCAL} --no-gradient-accumulation-fusion --no-masked-softmax-fusion", BARE, "--no-rope-fusion"),
    (f"{GPT} {LOCAL} --context-parallel-size 2", {"world_size": 2}, "context parallelism"),
    (f"{GPT} {LOCAL} --fp8-format hybrid", {}, "transformer_engine"),
    (f"{GPT} --transformer-impl locale", {}, "transformer_impl: 'locale' is not one of"),
    (f"{GPT} {LOCAL}", {"apex_available": "maybe"}, "apex_available must be true or false"),
    (f"{LLAMA} {LOCAL} --tensor-model-parallel-size 2 --sequence-parallel", {"world_size": 2}, "sequence parallel"),
])
def test_what_megatron_refuses_is_refused_in_one_line(line, settings, message):
    with pytest.raises(ConfigError, match=message) as info:
        config(line, settings).validate()
    assert "\n" not in str(info.value)


def test_the_fused_softmax_takes_what_its_kernel_takes():
    assert fused_softmax_takes(4, 16, 2048, 2048) and fused_softmax_takes(1, 4, 4096, 4096)
    assert not fused_softmax_takes(1, 4, 8192, 8192)  # more than 4096 keys
    assert not fused_softmax_takes(1, 6, 2048, 2048)  # batch·heads not a multiple of 4
    assert not fused_softmax_takes(1, 4, 64, 64)  # up to 128 keys a block holds 8 rows: 4 do not fill it
    assert not fused_softmax_takes(4, 16, 16, 16)  # 16 keys or fewer


def test_the_layer_kernel_flags_are_classed_modelled():
    classes = flag_classes()
    for flag in ("--transformer-impl", "--no-masked-softmax-fusion", "--no-persist-layer-norm", "--no-rope-fusion",
                 "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion", "--no-gradient-accumulation-fusion",
                 "--attention-dropout", "--hidden-dropout", "--use-flash-attn", "--attention-softmax-in-fp32",
                 "--apply-query-key-layer-scaling", "--no-bias-dropout-fusion"):
        assert classes[flag] == "modelled", flag


def test_the_stack_profiles_say_apex_and_te_are_installed():
    for name in ("megatron-core", "megatron-bridge"):
        stated = get_stack(name).config
        assert stated["apex_available"] is True and stated["te_available"] is True
    doc = json.loads(stack_path("megatron-core").read_text())
    assert "apex and Transformer Engine installed" in doc["description"]


def test_a_megatron_logs_arguments_block_says_the_same_as_the_launch_line():
    # Megatron prints argparse's destinations: no_persist_layer_norm True, masked_softmax_fusion False, ...
    block = {"num_layers": "4", "hidden_size": "2048", "num_attention_heads": "16", "seq_length": "2048",
             "micro_batch_size": "4", "global_batch_size": "8", "bf16": "True", "transformer_impl": "local",
             "use_flash_attn": "True", "no_persist_layer_norm": "True", "masked_softmax_fusion": "False",
             "gradient_accumulation_fusion": "False"}
    from_log = TrainingConfig.from_mapping(block, {**get_stack("megatron-core").config, **BARE})
    from_line = config(f"{GPT} {LOCAL} --use-flash-attn --no-persist-layer-norm --no-masked-softmax-fusion "
                       "--no-gradient-accumulation-fusion", BARE)
    assert from_log.attention == from_line.attention == "unfused"
    assert kernels(from_log) == kernels(from_line)
    assert ops(from_log) == ops(from_line)
