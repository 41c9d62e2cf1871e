"""The facts benchmarks/e2e_accuracy.py gives the peer predictors (benchmarks/peers/README.md's row keys) for the
Megatron-core rows: GQA, MoE, MLA, context parallelism, the GPU's datasheet figures and the precision recipe, read
from the rows as tracekit reads them. The peers themselves live in virtualenvs CI does not build; this checks only
what tracekit hands them."""
from __future__ import annotations

import csv

import pytest

from benchmarks.e2e_accuracy import BRIDGE, CI, peer_rows
from extractors.jobs.rows import parse_row
from tests.conftest import E2E
from tracekit.core.hardware import hardware_spec

MOE_KEYS = ("num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
            "expert_model_parallel_size", "expert_tensor_parallel_size", "moe_layers")


def parsed(name: str):
    with open(E2E / name, newline="") as fh:
        cells = list(csv.DictReader(fh))
    rows = [parse_row(c, i + 2, None, None) for i, c in enumerate(cells)]
    return [(c, r) for c, r in zip(cells, rows) if r.error is None]


@pytest.mark.parametrize("name", (CI, BRIDGE))
def test_every_megatron_core_row_gives_the_peers_its_split_gpu_and_experts(name):
    pairs = parsed(name)
    facts = peer_rows([r for _, r in pairs])
    assert len(facts) == len(pairs) > 50
    for (cells, row), f in zip(pairs, facts):
        assert f["num_gpus"] == f["tp"] * f["pp"] * f["cp"] * f["dp"] == int(cells["num_gpus"])
        assert f["cp"] == int(cells["cp"] or 1)
        assert f["num_query_groups"] == int(cells["num_query_groups"] or cells["num_attention_heads"])
        spec = hardware_spec(row.cluster.hardware)
        assert f["gpu"] == row.cluster.hardware and spec is not None
        assert f["gpu_peak_tflops_fp16"] == spec.peak_tflops_fp16 > 0
        assert f["gpu_peak_tflops_fp8"] == spec.peak_tflops_fp8 and f["gpu_memory_gb"] == spec.memory_gb
        assert f["precision"] == row.config.precision
        experts = int(float(cells.get("num_experts") or 0))
        if experts > 1:
            assert all(k in f for k in MOE_KEYS)
            assert (f["num_experts"], f["moe_router_topk"]) == (experts, int(cells["moe_router_topk"]))
            assert f["expert_model_parallel_size"] == int(cells["expert_model_parallel_size"] or 1)
            assert 1 <= f["moe_layers"] <= f["num_layers"]
        else:
            assert not any(k in f for k in MOE_KEYS)
    assert {f["gpu"] for f in facts} >= {"H100-80GB-HBM3", "GB200-186GB"}


def test_deepseek_v3_row_carries_its_experts_dense_layers_mla_and_recipe():
    cells, row = next(p for p in parsed(BRIDGE) if p[0]["model_name"] == "DeepSeekV3"
                      and p[0]["hardware_gpu"] == "GB200" and p[0]["num_gpus"] == "256")
    (f,) = peer_rows([row])
    assert (f["num_experts"], f["moe_router_topk"], f["moe_ffn_hidden_size"]) == (256, 8, 2048)
    assert f["moe_shared_expert_intermediate_size"] == 2048
    assert f["moe_layers"] == 61 - 3  # moe_first_k_dense 3
    assert f["multi_latent_attention"] is True and f["swiglu"] is True
    assert f["gpu"] == "GB200-186GB" and f["gpu_peak_tflops_fp8"] == 5000 and f["gpu_peak_tflops_fp4"] == 10000
    assert f["precision"] == cells["precision"] == "mxfp8"
