"""Hybrid layer patterns as Megatron-core reads them (tracekit.core.hybrid): the symbols and counts of the published
Nemotron 3 Nano pattern, `|` segments placed on the stages Megatron's rule gives (checked against tracekit's own
pipeline placement of the same dense model), the ratio allocation's invariants, and Megatron's refusals with its
reasons."""
from __future__ import annotations

import csv
import re
from typing import Any

import pytest

from tests.conftest import E2E
from tracekit.core import hybrid, hybrid_pattern
from tracekit.core.attention import AttentionSettings
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError
from tracekit.core.pipeline_layout import LayoutSettings, chunks


def nano_rows() -> list[dict[str, str]]:
    with (E2E / "megatron_bridge_hybrid.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def config(**kw) -> TrainingConfig:
    base: dict[str, Any] = dict(num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                                add_bias_linear=False, normalization="RMSNorm")
    base.update(kw)
    return TrainingConfig(**base)


def test_the_published_patterns_hold_the_layers_their_rows_state():
    rows = nano_rows()
    assert rows
    for row in rows:
        pattern = row["hybrid_override_pattern"]
        counts = hybrid_pattern.layer_counts(pattern)
        assert hybrid_pattern.layer_count(pattern) == int(row["num_layers"])
        stated = re.search(r"(\d+) Mamba2 .*?\+ (\d+) MoE \+ (\d+) attention", row["notes"])
        assert stated, row["notes"][:200]
        assert (counts["M"], counts["E"], counts["*"]) == tuple(int(v) for v in stated.groups())
        assert sum(counts.values()) == len(pattern)


def test_only_attention_and_mlp_symbols_are_the_dense_gpt_model():
    layers = 6
    pattern = "*-" * layers
    assert hybrid_pattern.gpt_pattern(layers) == pattern
    assert [hybrid_pattern.KINDS[s] for s in hybrid_pattern.parse(pattern).layers] == ["attention", "mlp"] * layers
    counts = hybrid_pattern.layer_counts(pattern)
    assert counts["*"] == counts["-"] == layers and sum(counts.values()) == 2 * layers


@pytest.mark.parametrize("pp,vp", [(2, 1), (3, 1), (2, 3), (3, 2)])
def test_pipe_segments_put_layers_where_megatron_puts_the_dense_models_chunks(pp, vp):
    """Segment i is pipeline rank i mod pp, model chunk i // pp: the same placement as the GPT model's virtual
    stages (tracekit.core.pipeline_layout), hybrid layer 2j and 2j + 1 being GPT layer j."""
    gpt_layers = 2 * pp * vp
    per_segment = gpt_layers // (pp * vp)
    pattern = "|".join(["*-" * per_segment] * (pp * vp))
    stages = hybrid_pattern.stage_layers(pattern, pp)
    assert hybrid_pattern.pattern_vp(pattern, pp) == vp
    dense = chunks(config(num_layers=gpt_layers, pipeline_model_parallel_size=pp,
                          virtual_pipeline_model_parallel_size=vp if vp > 1 else None))
    for rank in range(pp):
        for chunk in range(vp):
            assert tuple(sorted({i // 2 for i in stages[rank][chunk]})) == dense[rank][chunk].layers


def test_pipes_give_megatrons_segment_order_and_offsets():
    # the docs' example with two pipeline ranks: four segments, two virtual stages each
    stages = hybrid_pattern.stage_layers("M-M-|M-M*-|M-M-|M-M*-/MM/MM", 2)
    assert stages == (((0, 1, 2, 3), (9, 10, 11, 12)), ((4, 5, 6, 7, 8), (13, 14, 15, 16, 17)))
    assert hybrid_pattern.parse("M-M-|M-M*-/MM/MM") == hybrid_pattern.ParsedPattern("M-M-|M-M*-", "MM", 2)


def test_without_pipes_the_layers_split_evenly_or_by_the_first_and_last_stage():
    assert hybrid_pattern.stage_layers("M*M*M*", 3) == (((0, 1),), ((2, 3),), ((4, 5),))
    assert hybrid_pattern.stage_layers("MMMMMMM*", 3, first=2, last=0) == (((0, 1),), ((2, 3, 4, 5, 6, 7),), ((),))
    with pytest.raises(ConfigError, match=r"Number of layers \(5\) must be evenly divisible by "
                                          r"pipeline-model-parallel-size \(2\) when no pipe separators"):
        hybrid_pattern.stage_layers("M*M*M", 2)
    with pytest.raises(ConfigError, match=r"Middle layers \(5\) must be evenly divisible by middle pipeline "
                                          r"stages \(2\)"):
        hybrid_pattern.stage_layers("MMMMMMM*", 4, first=1, last=2)


@pytest.mark.parametrize("pattern,reason", [
    ("MXM*", r"In main pattern, 'X' is not a valid layer symbol"),
    ("M*MD", r"Not supported to have both Attention and MLA/DSA in one model"),
    ("M+|M*", r"Not supported to have both Attention and MLA/DSA in one model"),
    ("M*M*/MM/M*", r"All MTP patterns must be identical. Pattern 1 is 'MM', but pattern 2 is 'M\*'"),
    ("M*M*/M|M", r"In MTP pattern, '\|' is not a valid layer symbol"),
])
def test_patterns_megatron_refuses_are_refused_with_its_reason(pattern, reason):
    with pytest.raises(ConfigError, match=reason):
        hybrid_pattern.parse(pattern)


def test_segments_not_divisible_by_the_pipeline_are_refused():
    with pytest.raises(ConfigError, match=r"Got 3 segments and 2 pipeline parallel size"):
        hybrid_pattern.stage_layers("M*|M*|M*", 2)
    with pytest.raises(ConfigError, match="pipe separators"):
        hybrid_pattern.stage_layers("M*|M*", 2, first=1)


def test_the_argument_rules_refuse_with_megatrons_messages():
    with pytest.raises(ConfigError, match="cannot both be specified"):
        hybrid.HybridSettings(hybrid_layer_pattern="M*", hybrid_override_pattern="M*").validate(config(num_layers=2))
    with pytest.raises(ConfigError, match="cannot be used together with hybrid_attention_ratio"):
        hybrid.HybridSettings(hybrid_layer_pattern="M*", hybrid_attention_ratio=0.5).validate(config(num_layers=2))
    pipes = hybrid.HybridSettings(hybrid_layer_pattern="M*M*|M*M*")
    with pytest.raises(ConfigError, match="--decoder-first-pipeline-num-layers should not be specified"):
        pipes.validate(config(pipeline_model_parallel_size=2,
                              layout=LayoutSettings(decoder_first_pipeline_num_layers=2)))
    with pytest.raises(ConfigError, match="--pipeline-model-parallel-layout should not be used"):
        pipes.validate(config(pipeline_model_parallel_size=2, layout=LayoutSettings(
            pipeline_model_parallel_layout="Ettt|tttL")))
    # the pattern sets the virtual stages: four segments over pp 2 are vp 2, a stated vp of 4 is refused
    four = hybrid.HybridSettings(hybrid_layer_pattern="M*|M*|M*|M*")
    four.validate(config(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2))
    with pytest.raises(ConfigError, match="Virtual pipeline stages are derived from the number of \\| segments"):
        four.validate(config(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=4))
    with pytest.raises(ConfigError, match="Multi-Token Prediction .* not supported with learned_absolute"):
        hybrid.HybridSettings(hybrid_layer_pattern="M*M*/M*").validate(config())


def test_layer_sizes_megatron_refuses_are_refused_with_its_reason():
    mamba = hybrid.HybridSettings(hybrid_layer_pattern="M*M*", mamba_num_heads=20, mamba_num_groups=8)
    with pytest.raises(ConfigError, match="nheads must be evenly divisible by ngroups"):
        mamba.validate(config())
    with pytest.raises(ConfigError, match="nheads must be evenly divisble by tp_size"):
        hybrid.HybridSettings(hybrid_layer_pattern="M*M*", mamba_num_heads=36, mamba_num_groups=4).validate(
            config(tensor_model_parallel_size=8))
    with pytest.raises(ConfigError, match=r"cp_size must be evenly divisible by ngroups/tp_size"):
        hybrid.HybridSettings(hybrid_layer_pattern="M*M*", mamba_num_heads=48, mamba_num_groups=3).validate(
            config(context_parallel_size=4))
    gdn = hybrid.HybridSettings(hybrid_layer_pattern="G-G-", linear_num_key_heads=6, linear_num_value_heads=12)
    with pytest.raises(ConfigError, match=r"self.linear_num_key_heads=6 must be a multiple of "
                                          r"\(self.tensor_model_parallel_size=4 \* self.context_parallel_size=1\)"):
        gdn.validate(config(tensor_model_parallel_size=4))
    with pytest.raises(ConfigError, match=r"linear_num_value_heads \(12\) must be a multiple of linear_num_key_heads "
                                          r"\(8\)"):
        hybrid.HybridSettings(hybrid_layer_pattern="G-", linear_num_key_heads=8, linear_num_value_heads=12).validate(
            config(num_layers=2))
    with pytest.raises(ConfigError, match="linear_attention_freq must be set for linear gdn"):
        hybrid.HybridSettings(experimental_attention_variant="gdn").validate(config())
    mla = AttentionSettings(multi_latent_attention=True, q_lora_rank=256)
    dsa = hybrid.HybridSettings(hybrid_layer_pattern="D-D-", dsa_indexer_n_heads=8, dsa_indexer_head_dim=64,
                                dsa_indexer_topk=128)
    with pytest.raises(ConfigError, match="requires add_bias_linear=False"):
        dsa.validate(config(attn=mla, add_bias_linear=True, num_layers=4))
    with pytest.raises(ConfigError, match="need dsa_indexer_n_heads, dsa_indexer_head_dim and dsa_indexer_topk"):
        hybrid.HybridSettings(hybrid_layer_pattern="D-").validate(config(attn=mla, num_layers=2))


def test_topk_sharing_never_crosses_a_pipeline_stage():
    """Layer numbers count every symbol from 1: with freq 2 and offset 0, `DDDD` computes at layers 1 and 3 and
    reuses at 2 and 4, so a stage starting at layer 2 has no source for it."""
    assert [hybrid_pattern.dsa_reuses_topk(n, 0, 2) for n in (1, 2, 3, 4)] == [False, True, False, True]
    assert [hybrid_pattern.dsa_source_layer(n, 0, 2) for n in (2, 4)] == [1, 3]
    mla = AttentionSettings(multi_latent_attention=True, q_lora_rank=256)
    shared = dict(dsa_indexer_n_heads=8, dsa_indexer_head_dim=64, dsa_indexer_topk=128, dsa_indexer_topk_freq=2)
    hybrid.HybridSettings(hybrid_layer_pattern="DD|DD", **shared).validate(
        config(attn=mla, num_layers=4, pipeline_model_parallel_size=2))
    with pytest.raises(ConfigError, match="local layer 2 reuses top-k indices from computing layer 1"):
        hybrid.HybridSettings(hybrid_layer_pattern="D|DDD", **shared).validate(
            config(attn=mla, num_layers=4, pipeline_model_parallel_size=2))


@pytest.mark.parametrize("layers", [8, 10, 24, 48, 52, 61])
@pytest.mark.parametrize("attention,mlp", [(0.1, 0.0), (0.125, 0.5), (0.25, 0.25), (0.08, 0.45)])
def test_ratio_allocation_spreads_the_layers_it_counts(layers, attention, mlp):
    pattern = hybrid_pattern.pattern_from_ratios(layers, attention, mlp)
    assert len(pattern) == layers
    assert pattern.count("*") == round(layers * attention)
    assert pattern.count("-") == round(layers * mlp)
    assert pattern.count("M") == layers - round(layers * attention) - round(layers * mlp)
    where = [i for i, s in enumerate(pattern) if s == "*"]
    if len(where) > 1:  # evenly spaced: the gaps between attention layers differ by at most one
        gaps = [b - a for a, b in zip(where, where[1:])]
        assert max(gaps) - min(gaps) <= 1
    if 0 < len(where) < layers / 2:  # the pattern starts and ends with a Mamba (or MLP) layer
        assert pattern[0] != "*" and pattern[-1] != "*"


def test_linear_attention_frequency_is_megatrons_rule():
    assert hybrid_pattern.linear_attention_pattern(4, 8) == (1, 1, 1, 0, 1, 1, 1, 0)
    assert hybrid_pattern.linear_attention_pattern("([1]*3+[0]*1)*2", 8) == (1, 1, 1, 0, 1, 1, 1, 0)
    assert hybrid_pattern.gpt_pattern(4, moe_layers=(0, 1, 1, 1), linear=(1, 1, 1, 0)) == "G-GEGE*E"
    with pytest.raises(ConfigError, match="Invalid length of linear_attention_pattern: 3, expected 4"):
        hybrid_pattern.linear_attention_pattern("[1,1,0]", 4)


def test_the_pattern_overrides_num_layers_with_megatrons_warning_and_mtp_comes_from_the_legacy_flag():
    settings = hybrid.HybridSettings(hybrid_override_pattern="M*M-", mtp_hybrid_override_pattern="M*")
    c = config(num_layers=12, layout=LayoutSettings(mtp_num_layers=2), position_embedding_type="rope")
    assert settings.pattern(c.num_layers, 2) == "M*M-/M*/M*"
    notes = settings.notes(c)
    assert any("deprecated" in n for n in notes)
    assert any("ignoring --num-layers (12)" in n and "(4)" in n for n in notes)


def test_mamba_sizes_follow_megatrons_derivation():
    settings = hybrid.HybridSettings(hybrid_layer_pattern="M")
    shape = settings.mamba(1024)  # no --mamba-num-heads: d_inner = expand · hidden, heads = d_inner / head dim
    assert (shape.d_inner, shape.heads) == (2 * 1024, 2 * 1024 // 64)
    nano = hybrid.HybridSettings(hybrid_layer_pattern="M", mamba_num_heads=64).mamba(2688)
    assert (nano.d_inner, nano.in_proj_dim, nano.conv_dim) == (4096, 2 * 4096 + 2 * 8 * 128 + 64, 4096 + 2 * 8 * 128)
    with pytest.raises(ConfigError, match="d_inner must be evenly divisible by headdim"):
        hybrid.HybridSettings(mamba_head_dim=48).mamba(1000)
