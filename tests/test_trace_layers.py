"""Predicted traces name the decoder layers as Megatron numbers them: read back by the same reader as real traces,
each pipeline stage's trace holds exactly the layers Megatron's schedule gives that stage (model chunks in the order
chunk × pp + stage), each layer once, with its attention and MLP ranges."""
from __future__ import annotations

from extractors.kineto import read_trace
from predictor import ModelSet, predict_iteration
from predictor.report.trace_out import write_traces
from tracekit.core.cluster import Cluster
from tracekit.core.config import TrainingConfig


def _layers(path) -> set[str]:
    events = read_trace(path).device_events
    return {str(name) for name in events["layer"].dropna().unique()}


def test_interleaved_stages_hold_the_layers_megatron_gives_them(tmp_path):
    # 8 layers, pp 2, vp 2: chunks of 2 layers; stage 0 runs chunks 0 and 2 (layers 0-1, 4-5), stage 1 chunks 1, 3
    config = TrainingConfig.from_mapping({
        "num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16, "seq_length": 1024, "micro_batch_size": 1,
        "global_batch_size": 8, "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
        "num_layers_per_virtual_pipeline_stage": 2, "world_size": 4, "bf16": True})
    prediction = predict_iteration(config, Cluster("A100-SXM4-80GB", gpus_per_node=4), ModelSet.load(None))
    paths = write_traces(prediction, tmp_path)
    assert [p.name for p in paths] == ["rank-0.json.gz", "rank-2.json.gz"]
    expected = {0: (0, 1, 4, 5), 2: (2, 3, 6, 7)}
    for path in paths:
        rank = int(path.name.split("-")[1].split(".")[0])
        decoder = {f"layer_{i}/{part}" for i in expected[rank] for part in ("attention", "mlp")}
        ends = {"embedding"} if rank == 0 else {"output_layer", "cross_entropy"}
        assert _layers(path) == decoder | ends, path.name


def test_moe_layers_after_dense_ones_keep_their_numbers(tmp_path):
    """A dense first layer, then MoE layers (two blocks of the graph): numbered 0..3 in order on one stage."""
    config = TrainingConfig.from_mapping({
        "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "seq_length": 1024, "micro_batch_size": 1,
        "global_batch_size": 8, "num_experts": 8, "moe_router_topk": 2, "moe_layer_freq": "[0]*1+[1]*3",
        "expert_model_parallel_size": 2, "world_size": 2, "bf16": True})
    prediction = predict_iteration(config, Cluster("A100-SXM4-80GB", gpus_per_node=2), ModelSet.load(None))
    (path,) = write_traces(prediction, tmp_path)
    decoder = {f"layer_{i}/{part}" for i in range(4) for part in ("attention", "mlp")}
    assert _layers(path) == decoder | {"embedding", "output_layer", "cross_entropy"}
