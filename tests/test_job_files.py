"""torchtitan TOML jobs, Composer/llm-foundry YAMLs and the e2e CSV's sharding cells, read as those users write them
(the job files are the projects' own published presets, tests/data/jobs). Architecture facts are checked against
the published model cards (Llama 3: ffn 14336 / 28672, 8 KV heads, vocabulary 128256), not against the code."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from extractors.jobs.composer import read_composer
from extractors.jobs.files import read_job
from extractors.jobs.megatron import config_from_argv
from extractors.jobs.sharding_cells import settings_from_text
from extractors.jobs.torchtitan import read_torchtitan
from extractors.jobs.torchtitan_runs import split_layers
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError, InputError
from tracekit.core.sharding import sharding_of

JOBS = Path(__file__).parent / "data" / "jobs"


def _config(job) -> TrainingConfig:
    return TrainingConfig.from_mapping(job.settings).validate()


def test_torchtitan_llama3_8b_preset_on_64_gpus_is_fsdp2_over_all_of_them():
    job = read_torchtitan(JOBS / "llama3_8b.toml", world_size=64)
    c = _config(job)
    assert job.stack == "torchtitan"
    assert (c.num_layers, c.hidden_size, c.num_attention_heads, c.num_query_groups) == (32, 4096, 32, 8)
    assert c.ffn_hidden_size == 14336 and c.vocab_size == 128256  # Llama 3 8B's intermediate size and vocabulary
    assert c.swiglu and c.normalization == "RMSNorm" and c.position_embedding_type == "rope"
    assert not c.add_bias_linear and c.untie_embeddings_and_output_weights
    assert (c.tp, c.pp, c.dp, c.world_size) == (1, 1, 64, 64)
    assert (c.micro_batch_size, c.global_batch_size, c.seq_length) == (1, 64, 8192)  # batch_size 1 per rank
    shard = sharding_of(c)
    assert (shard.implementation, shard.stage, shard.shard_size, shard.reshard_after_forward) == \
        ("torch-fsdp2", 3, 64, True)
    assert c.recompute_granularity == "selective"  # per-op selective AC


def test_torchtitan_llama3_70b_preset_is_tp8_with_fsdp_over_the_rest():
    c = _config(read_torchtitan(JOBS / "llama3_70b.toml", world_size=64))
    assert (c.hidden_size, c.num_layers, c.ffn_hidden_size, c.num_query_groups) == (8192, 80, 28672, 8)
    assert (c.tp, c.dp, c.sequence_parallel, c.recompute_granularity) == (8, 8, True, "full")
    assert (c.micro_batch_size, c.global_batch_size) == (8, 64)  # local_batch_size 8 on each of 8 dp ranks
    assert sharding_of(c).shard_size == 8


def test_torchtitan_hsdp_and_the_world_size_the_degrees_make(tmp_path):
    job = tmp_path / "hsdp.toml"
    job.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 2\nseq_len = 4096\n'
                   '[parallelism]\ndata_parallel_replicate_degree = 4\ndata_parallel_shard_degree = 8\n')
    c = _config(read_torchtitan(job))  # no --gpus needed: every degree is stated
    shard = sharding_of(c)
    assert (c.world_size, c.dp, shard.replicas, shard.shard_size) == (32, 32, 4, 8)
    assert shard.name == "HSDP 4×8"
    with pytest.raises(InputError, match="make replicate·shard·tp·pp·cp = 4·8·1·1·1 = 32 GPUs, but the job has 64"):
        read_torchtitan(job, world_size=64)


def test_torchtitan_needs_the_launch_world_size_when_the_shard_degree_is_left_to_it():
    with pytest.raises(InputError, match=r"llama3_8b.toml: .*give the job's GPUs \(--gpus\)"):
        read_torchtitan(JOBS / "llama3_8b.toml")


@pytest.mark.parametrize("text, message", [
    ("[parallelism]\ntensor_paralel_degree = 2\n", "did you mean 'tensor_parallel_degree'"),
    ("[trainig]\nseq_len = 2048\n", "did you mean 'training'"),
    ("[model]\nname = \"llama3\"\nflavor = \"8b\"\n", "did you mean '8B'"),
    ("[training]\nenable_cpu_offload = true\n", "CPU offload is not modelled"),
    ("[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = \"ZBVZeroBuble\"\n",
     "did you mean 'ZBVZeroBubble'"),
    ("[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = \"ZBVZeroBubble\"\n"
     "[compile]\nenable = true\n", "ZBVZeroBubble with torch.compile: PyTorch refuses it"),
    ("[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = \"ZBVZeroBubble\"\n"
     "pipeline_parallel_layers_per_stage = 17\n", "exactly two stages per rank"),
])
def test_torchtitan_misspelt_or_unmodelled_settings_are_refused(tmp_path, text, message):
    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "llama3"\nflavor = "8B"\n' * ("[model]" not in text) + text)
    with pytest.raises(InputError, match=message) as err:
        read_torchtitan(job, world_size=8)
    assert str(err.value).startswith(str(job))


def test_torchtitan_splits_uneven_pipelines_counting_embedding_and_output_as_layers():
    # 126 layers (405B) over 8 stages: 128 units, 16 a stage; the first and last give one place away
    assert split_layers(126, 8) == [15] + [16] * 6 + [15]
    assert sum(split_layers(80, 6)) == 80 and split_layers(32, 1) == [32]


def test_composer_mpt_7b_preset_is_fsdp1_full_shard_as_hsdp_of_its_device_mesh():
    job = read_composer(JOBS / "mpt-7b.yaml", world_size=8, gpus_per_node=8)
    assert job.stack == "composer"
    s = job.settings
    assert (s["num_layers"], s["hidden_size"], s["num_attention_heads"], s["ffn_hidden_size"]) == \
        (32, 4096, 32, 4 * 4096)  # expansion_ratio 4
    assert (s["seq_length"], s["global_batch_size"], s["micro_batch_size"]) == (2048, 1024, 8)  # ${max_seq_len}
    assert s["precision"] == "amp_bf16" and s["recompute_granularity"] == "full"
    assert s["sharded_data_parallel"] == "torch-fsdp1" and s["data_parallel_sharding_strategy"] == \
        "optim_grads_params"
    assert s["num_distributed_optimizer_instances"] == 2  # device_mesh [2, 4]: 2 replicas of 4-rank shards
    assert s["accumulate_allreduce_grads_in_fp32"] is False  # mixed_precision PURE reduces in bf16
    assert not s["untie_embeddings_and_output_weights"] and s["position_embedding_type"] == "learned_absolute"


@pytest.mark.parametrize("change, message", [
    (("fsdp_config", "sharding_stratgy", "FULL_SHARD"), "did you mean 'sharding_strategy'"),
    (("model", "n_layer", 2), "did you mean 'n_layers'"),
    ((None, "global_train_batch_sise", 8), "did you mean 'global_train_batch_size'"),
    ((None, "device_train_microbatch_size", "auto"), "auto is chosen by Composer"),
    (("fsdp_config", "cpu_offload", True), "not modelled"),
])
def test_composer_misspelt_or_unmodelled_settings_are_refused(tmp_path, change, message):
    import yaml

    data = yaml.safe_load((JOBS / "mpt-7b.yaml").read_text())
    section, key, value = change
    (data[section] if section else data)[key] = value
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match=message) as err:
        read_composer(path, world_size=8)
    assert str(err.value).startswith(str(path))


def test_hybrid_shard_shards_inside_a_node(tmp_path):
    import yaml

    data = yaml.safe_load((JOBS / "mpt-7b.yaml").read_text())
    data["fsdp_config"].pop("device_mesh")
    data["fsdp_config"]["sharding_strategy"] = "HYBRID_SHARD"
    path = tmp_path / "hsdp.yaml"
    path.write_text(yaml.safe_dump(data))
    assert read_job(path, world_size=32, gpus_per_node=8).settings["num_distributed_optimizer_instances"] == 4
    with pytest.raises(InputError, match="--gpus-per-node"):
        read_job(path, world_size=32)


def test_composer_without_fsdp_is_ddp_reducing_the_last_micro_batch_in_25_mb_buckets(tmp_path):
    """Composer's DDP (SINGLE_AUTO_SYNC): no_sync until the last micro-batch, whose backward reduces the fp32
    gradients in PyTorch DDP's 25 MB buckets as they fill: Megatron's overlapped buckets at 6,553,600 elements."""
    import dataclasses

    import yaml

    from predictor.assembly.graph import build_graph

    data = yaml.safe_load((JOBS / "mpt-7b.yaml").read_text())
    data.pop("fsdp_config")
    path = tmp_path / "ddp.yaml"
    path.write_text(yaml.safe_dump(data))
    c = TrainingConfig.from_mapping(read_composer(path, world_size=8).settings).validate()
    assert c.overlap_grad_reduce and c.extra["ddp_bucket_size"] * 4 == 25 * 2 ** 20
    assert c.run is not None and c.run.torch_ddp_reducer  # PyTorch's reducer copies into its buckets and back
    assert not sharding_of(c).per_unit  # once per iteration, not in every micro-batch
    g = build_graph(c, "A100-SXM4-80GB", 8)
    sizes = [g.specs[o.spec]["bytes"] for o in g.grad_sync[0] if o.group == "dpcp"]
    params = 32 * (12 * 4096 ** 2 + 2 * 4096) + 50432 * 4096 + 2 * 4096  # MPT-7B: no biases, tied embedding
    assert sum(sizes) == pytest.approx(4 * params, rel=0.01)
    # 25 MB is below most of its weights (a 4096 × 16384 fp32 projection is 256 MB): a bucket per tensor or so, many
    # more than Megatron's default bucket of 40M elements makes
    megatron = dataclasses.replace(c, extra={k: v for k, v in c.extra.items() if k != "ddp_bucket_size"})
    default = [o for o in build_graph(megatron, "A100-SXM4-80GB", 8).grad_sync[0] if o.group == "dpcp"]
    assert len(sizes) >= 2 * len(default) and min(sizes) >= 25 * 2 ** 20
    single = read_composer(path, world_size=1).settings  # one GPU: nothing to reduce
    assert "overlap_grad_reduce" not in single


def test_a_megatron_yaml_is_no_job_file(tmp_path):
    path = tmp_path / "megatron.yaml"
    path.write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nseq_length: 32\n")
    assert read_job(path) is None


@pytest.mark.parametrize("cell, expected", [
    ("FSDP FULL_SHARD (mixed-precision mode PURE)",
     dict(sharded_data_parallel="torch-fsdp1", data_parallel_sharding_strategy="optim_grads_params",
          accumulate_allreduce_grads_in_fp32=False)),
    ("FSDP FULL_SHARD (mixed-precision mode DEFAULT)",
     dict(sharded_data_parallel="torch-fsdp1", data_parallel_sharding_strategy="optim_grads_params",
          accumulate_allreduce_grads_in_fp32=True)),
    ("FSDP SHARD_GRAD_OP", dict(sharded_data_parallel="torch-fsdp1", data_parallel_sharding_strategy=
                                "optim_grads_params", torch_fsdp2_reshard_after_forward=False)),
    ("fsdp (megatron-fsdp, optim_grads_params)",
     dict(sharded_data_parallel="megatron-fsdp", data_parallel_sharding_strategy="optim_grads_params")),
    ("zero1", dict(use_distributed_optimizer=True)),
    ("ZeRO-3", dict(sharded_data_parallel="deepspeed", data_parallel_sharding_strategy="optim_grads_params")),
    ("none (DDP, use_gradient_bucket=false)", {}),
])
def test_e2e_sharding_cells(cell, expected):
    assert settings_from_text(cell)[0] == expected


def test_e2e_hybrid_cell_and_unknown_cell():
    assert settings_from_text("FSDP HYBRID_SHARD")[2] is True
    with pytest.raises(ConfigError, match="not a sharding tracekit reads"):
        settings_from_text("pipedream")


def test_megatron_flags_and_their_refusals():
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, world_size=8)
    c = config_from_argv("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
                                          "--use-torch-fsdp2 --torch-fsdp2-no-reshard-after-forward")
    shard = sharding_of(c)
    assert (shard.implementation, shard.strategy, shard.reshard_after_forward) == \
        ("torch-fsdp2", "optim_grads_params", False)
    from extractors.jobs.megatron import parse_megatron_argv

    flags = parse_megatron_argv("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads "
                                "--num-distributed-optimizer-instances 2")
    mfsdp = TrainingConfig.from_mapping({**base, **flags}, strict=True).validate()
    shard = sharding_of(mfsdp)
    assert (shard.implementation, shard.stage, shard.replicas, shard.shard_size) == ("megatron-fsdp", 2, 2, 4)
    assert TrainingConfig.from_mapping(mfsdp.to_dict()).sharding == mfsdp.sharding  # to_dict reads back
    with pytest.raises(ConfigError, match="needs a sharded data-parallel implementation"):
        TrainingConfig.from_mapping({**base, "data_parallel_sharding_strategy": "optim_grads_params"}).validate()
    with pytest.raises(ConfigError, match="did you mean 'optim_grads'"):
        TrainingConfig.from_mapping({**base, "sharded_data_parallel": "megatron-fsdp",
                                     "data_parallel_sharding_strategy": "optim_grad"}).validate()
    with pytest.raises(ConfigError, match="not divisible by num_distributed_optimizer_instances 3"):
        TrainingConfig.from_mapping({**base, "sharded_data_parallel": "torch-fsdp2",
                                     "num_distributed_optimizer_instances": 3}).validate()
    assert sharding_of(TrainingConfig(**base)).name == "DDP"  # no section: Megatron's DDP


def test_predict_reads_a_torchtitan_job_and_refuses_a_misspelt_one(tmp_path):
    from typer.testing import CliRunner

    from tracekit.cli import app

    done = CliRunner().invoke(app, ["predict", str(JOBS / "llama3_8b.toml"), "--gpus", "8", "--hardware",
                                    "A100-SXM4-80GB", "--json"])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    assert doc["config"]["sharded_data_parallel"] == "torch-fsdp2" and doc["world_size"] == 8
    assert doc["memory_gb_per_gpu"]["optimizer_state"] < 20  # Llama 3 8B's Adam state, sharded 8 ways
    assert any("stack torchtitan" in w for w in doc["warnings"])
    bad = tmp_path / "bad.toml"
    bad.write_text((JOBS / "llama3_8b.toml").read_text().replace("seq_len", "seq_length"))
    done = CliRunner().invoke(app, ["predict", str(bad), "--gpus", "8", "--hardware", "A100-SXM4-80GB"])
    assert done.exit_code == 2 and done.stderr.count("\n") == 1
    assert "bad.toml" in done.stderr and "did you mean 'seq_len'" in done.stderr


def test_torchtitan_layer_split_and_checkpointing_policies(tmp_path):
    """torchtitan's split (generate_llm_fqn_per_model_part): 32 layers + embedding + output = 34 units over 8
    stages, 4 each and the 2 left over to the first stages; the first and last give a place to the embedding and
    the output: 4, 5, 4, 4, 4, 4, 4, 3. `selective_ac_option = "2"`: full checkpointing of every 2nd layer;
    `"op"`: the per-op policy."""
    assert split_layers(32, 8) == [4, 5, 4, 4, 4, 4, 4, 3]
    job = tmp_path / "pp.toml"
    job.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 8\n'
                   '[parallelism]\npipeline_parallel_degree = 4\npipeline_parallel_schedule = "Interleaved1F1B"\n'
                   '[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "2"\n')
    from tracekit.core.pipeline_layout import chunks

    c = _config(read_torchtitan(job, world_size=8))
    assert (c.pp, c.vp, c.dp) == (4, 2, 2)
    # Interleaved1F1B: 2 stages per rank, stage s on rank s mod 4
    assert [[part.num_layers for part in row] for row in chunks(c)] == [[4, 4], [5, 4], [4, 4], [4, 3]]
    assert (c.recompute_granularity, c.recompute_method, c.recompute_num_layers) == ("full", "block", 2)
    assert sharding_of(c).reshard_after_forward is False  # torchtitan keeps parameters gathered under PP
    op = _config(read_torchtitan(JOBS / "llama3_8b.toml", world_size=8))
    assert op.recompute_modules == ("per_op",)


def test_per_op_checkpointing_replays_every_other_gemm_and_the_memory_bound_ops():
    from predictor.assembly.graph import build_graph

    c = _config(read_torchtitan(JOBS / "llama3_8b.toml", world_size=8))
    graph = build_graph(c, "A100-SXM4-80GB", 8)
    replay = [o for o in graph.segment(0, 0).bwd if o.recompute]
    names = {o.name for o in replay}
    assert {"self_attention.linear_proj", "mlp.linear_fc2"} <= names  # the 2nd and 4th GEMM of the layer
    assert not names & {"self_attention.linear_qkv", "mlp.linear_fc1", "self_attention.core_attention"}
    assert {"input_layernorm", "pre_mlp_layernorm", "mlp.activation", "self_attention.rotary"} <= names


def test_search_reads_a_torchtitan_job_and_refuses_a_misspelt_one(tmp_path):
    from typer.testing import CliRunner

    from tracekit.cli import app

    done = CliRunner().invoke(app, ["search", str(JOBS / "llama3_8b.toml"), "--gpus", "16", "--hardware",
                                    "H100-80GB-HBM3", "--json"])
    assert done.exit_code == 0, done.output
    candidates = json.loads(done.stdout)["candidates"]
    assert {c["config"]["sharding"] for c in candidates} >= {"FSDP", "HSDP 2×8"}
    assert {c["config"]["tensor_model_parallel_size"] for c in candidates} > {1}  # the job's tp 1 is searched
    table = CliRunner().invoke(app, ["search", str(JOBS / "llama3_8b.toml"), "--gpus", "16", "--hardware",
                                     "H100-80GB-HBM3"])
    assert table.exit_code == 0 and "that torchtitan would refuse" in table.stdout  # its rules, not Megatron's
    bad = tmp_path / "bad.toml"
    bad.write_text((JOBS / "llama3_8b.toml").read_text().replace("[parallelism]", "[paralelism]"))
    done = CliRunner().invoke(app, ["search", str(bad), "--gpus", "16", "--hardware", "H100-80GB-HBM3"])
    assert done.exit_code == 2 and "did you mean 'parallelism'" in done.stderr


def test_a_published_torchtitan_row_runs_as_torchtitan_runs_it():
    """A row of a torchtitan table (the 405B shape: 126 layers over pp 8, which Megatron would refuse without a
    layout) is split torchtitan's way, its bare "FSDP" is FSDP2 and keeps parameters under pipelining, TP comes with
    SP; the prediction has FSDP's per-iteration gathers and no DDP buckets."""
    from extractors.jobs.rows import parse_row
    from predictor.costs.learned.models import ModelSet
    from predictor.predict import predict

    cells = {"framework": "torchtitan", "hardware_gpu": "H100 SXM", "gpu_memory_gb": "80", "gpus_per_node": "8",
             "num_gpus": "512", "num_layers": "126", "hidden_size": "16384", "ffn_hidden_size": "53248",
             "num_attention_heads": "128", "num_query_groups": "8", "seq_length": "8192", "vocab_size": "128256",
             "global_batch_size": "64", "micro_batch_size": "1", "tp": "8", "pp": "8", "dp": "8",
             "zero_or_fsdp": "FSDP", "precision": "bf16", "activation_recompute": "full", "swiglu": "true"}
    row = parse_row(cells, 2, None, None)
    assert row.error is None, row.error
    config, cluster, stack = row.complete()
    from tracekit.core.pipeline_layout import chunks

    assert stack.name == "torchtitan" and config.sequence_parallel
    assert [row[0].num_layers for row in chunks(config)] == [15, 16, 16, 16, 16, 16, 16, 15]
    shard = sharding_of(config)
    assert (shard.implementation, shard.reshard_after_forward, shard.shard_size) == ("torch-fsdp2", False, 8)
    prediction = predict(config, cluster, ModelSet.load(None), row.calibration)
    graph = prediction.graph
    assert not [o for o in graph.grad_sync[0] if o.group == "dpcp"]
    assert [o for o in graph.param_gather[0] if o.group == "fsdp"]  # gathered once per iteration
