"""torch.compile's fused kernels (predictor.layers.compile_fusion) against blocks compiled by TorchInductor on this CPU
(tools/capture_compiled_block.py: torchtitan's Llama 3 block and a GPT-2/MPT-style block with biases and dropout,
each compiled as torchtitan's apply_compile does, forward + backward profiled; the traces are kept gzip'd in
tests/data/compile), and the physics of the model: bytes, launches, extern kernels untouched."""
from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from extractors.jobs.torchtitan import read_torchtitan
from predictor.assembly.graph import build_graph
from predictor.costs.features import compute_work
from predictor.layers.compile_fusion import FUSED_PRIMITIVES, VARIANT
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import InputError
from tracekit.core.runtime import RuntimeSettings
from tracekit.core.samples import FSDP_COPIES

DATA = Path(__file__).parent / "data"
#: The captured blocks' shapes (tools/capture_compiled_block.py): hidden 64, 4 heads, batch 2, sequence 32, fp32.
SHAPE = dict(num_layers=1, hidden_size=64, num_attention_heads=4, seq_length=32, micro_batch_size=2,
             precision="fp32", attention="flash")
BLOCKS = {
    "llama": TrainingConfig(**SHAPE, num_query_groups=2, ffn_hidden_size=128, normalization="RMSNorm", swiglu=True,
                            position_embedding_type="rope", add_bias_linear=False, hidden_dropout=0.0,
                            attention_dropout=0.0),
    "gpt": TrainingConfig(**SHAPE, ffn_hidden_size=256, normalization="LayerNorm", swiglu=False,
                          position_embedding_type="learned_absolute", add_bias_linear=True, hidden_dropout=0.1,
                          attention_dropout=0.0),
}


def _compiled(c: TrainingConfig, on: bool = True) -> TrainingConfig:
    return dataclasses.replace(c, run=RuntimeSettings(torch_compile=on))


def _captured(name: str) -> tuple[list[str], list[str]]:
    """The generated kernels of the compiled forward and backward, in order, from the captured trace."""
    with gzip.open(DATA / "compile" / f"{name}_block_cpu_compiled.json.gz") as handle:
        events = [e for e in json.load(handle)["traceEvents"] if e.get("ph") == "X"]
    spans = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in events
             if e["name"] in ("CompiledFunction", "CompiledFunctionBackward")}
    kernels = sorted((e for e in events if "cpp_fused" in e["name"]), key=lambda e: e["ts"])

    def inside(span: str) -> list[str]:
        start, end = spans[span]
        return [e["name"] for e in kernels if start <= e["ts"] <= end]
    return inside("CompiledFunction"), inside("CompiledFunctionBackward")


def _layer_kernels(c: TrainingConfig) -> tuple[list[str], list[str]]:
    """The generated (memory-bound) kernels of one layer, forward and backward, in the graph of `c`."""
    g = build_graph(c, "cpu-capture")
    seg = g.segment(0, 0)

    def pick(ops):
        return [o.name for o in ops if o.per_layer and g.specs[o.spec]["primitive"] in FUSED_PRIMITIVES]
    return pick(seg.fwd), pick(seg.bwd)


@pytest.mark.parametrize("name", list(BLOCKS))
def test_fused_kernel_counts_match_a_block_compiled_on_this_cpu(name):
    fwd, bwd = _captured(name)
    model_fwd, model_bwd = _layer_kernels(_compiled(BLOCKS[name]))
    eager_fwd, eager_bwd = _layer_kernels(BLOCKS[name])
    assert len(fwd) == len(model_fwd), (fwd, model_fwd)  # llama 5, gpt 4
    # backward: the CPU backend adds up to two kernels the model does not (a layout kernel before the CPU flash
    # attention's backward; RoPE's backward for q and k apart, the model's QKV being one projection; a bias gradient
    # the model counts in its GEMM's backward) and folds LayerNorm's weight gradient into its row kernel
    assert len(model_bwd) <= len(bwd) <= len(model_bwd) + 2, (bwd, model_bwd)
    assert len(model_fwd) < len(eager_fwd) and len(model_bwd) <= len(eager_bwd)


def _layer_bytes(c: TrainingConfig) -> tuple[float, float]:
    """Bytes the memory-bound ops of one layer move, forward and backward (predictor.costs.features' count per row)."""
    g = build_graph(c, "A100-SXM4-80GB")
    seg = g.segment(0, 0)
    out = []
    for ops in (seg.fwd, seg.bwd):
        rows = [o for o in ops if o.per_layer and not o.recompute
                and g.specs[o.spec]["primitive"] in FUSED_PRIMITIVES]
        moved = compute_work(pd.DataFrame([g.specs[o.spec] for o in rows]))[1]
        out.append(float(np.sum(moved)))
    return out[0], out[1]


def test_fused_kernels_move_the_eager_bytes_less_the_intermediates_kept_in_registers():
    c = dataclasses.replace(read_config(), num_layers=1, recompute_granularity="none", recompute_modules=None)
    tokens, h, e = c.seq_length * c.micro_batch_size, c.hidden_size, 2
    eager_fwd, eager_bwd = _layer_bytes(c)
    fused_fwd, fused_bwd = _layer_bytes(_compiled(c))
    # forward: the attention residual's sum is read back by the MLP norm in the same kernel: one [tokens, h] read
    assert fused_fwd == pytest.approx(eager_fwd - tokens * h * e)
    # backward: that read again; the MLP residual add's backward is the identity (its 3 tensors gone); the residual
    # gradient is summed inside the input norm's backward (one read); the two norms' weight gradients read the
    # output gradient and the input of each (4 reads)
    assert fused_bwd == pytest.approx(eager_bwd - tokens * h * e - 3 * tokens * h * e + tokens * h * e
                                      + 4 * tokens * h * e)


def read_config() -> TrainingConfig:  # torchtitan's Llama 3 8B preset on 8 GPUs
    return TrainingConfig.from_mapping(read_torchtitan(DATA / "jobs" / "llama3_8b.toml", world_size=8).settings)


def test_a_compiled_job_is_read_as_compiled_and_its_components_are_checked(tmp_path):
    base = (DATA / "jobs" / "llama3_8b.toml").read_text()
    assert "torch_compile" not in read_torchtitan(DATA / "jobs" / "llama3_8b.toml", world_size=8).settings
    on = tmp_path / "on.toml"
    on.write_text(base.replace("compile = false", "compile = true"))
    job = read_torchtitan(on, world_size=8)
    assert job.settings["torch_compile"] is True and any("Inductor's fused kernels" in n for n in job.notes)
    assert TrainingConfig.from_mapping(job.settings).run.compiled
    loss_only = tmp_path / "loss.toml"
    loss_only.write_text(base.replace("compile = false", "") + '\n[compile]\nenable = true\ncomponents = ["loss"]\n')
    assert "torch_compile" not in read_torchtitan(loss_only, world_size=8).settings
    bad = tmp_path / "bad.toml"
    bad.write_text(base.replace("compile = false", "") + '\n[compile]\nenable = true\ncomponents = ["modle"]\n')
    with pytest.raises(InputError, match=r"bad.toml: .*did you mean 'model'"):
        read_torchtitan(bad, world_size=8)


@pytest.mark.parametrize("hardware", ["A100-SXM4-80GB", "H100-80GB-HBM3"])
def test_compile_keeps_gemms_and_attention_and_never_adds_time_or_launches(hardware):
    from predictor.costs.learned.models import ModelSet
    from predictor.predict import predict
    from tracekit.core.cluster import Cluster

    models = ModelSet.load(None)
    eager_config = read_config()
    cluster = Cluster(hardware, gpus_per_node=8)
    eager, fused = (predict(c, cluster, models) for c in (eager_config, _compiled(eager_config)))

    def time(p, primitives) -> float:
        return sum(o["time_s"] for o in p.operators if o["primitive"] in primitives)
    assert time(fused, ("gemm", "attention")) == pytest.approx(time(eager, ("gemm", "attention")))
    assert time(fused, FUSED_PRIMITIVES) < time(eager, FUSED_PRIMITIVES)
    assert fused.iteration_time_s < eager.iteration_time_s
    launches = [sum(o.count for o in seg.fwd + seg.bwd if o.launch and not o.group)
                for seg in (build_graph(c, hardware).segment(0, 0) for c in (eager_config, _compiled(eager_config)))]
    assert launches[1] < launches[0]
    g = build_graph(_compiled(eager_config), hardware)
    variants = {g.specs[o.spec]["variant"] for o in g.segment(0, 0).fwd + g.segment(0, 0).bwd
                if o.per_layer and g.specs[o.spec]["primitive"] in FUSED_PRIMITIVES}
    assert variants == {VARIANT, *FSDP_COPIES}  # every memory-bound op of a layer is a generated kernel (FSDP's
    # copies into and out of its flat buffers run outside the compiled blocks)


def test_a_composer_yaml_with_a_compile_config_is_read_as_compiled(tmp_path):
    import yaml

    from extractors.jobs.composer import read_composer

    data = yaml.safe_load((DATA / "jobs" / "mpt-7b.yaml").read_text())
    assert "torch_compile" not in read_composer(DATA / "jobs" / "mpt-7b.yaml", world_size=8).settings
    data["compile_config"] = {}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    job = read_composer(path, world_size=8)
    assert job.settings["torch_compile"] is True and any("Inductor's fused kernels" in n for n in job.notes)
