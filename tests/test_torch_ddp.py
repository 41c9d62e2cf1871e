"""torchtitan's DDP (`data_parallel_replicate_degree` without sharding: PyTorch's `replicate`, 100 MB buckets) as
`sharded_data_parallel torch-ddp` (tracekit.core.sharding, predictor.parallel.fsdp): read from a job file, refused
where torchtitan refuses it, its gradients all-reduced in every micro-batch's backward (torchtitan's loop has no
`no_sync`), and its memory. Facts: Llama 3 8B's 8.03B parameters (the model card), fp32 parameters and gradients
under autocast (4 bytes), Adam's two fp32 moments, and DDP's buckets as a second copy of the gradients."""
from __future__ import annotations

import pytest

from extractors.jobs.torchtitan import read_torchtitan
from predictor.assembly.graph import build_graph
from predictor.layers.local_kernels import RES_ADD_MOVES
from predictor.memory.stages import config_memory
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError, InputError
from tracekit.core.sharding import sharding_of

HW = "H100-80GB-HBM3"
LLAMA3_8B_PARAMS = 8.03e9  # Meta's model card
H, FFN, KV, VOCAB = 4096, 14336, 1024, 128256
LAYER_PARAMS = 2 * H * H + 2 * H * KV + 3 * H * FFN + 2 * H  # q, o, k, v, SwiGLU, two RMSNorms


def job(tmp_path, replicate: int = 8, extra: str = "", batch: int = 32):
    path = tmp_path / "ddp.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n'
                    f'[training]\nlocal_batch_size = 1\nseq_len = 8192\nglobal_batch_size = {batch}\n'
                    f'[parallelism]\ndata_parallel_replicate_degree = {replicate}\ndata_parallel_shard_degree = 1\n'
                    + extra)
    return path


def config(tmp_path, **kw) -> TrainingConfig:
    return TrainingConfig.from_mapping(read_torchtitan(job(tmp_path, **kw)).settings).validate()


def test_replicate_alone_is_pytorch_ddp_reducing_every_micro_batch(tmp_path):
    c = config(tmp_path)
    s = sharding_of(c)
    assert (s.implementation, s.stage, s.name, c.dp, c.num_microbatches) == ("torch-ddp", 0, "DDP", 8, 4)
    assert s.per_unit and s.reduce_every_microbatch and not s.params_sharded


def test_torchtitan_refuses_ddp_beside_tensor_or_pipeline_parallelism(tmp_path):
    path = job(tmp_path, replicate=4, extra="tensor_parallel_degree = 2\n")
    with pytest.raises(InputError, match="DDP has not supported > 1D parallelism") as err:
        read_torchtitan(path)
    assert str(err.value).startswith(str(path))
    c = config(tmp_path)  # the same refusal when the setting is stated beside tp by hand
    bad = TrainingConfig.from_mapping({**c.to_dict(), "tensor_model_parallel_size": 2, "world_size": 16})
    with pytest.raises(ConfigError, match="refuses tp, pp or cp > 1"):
        bad.validate()


@pytest.mark.parametrize("settings", [{"data_parallel_sharding_strategy": "optim_grads"},
                                      {"use_distributed_optimizer": True}])
def test_ddp_shards_nothing(tmp_path, settings):
    c = config(tmp_path)
    with pytest.raises(ConfigError, match="torch-ddp .* shards nothing"):
        TrainingConfig.from_mapping({**c.to_dict(), **settings}).validate()


def test_each_layer_all_reduces_its_fp32_gradients_in_every_backward_with_the_reducers_two_copies(tmp_path):
    c = config(tmp_path)
    g = build_graph(c, HW, 8)
    seg = g.segments[0]
    reduce = [o for o in seg.bwd if o.name == "layer.ddp.all_reduce"]
    # one per layer (two layer kinds: torchtitan's per-op AC replays every other layer), in each micro-batch's backward
    assert sum(o.count for o in reduce) == 32 and len({o.spec for o in reduce}) == 1
    spec = g.specs[reduce[0].spec]
    layer_params = spec["bytes"] / 4  # fp32 gradients
    assert layer_params == LAYER_PARAMS
    assert (spec["group_size"], spec["nodes"]) == (8, 1)
    copies = [g.specs[o.spec] for o in seg.bwd if o.name.startswith("layer.ddp.bucket_copy")]
    assert len(copies) == 2 * len(reduce)  # into the bucket (divided by the ranks) and back
    for copy in copies:  # a read and a write of each fp32 gradient, in bf16 element moves of the add's model
        assert copy["numel"] * RES_ADD_MOVES * 2 == pytest.approx(2 * 4 * layer_params)
    assert not [o for o in g.grad_sync[0] if o.group == "dpcp"]  # nothing left for after the last backward


def test_autocast_casts_the_fp32_weights_in_every_forward_and_replay(tmp_path):
    """fp32 parameters, bf16 compute: each forward casts every layer's weights and the output layer's (4 bytes read,
    2 written per parameter), and the replayed forward of the 16 layers torchtitan checkpoints casts them again."""
    g = build_graph(config(tmp_path), HW, 8)
    seg = g.segments[0]

    def moved(ops, name):  # bytes per micro-batch, in the element-wise model's bf16 element moves
        return sum(o.count * g.specs[o.spec]["numel"] * RES_ADD_MOVES * 2 for o in ops if o.name == name)

    assert moved(seg.fwd, "layer.autocast_cast") == pytest.approx(32 * 6 * LAYER_PARAMS)
    assert moved(seg.fwd, "output_layer.autocast_cast") == pytest.approx(6 * VOCAB * H)
    assert moved(seg.bwd, "layer.autocast_cast") == pytest.approx(16 * 6 * LAYER_PARAMS)
    # the backward's casts belong to the replayed forwards (a trace draws them as forward ops)
    assert all(o.recompute for o in seg.bwd if o.name == "layer.autocast_cast")


def test_memory_holds_fp32_parameters_gradients_twice_and_adams_moments(tmp_path):
    c = config(tmp_path)
    parts, _ = config_memory(c, HW)
    gb = LLAMA3_8B_PARAMS / 1e9
    # torchtitan's default checkpointing replays every other layer in full: the other 16 keep autocast's bf16 casts
    assert (c.recompute_granularity, c.recompute_method, c.recompute_num_layers) == ("full", "block", 16)
    cast = 2 * 16 * LAYER_PARAMS / 1e9
    assert parts["weights"] == pytest.approx(4 * gb + cast, rel=0.01)
    assert parts["gradients"] == pytest.approx(2 * 4 * gb, rel=0.01)
    assert parts["optimizer_state"] == pytest.approx(8 * gb, rel=0.01)


def test_an_moe_models_experts_are_reduced_once_per_micro_batch_not_again_after_the_backward():
    """Per-unit data parallelism without sharded gradients (DDP, FSDP's NO_SHARD) all-reduces the experts' gradients
    in each backward like the dense ones: nothing of them is left for buckets after the last backward, and each
    backward reduces every parameter's fp32 gradient once."""
    from extractors.jobs.megatron import config_from_argv
    from predictor.architecture.params import chunk_params

    argv = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --micro-batch-size 1 "
            "--global-batch-size 16 --num-experts 8 --moe-router-topk 2 --bf16")
    for impl in ("torch-ddp", "torch-fsdp2"):
        extra = {"data_parallel_sharding_strategy": "no_shard"} if impl == "torch-fsdp2" else {}
        c = config_from_argv(argv, {"world_size": 8, "sharded_data_parallel": impl, **extra})
        g = build_graph(c, HW, 8)
        assert not [o for o in g.grad_sync[0] if o.group in ("dpcp", "edp")]
        reduced = sum(g.specs[o.spec]["bytes"] * o.count for o in g.segments[0].bwd
                      if g.specs[o.spec]["primitive"] == "all_reduce" and o.group in ("fsdp", "efsdp"))
        dense, expert = chunk_params(c, 0, 0)
        assert reduced == pytest.approx(4 * (dense + expert))
