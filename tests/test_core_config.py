"""TrainingConfig: Megatron argument parsing, derived defaults, and the split checks."""
import pytest

from extractors.jobs.megatron import config_from_argv, config_from_file, config_from_log, parse_iteration_times_ms
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError, InputError

LOG = """\
using world size: 8, data-parallel size: 2, context-parallel size: 1 tensor-model-parallel size: 2
------------------------ arguments ------------------------
  bf16 ............................................ True
  fp16 ............................................ False
  global_batch_size ............................... 32
  hidden_size ..................................... 2048
  micro_batch_size ................................ 2
  num_attention_heads ............................. 16
  num_layers ...................................... 24
  pipeline_model_parallel_size .................... 2
  recompute_granularity ........................... None
  seq_length ...................................... 2048
  swiglu .......................................... True
  tensor_model_parallel_size ...................... 2
  world_size ...................................... 8
-------------------- end of arguments ---------------------
 [2026-11-22 01:02:03] iteration        1/      10 | elapsed time per iteration (ms): 1523.4 | lm loss: 1.1E+01
 [2026-11-22 01:02:04] iteration        2/      10 | elapsed time per iteration (ms): 1010.9 | lm loss: 1.0E+01
"""


def test_megatron_log_block_and_derived_defaults():
    config = config_from_log(LOG)
    assert (config.tp, config.pp, config.dp, config.world_size) == (2, 2, 2, 8)
    assert config.precision == "bf16" and config.swiglu and config.recompute_granularity == "none"
    assert config.ffn_hidden_size == int(8 * 2048 / 3 / 64) * 64 == 5440  # Megatron's SwiGLU default
    assert config.kv_channels == 2048 // 16 and config.num_query_groups == 16
    assert config.num_microbatches == 32 // (2 * 2)
    config.validate()
    assert parse_iteration_times_ms(LOG) == [1523.4, 1010.9]


def test_megatron_argv_flags():
    argv = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32"
            " --seq-length 4096 --micro-batch-size 4 --global-batch-size 64 --tensor-model-parallel-size 2"
            " --pipeline-model-parallel-size 4 --fp16 --recompute-activations --use-distributed-optimizer"
            " --group-query-attention --num-query-groups 8 --normalization RMSNorm --disable-bias-linear")
    config = config_from_argv(argv)
    assert config.precision == "fp16" and config.recompute_granularity == "selective"
    assert config.use_distributed_optimizer and not config.add_bias_linear
    assert config.num_query_groups == 8 and config.normalization == "RMSNorm"
    assert config.ffn_hidden_size == 4 * 4096
    assert config.padded_vocab_size == 50432  # 50257 rounded up to a multiple of 128·tp = 256


def test_csv_cells_with_notes_and_aliases():
    config = TrainingConfig.from_mapping({
        "num_layers": "24", "hidden_size": "1024", "num_attention_heads": "16", "seq_length": "1024",
        "tp": "2", "pp": "1", "dp": "4", "global_batch_size": "16", "micro_batch_size": "2",
        "activation_recompute": "full (use_checkpoint=true)", "precision": "fp16 mixed (vTrain model uses .half())",
        "virtual_pipeline_stages": "1", "ffn_hidden_size": "",
    })
    assert config.recompute_granularity == "full" and config.precision == "fp16"
    assert config.world_size == 8 and config.num_microbatches == 2 and config.vp == 1
    assert config.ffn_hidden_size == 4096


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"tp": 3}, "num_attention_heads 16 is not divisible by tp 3"),
        ({"pp": 5}, "num_layers 24 is not divisible by pp 5"),
        ({"pp": 2, "vp": 5}, "num_layers 24 is not divisible by pp·vp = 2·5"),
        ({"pp": 4, "decoder_first_pipeline_num_layers": 5}, "the 19 remaining layers must divide by the 3 middle"),
        ({"pp": 2, "pipeline_model_parallel_layout": "Et*12|t*11L"}, "has 23 decoder layers, the model has 24"),
        ({"global_batch_size": 10, "micro_batch_size": 4}, "global_batch_size 10 is not divisible"),
        ({"num_gpus": 8, "dp": 2}, "world size 8"),
        ({"pp": 2, "vp": 2, "global_batch_size": 3}, "interleaved schedule's last group of micro-batches holds 1"),
        ({"pp": 4, "vp": 2, "global_batch_size": 5, "microbatch_group_size_per_vp_stage": 6},
         "groups of 6 per model chunk, which must lie between pp 4 and the 5 micro-batches"),
    ],
)
def test_invalid_splits_are_named(overrides, message):
    base = {"num_layers": 24, "hidden_size": 1024, "num_attention_heads": 16, "seq_length": 1024}
    with pytest.raises(ConfigError, match=message.replace("·", ".").replace("(", r"\(")):
        TrainingConfig.from_mapping({**base, **overrides}).validate()


def test_world_size_not_divisible_raises_at_construction():
    with pytest.raises(ConfigError, match="world size 6 is not divisible by tp·pp·cp = 4"):
        TrainingConfig.from_mapping({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                     "seq_length": 32, "tp": 2, "pp": 2, "world_size": 6})


def test_config_files(tmp_path):
    good = tmp_path / "c.yaml"
    good.write_text("num_layers: 4\nhidden_size: 256\nnum_attention_heads: 8\nseq_length: 128\ntp: 2\n")
    assert config_from_file(good).tp == 2
    log = tmp_path / "train.log"
    log.write_text(LOG)
    assert config_from_file(log).hidden_size == 2048
    bad = tmp_path / "c.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match=r"c\.json: not valid JSON"):
        config_from_file(bad)
    incomplete = tmp_path / "d.json"
    incomplete.write_text('{"num_layers": 2}')
    with pytest.raises(InputError, match="lacks hidden_size, num_attention_heads, seq_length"):
        config_from_file(incomplete)


def test_layers_per_virtual_stage_sets_the_interleaving_degree():
    argv = ("--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
            "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 3 "
            "--global-batch-size 8 --micro-batch-size 1")
    config = config_from_argv(argv).validate()
    assert config.vp == 24 // (4 * 3)
    with pytest.raises(ConfigError, match="not divisible by pp · num_layers_per_virtual_pipeline_stage = 20"):
        config_from_argv(argv.replace("stage 3", "stage 5"))


@pytest.mark.parametrize("args, message", [
    ("--num-layers 1000000000", "num_layers 1000000000 is beyond what tracekit simulates"),
    ("--num-layers 8 --global-batch-size 100000000", "100000000 micro-batches per iteration"),
    ("--num-layers 8 --hidden-size 4000000 --num-attention-heads 16", "hidden_size 4000000 is beyond"),
    ("--num-layers 8 --global-batch-size 1000000000", "global_batch_size 1000000000 is beyond"),
])
def test_sizes_past_any_real_job_are_refused_not_simulated_for_hours(args, message):
    base = "--hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
    with pytest.raises(ConfigError, match=message):
        config_from_argv(base + args).validate()


# Megatron's argparse (allow_abbrev=False) refuses any flag it does not define; tracekit does the same against the
# flag list of its pinned Megatron-LM snapshot, so a typo cannot silently change the prediction.
BASE = "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024"


@pytest.mark.parametrize("flag, message", [
    ("--recompute-granularty full", "unknown setting 'recompute_granularty' (did you mean 'recompute_granularity'?)"),
    ("--use-distributed-optimiser", "did you mean 'use_distributed_optimizer'?"),
    ("--tensor-parallel-size 2", "unknown setting 'tensor_parallel_size'"),
    ("--zebra-mode", "'zebra_mode': not a flag of Megatron-LM (NVIDIA/Megatron-LM@"),
])
def test_flags_megatron_does_not_have_are_refused(flag, message):
    with pytest.raises(ConfigError, match="--allow-unknown") as info:
        config_from_argv(f"{BASE} {flag}")
    assert message in str(info.value)


def test_megatron_flags_tracekit_does_not_model_are_accepted_and_kept_aside():
    argv = (f"{BASE} --lr 1e-4 --train-iters 100 --data-path 0.5 a 0.5 b --tokenizer-type GPT2BPETokenizer "
            "--no-persist-layer-norm --use-mcore-models --transformer-impl local --attention-backend flash")
    config = config_from_argv(argv)
    assert config.extra["lr"] == 1e-4 and config.train_iters == 100
    assert config.extra["data_path"] == ["0.5", "a", "0.5", "b"] and config.extra["persist_layer_norm"] is False


def test_a_switch_does_not_swallow_the_next_word():
    # --use-mcore-models takes no value in Megatron's parser: the word after it is not its value
    config = config_from_argv(f"{BASE} --use-mcore-models stray-word --fp16")
    assert config.extra["use_mcore_models"] is True and config.precision == "fp16"


def test_allow_unknown_keeps_newer_flags_with_a_warning(tmp_path):
    warnings: list[str] = []
    config = config_from_argv(f"{BASE} --zebra-mode 3 --sequence-paralel", unknown=warnings)
    assert config.extra["zebra_mode"] == 3 and not config.sequence_parallel
    assert len(warnings) == 2 and "did you mean 'sequence_parallel'?" in warnings[1]
    job = tmp_path / "job.yaml"
    job.write_text("num_layers: 4\nhidden_size: 1024\nnum_attention_heads: 16\nseq_length: 1024\nzebra_mode: 3\n")
    with pytest.raises(InputError, match="job.yaml.*unknown setting 'zebra_mode'"):
        config_from_file(job)
    warnings.clear()
    assert config_from_file(job, unknown=warnings).num_layers == 4 and "zebra_mode" in warnings[0]


def test_a_megatron_log_from_a_newer_version_is_read_as_it_is():
    # a log is what a real run accepted: arguments tracekit has never heard of are not an error there
    log = LOG.replace("  bf16 ...", "  zebra_mode ...................................... 3\n  bf16 ...")
    assert config_from_log(log).extra["zebra_mode"] == 3


@pytest.mark.parametrize("cell", ["['core_attn', \"mlp\"]", "[core_attn, mlp]", "core_attn,mlp", ["core_attn", "mlp"]])
def test_a_list_setting_reads_the_same_however_it_is_written(cell):
    """A CSV cell, a flag's values and a YAML list name the same modules: quotes, brackets and commas are
    spelling, for recompute modules as for offloaded modules and CUDA-graph scopes."""
    base = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 128,
            "global_batch_size": 8, "micro_batch_size": 1, "recompute_granularity": "selective"}
    scope = [w.replace("core_attn", "attn") for w in cell] if isinstance(cell, list) else cell.replace("core_", "")
    config = TrainingConfig.from_mapping({**base, "recompute_modules": cell, "cuda_graph_scope": scope})
    assert config.recompute_modules == ("core_attn", "mlp")
    assert config.run is not None and config.run.cuda_graph_scope == ("attn", "mlp")


def test_settings_kept_aside_survive_a_round_trip_through_to_dict():
    """`predict --gpus` and `search` rebuild a configuration from `to_dict()` with other splits: the settings kept in
    `extra` (here the logging interval and the loss fusion) must come back as settings, not nested under `extra`."""
    c = config_from_argv("--num-layers 2 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 "
                                          "--micro-batch-size 1 --global-batch-size 8 --log-interval 5 "
                                          "--cross-entropy-loss-fusion")
    again = TrainingConfig.from_mapping({**c.to_dict(), "world_size": 8, "data_parallel_size": None})
    assert again.extra == c.extra == {"log_interval": 5, "cross_entropy_loss_fusion": True}
    assert again.dp == 8
