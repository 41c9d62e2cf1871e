"""What `tracekit sample` times beyond the GPT grid (tracekit.sampling.model_cases): every case is built without a
GPU, each runs on this CPU where torch has its kernel (and is named as skipped, with the reason, where it has not),
each stores the primitive, variant and features the predictor's operator graph asks for (else the samples would
answer nothing), the recipes compute what Megatron's functions compute (invariants: a rotation keeps norms, a
softmax sums to one, permuting then unpermuting gives the tokens back), and the budget plan covers every kind of case
within two minutes of an H100/H200 (its arithmetic, not a timing)."""
from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch

from predictor.assembly.graph import build_graph
from predictor.layers.norm_rope import FUSED_RMSNORM, FUSED_ROPE
from tests.conftest import SAMPLES
from tracekit.core.config import TrainingConfig
from tracekit.core.samples import FEATURE_COLUMNS, GLU_ROW_SCALE
from tracekit.sampling import catalog, model_cases
from tracekit.sampling.compute import Timer, one_rank_group
from tracekit.sampling.plan import (
    GPU_CASE_S,
    ceil_ms,
    compute_share,
    estimate_s,
    fitted_case_s,
    speed,
    timeline,
)
from tracekit.sampling.recipes import time_any, unsupported
from tracekit.sampling.run import kind_name, planned_cases
from tracekit.sampling.shapes import COMPUTE, Case

GPU_COMPUTE = set(COMPUTE) - {"framework"}
CPU = torch.device("cpu")
#: Kinds of case the predictor's graph asks for by the same primitive and variant today.
ASKED = {("activation", "swiglu"), ("norm", FUSED_RMSNORM), ("norm", "RMSlayernorm"), ("norm", "layernorm"),
         ("elementwise", "RoPE"), ("elementwise", FUSED_ROPE), ("elementwise", "dropout"), ("elementwise", "res_add"),
         ("bmm", "baddbmm"), ("bmm", "bmm"), ("attention", "flash_atten"), ("gemm", "linear1"), ("gemm", "linear2"),
         ("gemm", "linear3"), ("gemm", "linear4"), ("gemm", "router"), ("gemm", "expert_fc1"),
         ("gemm", "expert_fc2"), ("gemm", "grouped_fc1"), ("gemm", "grouped_fc2"), ("elementwise", "router_topk"),
         ("elementwise", "moe_permute"), ("elementwise", "moe_unpermute"), ("softmax", "fillmask"),
         ("softmax", "softmax")}
#: Kinds sampled ahead of the predictor op that should ask for them: they wait for a configuration setting
#: (docs/sample-and-import.md lists them).
AHEAD = {("activation", "swiglu_unfused"), ("activation", "glu"), ("activation", "squared_relu")}


def _layer(name: str, seq: int, micro: int, tp: int) -> catalog.Layer:
    return catalog.Layer(next(m for m in catalog.GPU_MODELS if m.name == name), seq, micro, tp)


def _config(layer: catalog.Layer, **kw) -> TrainingConfig:
    m = layer.model
    base = dict(num_layers=2, hidden_size=m.hidden, num_attention_heads=m.heads, num_query_groups=m.kv_heads,
                kv_channels=m.head_dim, ffn_hidden_size=m.ffn, swiglu=m.glu, seq_length=layer.seq,
                micro_batch_size=layer.micro_batch, tensor_model_parallel_size=layer.tp, world_size=layer.tp,
                global_batch_size=layer.micro_batch, add_bias_linear=False, normalization="RMSNorm",
                position_embedding_type="rope")
    if m.experts:
        base.update(num_experts=m.experts, moe_router_topk=m.topk, moe_ffn_hidden_size=m.ffn)
    return TrainingConfig.from_mapping({**base, **kw})


def _asked(config: TrainingConfig) -> list[dict]:
    return build_graph(config, "H100-80GB-HBM3").specs


def _shape(row: dict) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if k in FEATURE_COLUMNS and v is not None and not _nan(v)}


def _nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def test_every_kind_is_built_without_a_gpu_for_both_devices():
    """The cases of both devices are plain data (no CUDA needed to build them); every kind of the module docstring
    is there, and only on the GPU's catalogue at a GPU's sizes."""
    for device in ("cpu", "cuda"):
        cases = model_cases.model_cases(device, GPU_COMPUTE)
        kinds = {(c.primitive, c.variant) for c in cases}
        assert ASKED | AHEAD <= kinds, (ASKED | AHEAD) - kinds
        dtypes = {c.dtype for c in cases if c.primitive == "gemm"}
        assert dtypes == {None, "fp8", "fp8_row", "fp8_block"}
    gpu = model_cases.model_cases("cuda", GPU_COMPUTE)
    assert {c.feature("head_dim") for c in gpu if c.primitive == "attention"} >= {64, 128}
    assert any(c.feature("kv_heads") < c.feature("heads") for c in gpu if c.primitive == "attention")  # GQA


def test_cases_carry_the_physics_of_their_shapes():
    """A gated unit's rows are its output's times the GELU-equivalent factor of each pass; a fused RoPE's numel is 2/3
    of its tensor's; the unfused chain's scores are batch·heads·seq²; grouped GEMMs' groups are aligned; blockwise
    fp8 shapes are whole 128-blocks in multiples of 4 on a GPU."""
    cases = model_cases.model_cases("cuda", GPU_COMPUTE)
    for c in cases:
        f = dict(c.features)
        if c.variant in model_cases.GLU_ACTIVATIONS:
            for pass_, scale in GLU_ROW_SCALE.items():
                g = c.features_for(pass_)
                assert g["rows"] == pytest.approx(c.get("rows") * scale)
                assert g["numel"] == pytest.approx(g["rows"] * g["width"])
        elif c.variant == FUSED_ROPE:
            tensor = c.get("seq") * c.get("micro_batch") * c.get("heads") * f["width"]
            assert f["numel"] == pytest.approx(tensor * 2 / 3) and f["rows"] * f["width"] == pytest.approx(f["numel"])
        elif c.primitive == "softmax":
            assert f["numel"] == f["batch"] * f["heads"] * f["seq"] * f["width"] <= model_cases.SCORES_MAX["cuda"]
            assert f["rows"] * f["width"] == f["numel"] and f["seq"] == f["width"]  # self-attention's square
        elif c.variant.startswith("grouped_"):
            assert f["m"] % model_cases.GROUP_ALIGN == 0 and f["batch"] > 1
        elif c.dtype == "fp8_block":
            assert all(f[k] % 512 == 0 for k in ("m", "n", "k"))
        elif c.dtype in ("fp8", "fp8_row"):
            assert all(f[k] % 16 == 0 for k in ("m", "n", "k"))


def test_the_predictor_asks_for_what_is_sampled():
    """For catalogue layers, the predictor's graph of the same configuration holds a row of each sampled kind with
    the same primitive, variant and shape features (an MoE with its experts sequential and grouped, the unfused
    attention chain, fused and unfused RoPE and RMSNorm, fp8 recipes: the dtype too)."""
    llama = _layer("llama3-8b", 4096, 2, 2)  # GQA: 16 query and 4 key/value heads per rank
    moe = _layer("mixtral-8x7b", 2048, 2, 1)
    asks = [(llama, {}), (llama, dict(apply_rope_fusion=True, fused_rmsnorm=True)),
            (llama, dict(attention="unfused", attention_dropout=0.1)), (llama, dict(normalization="LayerNorm")),
            (llama, dict(attention="unfused", masked_softmax_fusion=False)),
            (moe, {}), (moe, dict(moe_grouped_gemm=True)),
            (llama, dict(precision="fp8")), (llama, dict(precision="fp8-block"))]
    asked: list[dict] = []
    for layer, kw in asks:
        asked += _asked(_config(layer, **kw))
    sampled = [c for layer in (llama, moe) for c in model_cases.layer_cases(layer, "cuda", GPU_COMPUTE)]
    matched = set()
    for case in sampled:
        for pass_ in ("fwd", "bwd"):
            want = case.features_for(pass_)
            for row in asked:
                if (row["primitive"], row["variant"], row["pass"]) == (case.primitive, case.variant, pass_) \
                        and _shape(row) == pytest.approx(want) and row["dtype"] == (case.dtype or "bf16"):
                    matched.add((case.primitive, case.variant, case.dtype))
    assert {(p, v) for p, v, _ in matched} == ASKED
    assert {d for p, v, d in matched if v == "linear3"} == {None, "fp8", "fp8_block"}  # fp8_row: no recipe asks


def _kinds(device: str) -> dict[tuple, list[Case]]:
    out: dict[tuple, list[Case]] = {}
    for case in planned_cases(device, GPU_COMPUTE, "fp32", 2):
        out.setdefault(case.kind, []).append(case)
    return out


def test_each_case_runs_on_this_cpu_or_is_named_skipped_with_its_reason():
    """Every kind of the CPU's plan is timed once here (its smallest shape: forward and backward, or the optimizer
    step) unless torch lacks its kernel on a CPU, or it would mean nothing there: the fused SwiGLU (compiled on CUDA
    only), TE's fused RoPE, torch's fused RMSNorm (a CUDA kernel) and the fp8 GEMMs (emulated on a CPU), each named
    with why."""
    timer = Timer(CPU, warmup=0, repeats=1)
    skipped = {}
    with one_rank_group():
        for kind, same in _kinds("cpu").items():
            first = same[0]
            reason = unsupported(first, CPU, "fp32")
            if reason:
                skipped[(first.primitive, first.variant, first.dtype)] = reason
                continue
            smallest = min(same, key=lambda c: math.prod(v for _, v in c.features if v))
            timed = time_any(smallest, "fp32", timer)
            passes = {"optimizer"} if first.primitive == "optimizer" else {"fwd", "bwd"}
            assert set(timed) == passes and all(v > 0 for v in timed.values()), kind
    names = {(p, v) for p, v, _ in skipped}
    assert {("activation", "swiglu"), ("elementwise", FUSED_ROPE), ("norm", FUSED_RMSNORM)} <= names
    assert {d for _, _, d in skipped} == {None, "fp8", "fp8_row", "fp8_block"}
    assert all("no fp8 arithmetic" in r for (_, _, d), r in skipped.items() if d)
    assert "compiled on CUDA only" in skipped[("activation", "swiglu", None)]
    assert "Transformer Engine" in skipped[("elementwise", FUSED_ROPE, None)]
    assert all(reason and "\n" not in reason for reason in skipped.values())


def test_a_short_cpu_run_stores_the_new_kinds_and_names_what_it_skipped(tmp_path):
    from tracekit.core.store import SampleStore
    from tracekit.sampling.run import sample

    store = SampleStore(tmp_path / "store")
    run = sample("cpu", ["activation", "norm", "softmax", "gemm"], budget_s=6, store=store, warmup=1, repeats=1,
                 rounds=1)
    frame = store.read()
    glu = frame[frame["variant"] == "glu"]
    assert len(glu) and set(glu["pass"]) == {"fwd", "bwd"}

    def outputs(pass_: str) -> set[tuple[float, float]]:  # (width, the gated unit's output rows) of each row
        rows = glu[glu["pass"] == pass_]
        return {(w, round(r / GLU_ROW_SCALE[pass_], 6)) for w, r in zip(rows["width"], rows["rows"])}

    assert outputs("fwd") == outputs("bwd")  # each case's two rows: the same unit, sized per pass
    assert {"activation/swiglu", "norm/rmsnorm_fused", "gemm/linear1/fp8"} <= set(run.skipped)
    assert set(frame.loc[frame["primitive"] == "gemm", "dtype"]) == {"fp32"}


# -- recipes compute what Megatron's functions compute ------------------------------------------------------------
def test_the_swiglu_backward_is_the_gradient_of_its_forward():
    from tracekit.sampling.layer_recipes import swiglu_backward, swiglu_forward

    y = torch.randn(64, 2 * 48, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(64, 48, dtype=torch.float64)
    (auto,) = torch.autograd.grad(swiglu_forward(y), y, grad)
    assert torch.allclose(swiglu_backward(grad, y.detach()), auto)


def test_rope_rotates_each_pair_of_dims_keeping_its_norm():
    from tracekit.sampling.layer_recipes import apply_rope, rope_freqs

    s, d = 16, 32
    t = torch.randn(s, 2, 3, d, dtype=torch.float64)
    out = apply_rope(t, rope_freqs(s, d, CPU).double())
    half = d // 2
    pair = t[..., :half] ** 2 + t[..., half:] ** 2  # rotate_half pairs dim i with dim i + d/2
    assert torch.allclose(out[..., :half] ** 2 + out[..., half:] ** 2, pair)
    assert torch.allclose(out[0], t[0])  # position 0: no rotation


def test_the_mask_is_filled_in_place_into_the_scores_view_as_megatron_does():
    """The `fillmask` recipe writes into the baddbmm output itself (no new tensor), so its backward is the chain the
    seed paper timed and Megatron runs: AsStridedBackward0, then CopySlices; the gradient stops at the masked
    scores and passes the others through."""
    from tracekit.sampling.layer_recipes import MASKED, fill_causal_mask

    b, heads, s = 2, 3, 8
    leaf_scores = torch.randn(b * heads, s, s, dtype=torch.float64, requires_grad=True)
    scores = leaf_scores.clone()  # the baddbmm output
    mask = torch.triu(torch.ones((s, s), dtype=torch.bool), diagonal=1)
    out = fill_causal_mask(scores, b, mask)
    assert out.shape == (b, heads, s, s) and out.data_ptr() == scores.data_ptr()
    assert (out[..., mask] == MASKED).all()
    assert torch.equal(out[..., ~mask], leaf_scores.view(b, heads, s, s)[..., ~mask])
    node = out.grad_fn
    assert node.name() == "AsStridedBackward0" and node.next_functions[0][0].name().endswith("CopySlices")
    grad = torch.randn(b, heads, s, s, dtype=torch.float64)
    torch.autograd.backward(out, grad)
    got = leaf_scores.grad.view(b, heads, s, s)
    assert (got[..., mask] == 0).all() and torch.equal(got[..., ~mask], grad[..., ~mask])


def test_the_torch_softmax_path_is_sampled_as_its_two_operators_each_forward_and_backward():
    """Megatron's torch softmax path is the seed paper's two operators, each under the variant the predictor's row
    asks by, each timed forward and backward; the fill's forward is its one in-place fill, its backward the fill of
    the gradient and the copies around it (more passes over the scores: what its time then holds)."""
    from torch.profiler import profile

    from tracekit.sampling.compute import Timer
    from tracekit.sampling.layer_recipes import fill_causal_mask

    cases = model_cases.model_cases("cpu", {"softmax"})
    assert {c.variant for c in cases} == {"fillmask", "softmax"}
    largest = max(c.feature("numel") for c in cases)
    timer = Timer(CPU, 1, 3)
    for case in (c for c in cases if c.feature("numel") == largest):
        times = time_any(case, "fp32", timer)
        assert set(times) == {"fwd", "bwd"} and min(times.values()) > 0
    scores = torch.randn(8, 16, 16, requires_grad=True)
    mask = torch.triu(torch.ones((16, 16), dtype=torch.bool), diagonal=1)
    base = scores.clone()
    with profile() as forward:
        out = fill_causal_mask(base, 2, mask)
    with profile() as backward:
        torch.autograd.backward(out, torch.ones_like(out))
    fwd_ops = {e.name for e in forward.events() if e.name.startswith("aten::")}
    bwd_ops = {e.name for e in backward.events() if e.name.startswith("aten::")}
    assert "aten::masked_fill_" in fwd_ops and "aten::copy_" not in fwd_ops
    assert {"aten::masked_fill", "aten::copy_"} <= bwd_ops


def test_the_predictors_torch_softmax_rows_are_answered_each_by_its_own_operators_samples(tmp_path):
    """After a CPU run of the softmax kinds, the unfused attention's `fillmask` row is answered by a model of the
    fill's samples and its `softmax` row, and the fused kernel's `ScaledUpperTriangMaskedSoftmax` row, by one of
    softmax's: neither row is priced by a model of both operators (which counted the chain twice)."""
    from predictor.costs.learned.models import ModelSet
    from predictor.costs.learned.training import train_models
    from tracekit.core.store import SampleStore
    from tracekit.sampling.run import sample

    store = SampleStore(tmp_path / "store")
    run = sample("cpu", ["softmax"], budget_s=20, store=store, warmup=1, repeats=1, rounds=1)
    train_models(store.read(), tmp_path / "models", folds=2)
    models = ModelSet.load(tmp_path / "models")
    for pass_ in ("fwd", "bwd"):
        answers = {v: models.resolve(run.hardware, "softmax", pass_, v).meta["variants"]
                   for v in ("fillmask", "softmax", "ScaledUpperTriangMaskedSoftmax")}
        assert answers == {"fillmask": ["fillmask"], "softmax": ["softmax"],
                           "ScaledUpperTriangMaskedSoftmax": ["softmax"]}, pass_


def test_permuting_then_unpermuting_gives_each_token_back_weighted_by_its_probabilities():
    from tracekit.sampling.moe_recipes import routing, sorted_token_indices

    tokens, experts, topk, hidden = 40, 8, 2, 16
    probs, routing_map = routing(torch.randn(tokens, experts, dtype=torch.float64), topk)
    assert (routing_map.sum(1) == topk).all() and torch.allclose(probs.sum(1), torch.ones(tokens, dtype=torch.float64))
    x = torch.randn(tokens, hidden, dtype=torch.float64)
    index = sorted_token_indices(routing_map, tokens * topk)
    assert Counter(index.tolist()) == {i: topk for i in range(tokens)}
    permuted = x.index_select(0, index)
    weights = probs.T.contiguous().masked_select(routing_map.T.contiguous())
    back = torch.zeros_like(x).scatter_add(0, index.unsqueeze(1).expand(-1, hidden), permuted * weights[:, None])
    assert torch.allclose(back, x)  # the weights of a token sum to 1


def test_the_grouped_gemm_is_each_expert_s_gemm():
    from tracekit.sampling.moe_recipes import grouped_mm

    groups, m, n, k = 3, 16, 24, 32
    x, w = torch.randn(groups * m, k), torch.randn(groups, n, k)
    offs = torch.arange(m, groups * m + 1, m, dtype=torch.int32)
    out = grouped_mm()(x, w.transpose(-2, -1), offs=offs)
    each = torch.cat([x[g * m:(g + 1) * m] @ w[g].T for g in range(groups)])
    assert torch.allclose(out, each, atol=1e-4)


def test_an_fp8_gemm_multiplies_the_fp8_values_and_its_linear_is_timed_where_torch_runs_it():
    """torch runs tensorwise and rowwise fp8 GEMMs on a CPU (emulated: the sampler skips them there), so their recipe
    is checked here: the product of the fp8 values, and a linear's forward and backward timed."""
    from tracekit.sampling.fp8_recipes import fp8_linear, scaled_mm

    a = torch.randn(32, 64).to(torch.float8_e4m3fn)
    b = torch.randn(48, 64).to(torch.float8_e4m3fn)
    for scaling in ("tensorwise", "rowwise"):
        out = scaled_mm(a, b.t(), scaling).float()
        assert torch.allclose(out, a.float() @ b.float().t(), rtol=2e-2, atol=2e-1)
        timed = fp8_linear(64, 48, 32, scaling, Timer(CPU, warmup=0, repeats=1))
        assert set(timed) == {"fwd", "bwd"} and min(timed.values()) > 0


def test_megatrons_adamw_step_runs_foreach_and_fused_over_main_copies():
    from tracekit.sampling.optimizer_steps import adamw_step

    timer = Timer(CPU, warmup=0, repeats=1)
    for fused in (False, True):
        for dtype in (torch.float32, torch.bfloat16):
            assert adamw_step([(64, 32), (64,)], dtype, timer, fused) > 0


# -- the budget plan -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hardware", ["H200-141GB", "H100-80GB-HBM3"])
@pytest.mark.parametrize("collectives", [0, 4])
def test_two_minutes_on_an_h100_or_h200_cover_every_kind_of_case_once(hardware, collectives):
    """The plan's first round holds one case of every kind, and by its estimate (the datasheet's rates at half, the
    wall time per case a real H200 run showed, the fused SwiGLU's compile) it ends inside the compute share of a
    120 s budget: all compute primitives, beside 4 collectives or none."""
    runs = 7  # 2 warm-up and 5 timed calls
    cases = planned_cases("cuda", GPU_COMPUTE, "bf16", runs, hardware)
    kinds = list(dict.fromkeys(c.kind for c in cases))
    assert {c.kind for c in cases[:len(kinds)]} == set(kinds)  # the first round: every kind once
    rate = speed("cuda", hardware)
    starts = timeline(cases, rate, 2, runs, "cuda")
    first_round_end = starts[len(kinds) - 1] + estimate_s(cases[len(kinds) - 1], rate, 2, runs)
    share = compute_share(120, len(GPU_COMPUTE), collectives)
    assert first_round_end < share, (first_round_end, share)
    assert len(kinds) >= 45


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_after_the_first_round_every_primitive_and_each_of_its_kinds_get_the_same_share(device):
    """Time-fair by primitive, then by kind within it: after the first round, each next case is of the primitive
    that has used the least estimated time among those with cases left, and of its kind that has."""
    runs, rate = 7, speed(device, "H200-141GB")
    compute = GPU_COMPUTE | ({"framework"} if device == "cpu" else set())
    cases = planned_cases(device, compute, "bf16", runs, "H200-141GB")
    kinds = len({c.kind for c in cases})
    left = Counter(c.kind for c in cases)
    spent: Counter = Counter()
    for n, case in enumerate(cases[:4000]):
        if n >= kinds:
            primitive = case.kind[0]
            others = {k[0] for k in left if left[k]} - {primitive}
            by_primitive = {p: sum(v for k, v in spent.items() if k[0] == p) for p in others | {primitive}}
            assert all(by_primitive[primitive] <= by_primitive[p] + 1e-9 for p in others)
            siblings = [k for k in left if left[k] and k[0] == primitive and k != case.kind]
            assert all(spent[case.kind] <= spent[k] + 1e-9 for k in siblings)
        spent[case.kind] += estimate_s(case, rate, 2, runs)
        left[case.kind] -= 1


def test_the_gpu_case_overhead_is_what_the_h200_run_shows():
    """GPU_CASE_S is the corpus's H200 run's wall time beyond its measured kernels, per case timing, rounded up."""
    folder = SAMPLES / "h200-tracekit-sample"
    summary = json.loads((folder / "summary.json").read_text())
    assert GPU_CASE_S == ceil_ms(fitted_case_s(folder / "store", summary))


def test_the_device_clocks_spin_is_sized_by_the_h200_runs_shortest_call():
    """HOST_CALL_S is the corpus's H200 run's shortest sample (a call's host round trip, launch and synchronize),
    in whole µs; the plan adds the spin it sizes to every timed call on a GPU, none on a CPU."""
    from tracekit.core.store import SampleStore
    from tracekit.sampling.clocks import SPIN_MARGIN
    from tracekit.sampling.plan import HOST_CALL_S

    shortest = SampleStore(SAMPLES / "h200-tracekit-sample" / "store").read()["duration_us"].min()
    assert HOST_CALL_S * 1e6 == int(shortest)
    assert speed("cuda", "H200-141GB").spin_s == SPIN_MARGIN * HOST_CALL_S and speed("cpu").spin_s == 0


def test_the_plan_does_not_underestimate_the_h200s_measured_gemms():
    """The plan's GEMM estimate errs long against the matmul rates measured on an H200 apart from the sampler
    (operator-samples/h200-matmul/: bf16, and fp8 with tensorwise and rowwise scales): over each set of shapes, the
    estimate's total is at least the measured total."""
    from tracekit.sampling.plan import Speed

    rows = json.loads((SAMPLES / "h200-matmul" / "gemm.json").read_text())["rows"]
    rate = speed("cuda", "H200-141GB")
    bare = Speed(rate.flops, rate.fp8_flops, rate.bandwidth, rate.launch_s, 0.0)
    totals: dict[str, list[float]] = {}
    for row in rows:
        if "us" not in row:
            continue
        dtype = None if row["dtype"] == "bf16" else "fp8" if row["scaling"] == "tensorwise" else "fp8_row"
        case = Case("gemm", "linear1", tuple(sorted(dict(m=row["m"], n=row["n"], k=row["k"], batch=1).items())),
                    dtype=dtype)
        # a case's estimate is its forward GEMM's and its two backward GEMMs' of the same work
        estimate = (estimate_s(case, bare, 2, 1) - _inputs_s(case, bare)) / 3
        total = totals.setdefault(row["dtype"] + str(row["scaling"]), [0.0, 0.0])
        total[0] += estimate
        total[1] += row["us"] * 1e-6
    assert len(totals) == 3
    for name, (estimate, measured) in totals.items():
        assert estimate >= measured, (name, estimate, measured)


def test_two_minutes_still_cover_every_kind_if_each_kernel_took_four_times_the_estimate():
    """The first round's estimate is mostly per-case wall time and the SwiGLU compile, not kernels: at a quarter of
    the plan's rates it still ends inside 120 s on an H200."""
    from tracekit.sampling.plan import Speed

    runs, rate = 7, speed("cuda", "H200-141GB")
    slow = Speed(rate.flops / 4, rate.fp8_flops / 4, rate.bandwidth / 4, 4 * rate.launch_s, rate.case_s)
    cases = planned_cases("cuda", GPU_COMPUTE, "bf16", runs, "H200-141GB")
    kinds = len({c.kind for c in cases})
    starts = timeline(cases, slow, 2, runs, "cuda")
    assert starts[kinds - 1] + estimate_s(cases[kinds - 1], slow, 2, runs) < 120


def _inputs_s(case: Case, rate) -> float:
    from tracekit.sampling.plan import work

    return work(case, 2)[1] / 3 / rate.bandwidth * 4


def test_each_kind_is_named_for_the_skipped_list():
    cases = planned_cases("cuda", GPU_COMPUTE, "bf16", 7)
    names = {kind_name(c) for c in cases}
    assert {"gemm/linear1/fp8_block", "activation/swiglu", "optimizer/optimizer_fused"} <= names


def test_a_fused_optimizer_step_not_sampled_is_answered_by_its_stages_plain_step():
    """Until a GPU has fused AdamW samples, the predictor's `{stage}_optimizer_fused` rows take the plain step of the
    same stage; a fused kernel's variant of another primitive (`rmsnorm_fused`) keeps its own route (the fused
    LayerNorm's model, not the unfused RMSNorm chain's)."""
    from predictor.costs.learned.models import ModelSet

    models = ModelSet.load()
    for stage in ("firstStage", "middleStage", "lastStage"):
        plain = models.resolve("A100-SXM4-80GB", "optimizer", "optimizer", f"{stage}_optimizer")
        assert plain is not None and plain.group == f"{stage}_optimizer"
        assert models.resolve("A100-SXM4-80GB", "optimizer", "optimizer", f"{stage}_optimizer_fused") is plain
    fused_norm = models.resolve("A100-SXM4-80GB", "norm", "fwd", FUSED_RMSNORM)
    assert fused_norm is models.resolve("A100-SXM4-80GB", "norm", "fwd", "layernorm")
