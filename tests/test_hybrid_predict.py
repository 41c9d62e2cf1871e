"""Hybrid models predicted end to end: the pattern's layers priced each by its own kind (the bundled models, the
roofline for the new kernels, flagged as fallbacks), the dense special case equal to the GPT model it is, the scan
linear where attention is quadratic, `|` splits on the stages Megatron places them, and the inputs tracekit cannot
price refused in one line: an unknown symbol, an unknown `--spec`, `--is-hybrid-model` without a pattern, a published
row whose notes say it is not a transformer and that gives no pattern. Nemotron 3 Nano's published rows (the corpus)
are read as the hybrid model they are."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from extractors import jobs as B
from extractors.jobs.megatron import config_from_argv
from predictor.architecture.flops import layer_flops_per_token, model_flops_per_iteration
from predictor.architecture.params import chunk_params
from predictor.layers.decoder import kind_name, layer_blocks
from predictor.layers.ssm import mamba
from predictor.memory.stages import stage_memory
from predictor.predict import predict
from tests.conftest import E2E
from tracekit.core import hybrid_pattern
from tracekit.core.cluster import preset
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError
from tracekit.core.megatron_arguments import flag_classes
from tracekit.core.pipeline_layout import chunks
from tracekit.core.samples import HYBRID_PRIMITIVES
from tracekit.core.stacks import get_stack

ROOT = Path(__file__).resolve().parent.parent
HW = "H100-80GB-HBM3"
BASE = dict(hidden_size=1024, num_attention_heads=16, num_query_groups=4, seq_length=4096, micro_batch_size=1,
            global_batch_size=16, add_bias_linear=False, normalization="RMSNorm", swiglu=True,
            position_embedding_type="rope", untie_embeddings_and_output_weights=True, precision="bf16")
MAMBA = dict(mamba_num_heads=32, mamba_head_dim=64, mamba_state_dim=128, mamba_num_groups=8)


@pytest.fixture(scope="module")
def models():
    from predictor.costs.learned.models import ModelSet

    return ModelSet.load()


def config(**kw) -> TrainingConfig:
    stack = get_stack("megatron-core").config
    return TrainingConfig.from_mapping({**BASE, **kw}, stack).validate()


def run(models, c: TrainingConfig):
    return predict(c, preset("dgx-h100", HW), models, get_stack("megatron-core").calibration(HW))


# -- the dense special case ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("split", [dict(), dict(pipeline_model_parallel_size=2, world_size=2),
                                   dict(tensor_model_parallel_size=2, sequence_parallel=True, world_size=2,
                                        recompute_granularity="full", recompute_method="uniform")])
def test_a_pattern_of_attention_and_mlp_layers_predicts_the_dense_model(models, split):
    """`*-` is a GPT layer's two halves, each with its own norm: the same ops, parameters, FLOPs and memory; the
    iteration time equal to the GPT model's (the same sums, added in another order). Under full recompute the
    memory differs, as in Megatron: a hybrid stack checkpoints each of its layers, a GPT model each pair."""
    layers = 4
    gpt = config(num_layers=layers, **split)
    pattern = config(num_layers=2 * layers, hybrid_layer_pattern="*-" * layers, **split)
    assert [kind_name(layer_blocks(pattern, i)) for i in range(2)] == ["attention_layer", "mlp_layer"]
    assert model_flops_per_iteration(pattern) == pytest.approx(model_flops_per_iteration(gpt), rel=1e-12)
    for stage in range(gpt.pp):
        assert chunk_params(pattern, stage, 0) == chunk_params(gpt, stage, 0)
    if gpt.recompute_granularity != "full":
        for mine, theirs in zip(stage_memory(pattern, HW), stage_memory(gpt, HW)):
            assert mine == pytest.approx(theirs, rel=1e-12)
    a, b = run(models, gpt), run(models, pattern)
    assert b.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-12)
    assert b.breakdown == pytest.approx(a.breakdown, rel=1e-12, abs=1e-15)


# -- Mamba against attention --------------------------------------------------------------------------------------
def test_each_mamba_layer_in_place_of_attention_trades_its_share_of_the_scores_for_the_scan():
    """At a long sequence, each `M` replacing a `*` removes that layer's attention (projections and the quadratic
    scores: its share of the model's attention FLOPs) and adds a Mamba layer's, whose scan is linear."""
    seq = 32768
    patterns = ["*-*-*-*-", "M-*-*-*-", "M-M-*-*-", "M-M-M-*-"]
    totals, attention = [], []
    for p in patterns:
        c = config(num_layers=len(p), hybrid_layer_pattern=p, seq_length=seq, **MAMBA)
        per_layer = [layer_flops_per_token(c, i) for i in range(c.num_layers)]
        totals.append(sum(per_layer))
        attention.append(sum(f for i, f in enumerate(per_layer) if p[i] == "*"))
    one_attention = attention[0] / 4
    c = config(num_layers=8, hybrid_layer_pattern=patterns[1], seq_length=seq, **MAMBA)
    one_mamba = layer_flops_per_token(c, 0)
    scan = mamba.scan_flops(mamba.shape_of(c), 1, seq) / seq
    for k in range(1, 4):
        assert attention[k] == pytest.approx(attention[0] * (4 - k) / 4)  # the layer's share gone
        assert totals[k] == pytest.approx(totals[0] - k * one_attention + k * one_mamba)
    assert 0 < scan < one_mamba and one_mamba < one_attention  # at 32k tokens the scores dominate attention


def test_the_scans_flops_grow_linearly_with_the_sequence_where_attentions_grow_quadratically():
    per_token = {}
    for seq in (4096, 8192, 16384):
        c = config(num_layers=2, hybrid_layer_pattern="M*", seq_length=seq, **MAMBA)
        per_token[seq] = (layer_flops_per_token(c, 0), layer_flops_per_token(c, 1))
    # per token: the Mamba layer's is the same at any length (the whole sequence linear), attention's grows with it
    assert per_token[4096][0] == pytest.approx(per_token[16384][0])
    growth = [per_token[s][1] - per_token[s // 2][1] for s in (8192, 16384)]
    assert growth[1] == pytest.approx(2 * growth[0])  # the scores' part doubles per token: quadratic in all


# -- pipeline splits ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pattern,pp", [("M*M-|M*M-", 2), ("M-|*E|M-|ME", 2), ("M*-|M*-|M-|E-|M-|*E", 3)])
def test_pipe_splits_give_the_stages_megatron_gives(pattern, pp):
    """Segment i on pipeline rank i mod pp, model chunk i // pp (Megatron's select_pipeline_segment), written here
    from the pattern's text; the embedding on rank 0's first chunk, the loss on the last rank's last; each chunk's
    parameters its layers'."""
    segments = pattern.split("|")
    vp = len(segments) // pp
    c = config(num_layers=len(pattern.replace("|", "")), hybrid_layer_pattern=pattern, global_batch_size=24,
               pipeline_model_parallel_size=pp, world_size=pp, num_experts=4, moe_ffn_hidden_size=512, **MAMBA)
    assert c.vp == vp
    start, expected = 0, {}
    for i, seg in enumerate(segments):
        expected[(i % pp, i // pp)] = tuple(range(start, start + len(seg)))
        start += len(seg)
    layout = chunks(c)
    for rank in range(pp):
        for chunk in range(vp):
            part = layout[rank][chunk]
            assert part.layers == expected[(rank, chunk)]
            assert part.embedding == (rank == 0 and chunk == 0)
            assert part.loss == (rank == pp - 1 and chunk == vp - 1)
            symbols = "".join(pattern.replace("|", "")[i] for i in part.layers)
            assert symbols == segments[chunk * pp + rank]


def test_mtp_depths_are_the_patterns_mtp_layers_on_the_last_stage():
    c = config(num_layers=99, hybrid_layer_pattern="M*M-|M*ME/*E/*E", pipeline_model_parallel_size=2, world_size=2,
               num_experts=4, moe_ffn_hidden_size=512, **MAMBA)
    assert c.num_layers == 8 and c.layout is not None and c.layout.mtp_num_layers == 2
    assert [part.mtp for row in chunks(c) for part in row] == [0, 2]
    assert [b.name for b in layer_blocks(c, c.num_layers)] == ["attention", "moe"]
    assert c.hybrid is not None and any("ignoring --num-layers (99)" in n for n in c.hybrid.notes(c))


# -- refusals -------------------------------------------------------------------------------------------------------
def test_what_tracekit_cannot_price_is_refused_in_one_line():
    argv = "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --bf16"
    with pytest.raises(ConfigError, match="'X' is not a valid layer symbol"):
        config_from_argv(f"{argv} --hybrid-layer-pattern M*X-").validate()
    with pytest.raises(ConfigError, match="--is-hybrid-model without --hybrid-layer-pattern"):
        config_from_argv(f"{argv} --is-hybrid-model")
    with pytest.raises(ConfigError, match="--spec my.module my_spec: tracekit prices"):
        config_from_argv(f"{argv} --spec my.module my_spec")
    with pytest.raises(ConfigError, match="gated_delta_product_stack_spec: tracekit prices"):
        config_from_argv(f"{argv} --hybrid-layer-pattern M*M- --spec megatron.core.models.hybrid.hybrid_layer_specs "
                         "gated_delta_product_stack_spec")
    with pytest.raises(ConfigError, match="needs --hybrid-layer-pattern"):
        config_from_argv(f"{argv} --spec megatron.core.models.hybrid.hybrid_layer_specs hybrid_stack_spec")
    known = config_from_argv(f"{argv} --hybrid-layer-pattern M*M- --spec megatron.core.models.mamba.mamba_layer_specs "
                             "mamba_stack_spec").validate()
    assert known.hybrid is not None and known.num_layers == 4
    off = config_from_argv(f"{argv} --hybrid-layer-pattern M*M- --disable-mamba-mem-eff-path")
    assert off.hybrid is not None and off.hybrid.use_mamba_mem_eff_path is False


def test_every_hybrid_flag_of_megatron_is_modelled_or_refused():
    """The flags of the hybrid models (their patterns, Mamba2, GDN, DSA, the layer spec) are read — priced, or refused
    with the reason — never warned about as unmodelled; the inference-only ones do not change a training step."""
    flags = json.loads((ROOT / "tracekit" / "data" / "megatron_flags.json").read_text())["flags"]
    hybrid_flag = re.compile(r"^--(hybrid-(layer|override)-pattern|mtp-hybrid|is-hybrid-model|spec$|"
                             r"(disable-)?mamba|linear-(attention-freq|conv|key|value|num)|(disable-|no-)?dsa-|"
                             r"experimental-attention-variant)")
    found = [f for f in flags if hybrid_flag.search(f)]
    assert len(found) >= 30
    classes = flag_classes()
    for flag in found:
        expected = {"no_effect"} if "inference" in flag else {"modelled", "no_effect"}
        assert classes[flag] in expected, flag
    assert [f for f in found if classes[f] == "no_effect" and "inference" not in f] == \
        ["--dsa-indexer-k-norm-epsilon", "--dsa-indexer-rope-interleaved"]  # the same work either way


# -- the published rows ---------------------------------------------------------------------------------------------
def nano_rows() -> list[dict[str, str]]:
    with (E2E / "megatron_bridge_hybrid.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_the_published_nano_rows_are_read_as_the_hybrid_model_they_are():
    for line, cells in enumerate(nano_rows(), start=2):
        row = B.parse_row(cells, line, None, None)
        assert row.error is None, row.error
        c = row.config
        assert c is not None and c.hybrid is not None
        pattern = c.hybrid.pattern(c.num_layers)
        assert pattern == cells["hybrid_override_pattern"] and c.num_layers == int(cells["num_layers"])
        shape = c.hybrid.mamba(c.hidden_size)
        stated = re.search(r"(\d+) Mamba2 \((\d+) heads x (\d+), state (\d+), (\d+) groups\)", cells["notes"])
        assert stated is not None
        assert (shape.heads, shape.head_dim, shape.state, shape.groups) == tuple(int(v) for v in stated.groups()[1:])
        kinds = [kind_name(layer_blocks(c, i)) for i in range(c.num_layers)]
        assert (kinds.count("mamba_layer"), kinds.count("moe_layer"), kinds.count("attention_layer")) == \
            tuple(hybrid_pattern.layer_counts(pattern)[s] for s in "ME*")
        assert c.position_embedding_type == "none" and c.extra.get("squared_relu") is True


def test_a_row_whose_notes_say_it_is_no_transformer_is_refused_without_a_pattern():
    cells = dict(nano_rows()[0])
    cells["hybrid_override_pattern"] = ""
    cells["notes"] = re.sub(r"arch: \w+", "arch: SomeOtherProvider", cells["notes"])
    row = B.parse_row(cells, 2, None, None)
    assert row.config is None and row.error is not None and "not a transformer" in row.error


def test_a_nano_row_prices_the_new_kernels_by_their_roofline_and_says_so(models):
    cells = next(r for r in nano_rows() if r["hardware_gpu"].startswith("H100"))
    config_, cluster, stack = B.parse_row(cells, 2, None, None).complete()
    prediction = predict(config_, cluster, models, stack.calibration(cluster.hardware))
    flagged = {f["primitive"]: f for f in prediction.fallbacks if f["primitive"] in HYBRID_PRIMITIVES}
    assert {"causal_conv1d", "ssd_chunk_scan", "ssd_chunk_state", "ssd_bmm_chunk"} <= set(flagged)
    assert all(f["path"] == "roofline" for f in flagged.values())
    assert prediction.iteration_time_s > 0 and not [w for w in prediction.warnings if "not modelled" in w]


# -- search -------------------------------------------------------------------------------------------------------
def test_search_proposes_pipe_placements_megatron_accepts():
    """Every split a search proposes for a hybrid model is a pattern Megatron's rules accept (hybrid.validate): the
    same layers in the same order, pp·vp segments, none empty, the MTP depths kept; and the FLOPs it balances are
    balanced: with two or three segments, no cut of the layers has a lighter heaviest segment (the last one carrying
    the output layer and the MTP depth)."""
    from itertools import accumulate, combinations

    from predictor.sweeps.search import enumerate_configs, split_of

    pattern = "MEMEM*EMEMEM*EMEMEM*EMEMEM*E/*E"
    base = {**BASE, **MAMBA, "num_layers": 27, "hybrid_layer_pattern": pattern, "num_experts": 8,
            "moe_ffn_hidden_size": 512, "global_batch_size": 64}
    configs, _ = enumerate_configs(base, 16, {"micro_batch_size", "recompute_granularity", "sequence_parallel",
                                              "use_distributed_optimizer", "tensor_model_parallel_size",
                                              "expert_model_parallel_size", "expert_tensor_parallel_size"})
    shapes = set()
    for c in configs:
        assert c.hybrid is not None
        placed = split_of(c)["hybrid_layer_pattern"]
        main, *mtp = placed.split("/")
        assert main.replace("|", "") == pattern.split("/")[0] and mtp == ["*E"]
        segments = main.split("|")
        assert len(segments) == c.pp * c.vp and all(segments)
        c.hybrid.validate(c)  # Megatron's rules for the pattern with this split
        shapes.add((c.pp, c.vp))
        weights = [layer_flops_per_token(c, i) for i in range(c.num_layers)]
        tail = 2.0 * c.hidden_size * c.padded_vocab_size * 2 + layer_flops_per_token(c, c.num_layers)

        def heaviest(cuts: tuple[int, ...]) -> float:
            edges = (0, *cuts, len(weights))
            sums = [sum(weights[a:b]) for a, b in zip(edges, edges[1:])]
            sums[-1] += tail
            return max(sums)

        ends = list(accumulate(len(seg) for seg in segments))[:-1]
        if 1 < len(segments) <= 3:
            best = min(heaviest(cuts) for cuts in combinations(range(1, len(weights)), len(segments) - 1))
            assert heaviest(tuple(ends)) == pytest.approx(best)
    assert {(1, 1), (2, 1), (4, 1), (2, 2)} <= shapes
