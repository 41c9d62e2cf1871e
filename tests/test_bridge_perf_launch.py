"""What Megatron-Bridge's performance launchers set over the model recipe (extractors.jobs.bridge.perf_launch), on the
corpus's published rows: bf16 gradient reduction (half the bytes of the fp32 one, in the gradient buffer and on the
wire), fused RoPE on every model; and MXFP8's parameters, which Bridge keeps quantised and Megatron-core gathers in
bf16 (extractors.jobs.bridge.precision, predictor.parallel.data_parallel)."""
from __future__ import annotations

import dataclasses

import pytest

from extractors.jobs.bridge.perf_launch import launcher_settings
from extractors.jobs.rows import parse_row
from predictor.assembly.graph import build_graph
from predictor.memory.stages import config_memory
from tests.conftest import bridge_rows
from tracekit.core.config import TrainingConfig

GPU = "GB200-186GB"  # the hardware id the GB200 rows are predicted on


def _config(line: int, cells: dict, **cell_overrides: str) -> TrainingConfig:
    row = parse_row({**cells, **cell_overrides}, line, None, None)
    assert row.config is not None and row.cluster is not None, row.error
    assert row.cluster.hardware == GPU or not cells["hardware_gpu"].startswith("GB200")
    return row.config


def _row(match) -> tuple[int, dict]:
    return next((line, cells) for line, cells in bridge_rows() if match(cells))


def _bytes(graph, ops) -> float:
    return sum(graph.specs[o.spec]["bytes"] * o.count for o in ops)


@pytest.mark.parametrize("notes, launcher", [
    ("x | recipe preset qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config() in "
     "src/megatron/bridge/perf_recipes/qwen/gb200/qwen3_moe.py@r0.6.0 (matches the table layout): a=b",
     "src/megatron/bridge/perf_recipes/"),
    ("recipe preset LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_CS_V2 in "
     "scripts/performance/configs/llama/llama3_workload_base_configs.py@v0.4.2 (matches)", "scripts/performance/"),
    ("recipe preset perf_matrix[gb200][num_gpus_64][common+fp8_cs] in "
     "scripts/performance/configs/llama3/llama3_70b_llm_pretrain.yaml@r0.1.0", "scripts/performance/"),
    ("recipe preset my_own() in examples/train.py", None),
    ("no preset named", None),
])
def test_the_launcher_is_the_directory_the_preset_comes_from(notes, launcher):
    assert launcher_settings(notes)[0] == launcher


def test_every_published_row_reduces_gradients_in_bf16_and_fuses_rope():
    """Every row of the table comes from a Bridge performance launcher, and every launcher version the rows name
    sets `grad_reduce_in_fp32=False` and `apply_rope_fusion=True` (module docstring of
    extractors.jobs.bridge.perf_launch): 2-byte gradients, RoPE as TE's fused kernels — the DeepSeek-V3 provider's False
    and the Qwen3/GPT-OSS providers' default overridden."""
    parsed = [(line, row.config) for line, cells in bridge_rows()
              if (row := parse_row(cells, line, None, None)).config is not None]
    assert len(parsed) >= 90
    for line, c in parsed:
        assert c.grad_bytes == 2, line
        assert c.apply_rope_fusion, line


def test_the_row_states_its_own_setting_over_the_launchers():
    line, cells = _row(lambda r: "perf_recipes" in r["notes"] and r["model_name"].startswith("Qwen3"))
    stated = _config(line, cells, megatron_args="--no-rope-fusion --accumulate-allreduce-grads-in-fp32")
    assert not stated.apply_rope_fusion and stated.grad_bytes == 4


def test_bf16_reduction_halves_the_gradient_reduce_bytes_and_the_gradient_buffer():
    """Qwen3-30B-A3B on 8 GB200 (26.08, a flat perf recipe): the data-parallel reduce-scatter of the same buckets
    moves half the bytes in bf16, and the gradient buffer holds half the bytes (the distributed optimizer's fp32
    copies of its shard come on top, sharded: predictor.memory.stages)."""
    line, cells = _row(lambda r: "perf_recipes" in r["notes"] and r["model_name"].startswith("Qwen3"))
    bf16 = _config(line, cells)
    fp32 = dataclasses.replace(bf16, accumulate_allreduce_grads_in_fp32=True)
    g16, g32 = build_graph(bf16, GPU, 4), build_graph(fp32, GPU, 4)
    rs16 = [o for ops in g16.grad_sync.values() for o in ops if "reduce_scatter" in o.name]
    rs32 = [o for ops in g32.grad_sync.values() for o in ops if "reduce_scatter" in o.name]
    assert rs16 and len(rs16) == len(rs32)
    assert _bytes(g16, rs16) == pytest.approx(_bytes(g32, rs32) / 2)
    # the parameter all-gather is the weights', whatever the gradients' dtype
    ag16 = [o for ops in g16.param_gather.values() for o in ops]
    ag32 = [o for ops in g32.param_gather.values() for o in ops]
    assert _bytes(g16, ag16) == pytest.approx(_bytes(g32, ag32))


def test_fused_rope_replaces_the_unfused_chain_on_a_model_whose_provider_leaves_it_off():
    """GPT-OSS-120B (26.08 flat recipe): its provider keeps Megatron's unfused RoPE, the launcher fuses it."""
    line, cells = _row(lambda r: "perf_recipes" in r["notes"] and r["model_name"].startswith("GPT OSS"))
    fused = _config(line, cells)
    plain = dataclasses.replace(fused, apply_rope_fusion=False)
    variants = [{build.specs[o.spec]["variant"] for o in build.segments[0].fwd if "rotary" in o.name}
                for build in (build_graph(fused, GPU, 4), build_graph(plain, GPU, 4))]
    assert variants == [{"rope_fused"}, {"RoPE"}]


def test_mxfp8_parameters_leave_the_bf16_weights_but_gather_in_bf16():
    """Llama 3 70B MXFP8 on 64 GB200 (distributed optimizer): Bridge keeps the parameters as MXFP8 tensors
    (`fp8_param_gather`), so the weights drop the bf16 copy; Megatron-core gathers them in bf16 into the gradient
    buffer, so the all-gather moves the same bytes as without; current-scaling fp8 parameters gather 1 byte."""
    line, cells = _row(lambda r: r["model_name"] == "LLAMA3_70B" and r["precision"] == "mxfp8"
                       and r["hardware_gpu"] == "GB200")
    mx = _config(line, cells)
    assert mx.use_distributed_optimizer and mx.lowp is not None and mx.lowp.fp8_param_gather
    plain = dataclasses.replace(mx, lowp=dataclasses.replace(mx.lowp, fp8_param_gather=False))
    kept, _ = config_memory(mx, GPU)
    bf16_weights, _ = config_memory(plain, GPU)
    assert kept["weights"] < bf16_weights["weights"]
    for part in ("gradients", "optimizer_state", "activations"):
        assert kept[part] == pytest.approx(bf16_weights[part])

    def gathered(c: TrainingConfig) -> float:
        g = build_graph(c, GPU, 4)
        return _bytes(g, [o for ops in g.param_gather.values() for o in ops])

    assert gathered(mx) == pytest.approx(gathered(plain))
    cs = dataclasses.replace(mx, precision="fp8-cs")
    cs_plain = dataclasses.replace(cs, lowp=dataclasses.replace(mx.lowp, fp8_param_gather=False))
    assert gathered(cs) == pytest.approx(gathered(cs_plain) / 2)


def test_llama3_70b_on_gb200_fits_its_186_gb_with_bf16_gradients():
    """The fp8 current-scaling runs (FSDP, 40 of 80 layers' activations on the host) ran on 186 GB GPUs; with the
    fp32 gradients Megatron's default would keep they came out at 187.2 GB."""
    checked = 0
    for line, cells in bridge_rows():
        if cells["model_name"] == "LLAMA3_70B" and cells["hardware_gpu"] == "GB200" and "fp8" in cells["precision"] \
                and "mx" not in cells["precision"]:
            c = _config(line, cells)
            total = config_memory(c, GPU)[0]["total"]
            assert total < float(cells["gpu_memory_gb"]), line
            fp32 = config_memory(dataclasses.replace(c, accumulate_allreduce_grads_in_fp32=True), GPU)[0]
            assert fp32["total"] > total
            checked += 1
    assert checked >= 4
