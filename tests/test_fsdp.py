"""Sharded data parallelism (FSDP, ZeRO-2/3, HSDP) in the operator graph, the schedule and the memory model, checked
against the physics of the collectives: bytes a ring all-gather / reduce-scatter / all-reduce moves per rank, the
1/N of sharded state, and placements inside and across nodes. Every expected number is computed here from the
model's shapes (parameter counts by hand), not read back from the code under test."""
from __future__ import annotations

import dataclasses

import pytest

from predictor.assembly.graph import build_graph
from predictor.memory.stages import config_memory
from tracekit.core.cluster import Cluster
from tracekit.core.config import TrainingConfig
from tracekit.core.sharding import ShardingSettings

H, LAYERS, FFN, VOCAB = 1024, 8, 4096, 32000


def _config(dp: int, **sharding) -> TrainingConfig:
    """A GPT with biases and LayerNorm, fp32 (gathers and reductions in one dtype), one micro-batch per rank."""
    return TrainingConfig(num_layers=LAYERS, hidden_size=H, num_attention_heads=16, seq_length=1024,
                          ffn_hidden_size=FFN, vocab_size=VOCAB, make_vocab_size_divisible_by=1, micro_batch_size=1,
                          global_batch_size=dp, data_parallel_size=dp, precision="fp32",
                          sharding=ShardingSettings(**sharding) if sharding else None).validate()


#: one decoder layer's parameters: QKV and its bias, output projection and bias, FC1, FC2 and biases, two LayerNorms
LAYER = (H * 3 * H + 3 * H) + (H * H + H) + (H * FFN + FFN) + (FFN * H + H) + 2 * 2 * H


def _moved_per_rank(graph, name_part: str) -> float:
    """Bytes each rank sends per micro-batch in the ops whose name holds `name_part`, with ring algorithms:
    all-gather and reduce-scatter (N − 1) shards, all-reduce 2 (N − 1)/N of the message."""
    total = 0.0
    seg = graph.segment(0, 0)
    for op in seg.fwd + seg.bwd:
        if op.group is None or name_part not in op.name:
            continue
        spec = graph.specs[op.spec]
        n = spec["group_size"]
        per = spec["bytes"] * (n - 1) if spec["primitive"] in ("all_gather", "reduce_scatter") \
            else 2 * spec["bytes"] * (n - 1) / n
        total += per * (op.count if op.per_layer else 1)
    return total


@pytest.mark.parametrize("dp", [2, 8, 64])
def test_all_gather_bytes_per_unit_per_rank_are_its_parameters_times_n_minus_one_over_n(dp):
    graph = build_graph(_config(dp, sharded_data_parallel="torch-fsdp2"), "A100-SXM4-80GB", 8)
    gathers = [op for op in graph.segment(0, 0).fwd if op.name == "layer.fsdp.all_gather"]
    assert len(gathers) == 1 and gathers[0].count == LAYERS
    spec = graph.specs[gathers[0].spec]
    assert spec["group_size"] == dp
    assert spec["bytes"] * (dp - 1) == pytest.approx(LAYER * 4 * (dp - 1) / dp)


@pytest.mark.parametrize("reshard, ratio", [(True, 1.5), (False, 1.0)], ids=["FULL_SHARD", "SHARD_GRAD_OP"])
def test_full_shard_moves_one_and_a_half_times_ddp_and_shard_grad_op_the_same(reshard, ratio):
    dp = 8
    fsdp = build_graph(_config(dp, sharded_data_parallel="torch-fsdp1", torch_fsdp2_reshard_after_forward=reshard),
                       "A100-SXM4-80GB", 8)
    ddp = build_graph(_config(dp), "A100-SXM4-80GB", 8)
    layers_fsdp = _moved_per_rank(fsdp, "layer.fsdp")
    # DDP all-reduces every parameter once: its layers' share of the buckets
    buckets = sum(2 * ddp.specs[o.spec]["bytes"] * (dp - 1) / dp for o in ddp.grad_sync[0] if o.group == "dpcp")
    total = ddp.segment(0, 0).params
    assert layers_fsdp == pytest.approx(ratio * buckets * LAYERS * LAYER / total, rel=1e-9)
    assert not [o for o in fsdp.grad_sync[0] if o.group == "dpcp"]  # FSDP reduces inside the backward


def test_memory_of_the_sharded_parts_falls_as_one_over_n():
    mem = {dp: config_memory(_config(dp, sharded_data_parallel="torch-fsdp2"), "A100-SXM4-80GB")[0]
           for dp in (8, 16, 64)}
    params = LAYERS * LAYER + VOCAB * H + 1024 * H + 2 * H  # layers, embedding, positions, final norm (tied output)
    for a, b in ((8, 16), (16, 64)):
        # optimizer state (Adam m, v in fp32) and the fp32 sharded parameters and gradients: × N is constant
        assert mem[a]["optimizer_state"] * a == pytest.approx(mem[b]["optimizer_state"] * b, rel=1e-9)
        assert (mem[a]["weights"] - mem[b]["weights"]) * 1e9 == pytest.approx(4 * params * (1 / a - 1 / b), rel=1e-9)
        assert (mem[a]["gradients"] - mem[b]["gradients"]) * 1e9 == pytest.approx(4 * params * (1 / a - 1 / b),
                                                                                  rel=1e-9)
    assert mem[8]["optimizer_state"] * 1e9 == pytest.approx(8 * params / 8, rel=1e-9)
    ddp = config_memory(_config(8), "A100-SXM4-80GB")[0]
    assert mem[64]["total"] < mem[8]["total"] < ddp["total"]


def test_hsdp_inside_a_node_is_never_slower_than_across_nodes():
    from predictor.costs.learned.models import ModelSet
    from predictor.predict import predict

    models = ModelSet.load(None)
    for replicas, shard in ((2, 8), (4, 4), (8, 2)):
        config = dataclasses.replace(_config(16, sharded_data_parallel="torch-fsdp2",
                                             num_distributed_optimizer_instances=replicas), precision="bf16")
        inside = Cluster("A100-SXM4-80GB", gpus_per_node=8, intra_node_gbs=300, inter_node_gbs=25)
        across = dataclasses.replace(inside, gpus_per_node=shard // 2)  # each shard group spans two nodes
        t_in = predict(config, inside, models).iteration_time_s
        t_across = predict(config, across, models).iteration_time_s
        assert t_in <= t_across, (replicas, shard, t_in, t_across)


def test_fsdp_collectives_are_hidden_behind_compute_on_gpus():
    from predictor.costs.learned.models import ModelSet
    from predictor.predict import predict

    models = ModelSet.load(None)
    config = dataclasses.replace(_config(8, sharded_data_parallel="torch-fsdp2"), precision="bf16",
                                 micro_batch_size=8, global_batch_size=64)
    gpu = predict(config, Cluster("A100-SXM4-80GB", gpus_per_node=8), models)
    comm = sum(o["time_s"] for o in gpu.operators if o["pass"] == "comm")
    assert gpu.breakdown["exposed_communication"] < 0.5 * comm  # most of the gathers run beside the layers
    ddp = predict(dataclasses.replace(config, sharding=None), Cluster("A100-SXM4-80GB", gpus_per_node=8), models)
    assert gpu.iteration_time_s > ddp.breakdown["compute"]


def test_search_splits_an_fsdp_jobs_shard_group_and_prunes_by_memory():
    from predictor.costs.learned.models import ModelSet
    from predictor.sweeps.search import enumerate_configs, search
    from tracekit.core.sharding import sharding_of

    base = dict(num_layers=LAYERS, hidden_size=H, num_attention_heads=16, seq_length=1024, ffn_hidden_size=FFN,
                vocab_size=VOCAB, global_batch_size=64, sharded_data_parallel="torch-fsdp2", precision="bf16")
    fixed = {"tensor_model_parallel_size", "pipeline_model_parallel_size", "recompute_granularity",
             "micro_batch_size"}
    configs, _ = enumerate_configs({**base, "micro_batch_size": 4}, 16, fixed)
    # 16 data-parallel ranks: FSDP over all, or HSDP replicas 2, 4, 8, 16 of 8-, 4-, 2-, 1-rank shard groups
    assert sorted(sharding_of(c).replicas for c in configs) == [1, 2, 4, 8, 16]
    assert {c.use_distributed_optimizer for c in configs} == {False}  # FSDP needs no distributed optimizer
    result = search({**base, "micro_batch_size": 4}, 16, Cluster("A100-SXM4-80GB", gpus_per_node=8),
                    ModelSet.load(None), fixed)
    by_name = {c["config"]["sharding"]: c for c in result.candidates}
    assert by_name["FSDP"]["memory_gb_per_gpu"] < by_name["HSDP 2×8"]["memory_gb_per_gpu"] < \
        by_name["HSDP 4×4"]["memory_gb_per_gpu"]  # smaller shard groups keep more of the state


def test_llmfoundry_published_runs_are_all_predicted_and_fit_their_gpus(tmp_path):
    """MosaicML ran every row of its table: predicted memory per GPU under FSDP must fit the GPU it ran on (40 or
    80 GB); without sharding MPT-70B's state alone (16 bytes a parameter) is far beyond it."""
    import csv

    from typer.testing import CliRunner

    from tests.conftest import E2E
    from tracekit.cli import app

    out = tmp_path / "out.csv"
    done = CliRunner().invoke(app, ["predict", "--batch", str(E2E / "llmfoundry_mpt_fsdp_a100.csv"), "--csv-out",
                                    str(out), "--json"])
    assert done.exit_code == 0, done.output
    with open(out, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 139 and all(r["error"] == "" for r in rows)
    assert {r["stack"] for r in rows} == {"composer"}
    assert all(float(r["predicted_memory_gb_per_gpu"]) <= float(r["gpu_memory_gb"]) for r in rows)
    from extractors.jobs.rows import parse_row

    line, big = next((i + 2, r) for i, r in enumerate(rows) if r["model_name"] == "MPT-70b")
    config = parse_row(big, line, None, None).config
    unsharded = config_memory(dataclasses.replace(config, sharding=None), "A100-SXM4-80GB")[0]
    assert unsharded["total"] > 16 * float(big["params_billion"]) > 80  # weights, gradients, Adam: ≥ 16 B a param


def test_the_distributed_optimizer_in_instances_reduces_inside_each_and_all_reduces_across():
    """Megatron's --num-distributed-optimizer-instances 2 on 16 data-parallel ranks: reduce-scatters and gathers
    inside 8-rank instances, the shards all-reduced across the 2 instances, Adam's state over 8 ranks."""
    c = TrainingConfig.from_mapping(dict(num_layers=LAYERS, hidden_size=H, num_attention_heads=16, seq_length=1024,
                                         ffn_hidden_size=FFN, vocab_size=VOCAB, make_vocab_size_divisible_by=1,
                                         global_batch_size=16, data_parallel_size=16, precision="fp32",
                                         use_distributed_optimizer=True,
                                         num_distributed_optimizer_instances=2)).validate()
    graph = build_graph(c, "A100-SXM4-80GB", 8)
    sizes = {(graph.specs[o.spec]["primitive"], graph.specs[o.spec]["group_size"]) for o in graph.grad_sync[0]}
    assert sizes == {("reduce_scatter", 8), ("all_reduce", 2)}
    assert {graph.specs[o.spec]["group_size"] for o in graph.param_gather[0]} == {8}
    whole = config_memory(dataclasses.replace(c, sharding=None), "A100-SXM4-80GB")[0]["optimizer_state"]
    assert config_memory(c, "A100-SXM4-80GB")[0]["optimizer_state"] == pytest.approx(2 * whole, rel=1e-9)


def _moe(dp: int, ep: int) -> TrainingConfig:
    """`_config`'s GPT with every layer an MoE of 8 experts (top-2, FFN 1024 each, no bias) over EP `ep`, FSDP2."""
    return TrainingConfig.from_mapping(dict(
        num_layers=LAYERS, hidden_size=H, num_attention_heads=16, seq_length=1024, ffn_hidden_size=FFN,
        vocab_size=VOCAB, make_vocab_size_divisible_by=1, micro_batch_size=1, global_batch_size=dp,
        data_parallel_size=dp, precision="fp32", num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=1024,
        expert_model_parallel_size=ep, sharded_data_parallel="torch-fsdp2")).validate()


#: one MoE layer's experts on a rank: 8/ep experts of FC1 (H → 1024) and FC2 (1024 → H), with biases
def _experts(ep: int) -> float:
    return 8 / ep * (H * 1024 + 1024 + 1024 * H + H)


@pytest.mark.parametrize("dp, ep", [(8, 2), (16, 4), (64, 8)])
def test_an_moe_layers_experts_are_a_unit_sharded_over_the_expert_data_parallel_ranks(dp, ep):
    """The ranks holding the same experts (dp / ep of them) shard them: one all-gather of 1/(dp/ep) of the layer's
    experts before its forward, a reduce-scatter after its backward; no expert gradient buckets after the step."""
    graph = build_graph(_moe(dp, ep), "A100-SXM4-80GB", 8)
    seg = graph.segment(0, 0)
    gathers = [op for op in seg.fwd if op.name == "layer.experts.fsdp.all_gather"]
    scatters = [op for op in seg.bwd if op.name == "layer.experts.fsdp.reduce_scatter"]
    assert len(gathers) == 1 and gathers[0].count == LAYERS and len(scatters) == 1
    n = dp // ep
    for op in gathers + scatters:
        spec = graph.specs[op.spec]
        assert spec["group_size"] == n
        assert spec["bytes"] == pytest.approx(_experts(ep) * 4 / n)
    assert not [o for o in graph.grad_sync[0] if o.group == "edp"]


def test_expert_memory_falls_as_one_over_the_expert_data_parallel_ranks():
    """At a fixed EP, doubling the data-parallel ranks halves the experts' sharded state (the fp32 parameters,
    gradients and Adam m, v: 16 bytes a parameter), and the layers' own share as before."""
    ep = 2
    mem = {dp: config_memory(_moe(dp, ep), "A100-SXM4-80GB")[0] for dp in (8, 16)}
    layers = LAYERS * _experts(ep)
    dense = LAYERS * (LAYER - (H * FFN + FFN) - (FFN * H + H)) + VOCAB * H + 1024 * H + 2 * H + LAYERS * H * 8
    total_a = (mem[8]["weights"] + mem[8]["gradients"] + mem[8]["optimizer_state"]) * 1e9
    total_b = (mem[16]["weights"] + mem[16]["gradients"] + mem[16]["optimizer_state"]) * 1e9
    # experts over dp/ep = 4 then 8 ranks, dense parameters over 8 then 16
    expected = 16 * layers * (1 / 4 - 1 / 8) + 16 * dense * (1 / 8 - 1 / 16)
    assert total_a - total_b == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("implementation, dtensor", [("torch-fsdp2", True), ("torch-fsdp1", False),
                                                     ("deepspeed", False), ("megatron-fsdp", False)])
def test_fsdp2_steps_its_dtensor_parameters_and_a_gpu_model_set_answers_with_the_plain_step(implementation, dtensor):
    """FSDP2's sharded parameters are DTensors: its optimizer step is the DTensor variant of the stage's step (sampled
    of its own on a CPU, where the host's dispatch is the time); the bundled GPU models hold no DTensor step and
    answer with the plain step of the same stage and size, what the GPU's kernels take."""
    from predictor.costs.learned.models import ModelSet
    from tracekit.core.samples import DTENSOR_SUFFIX

    c = _config(8, sharded_data_parallel=implementation, data_parallel_sharding_strategy="optim_grads_params")
    graph = build_graph(c, "A100-SXM4-80GB", 8)
    spec = graph.specs[graph.optimizer[0].spec]
    assert spec["variant"] == "firstStage_optimizer" + (DTENSOR_SUFFIX if dtensor else "")
    models = ModelSet.load()
    plain = models.resolve("A100-SXM4-80GB", "optimizer", "optimizer", "firstStage_optimizer")
    assert plain is not None and plain.group == "firstStage_optimizer"
    assert models.resolve("A100-SXM4-80GB", "optimizer", "optimizer", "firstStage_optimizer" + DTENSOR_SUFFIX) is plain
