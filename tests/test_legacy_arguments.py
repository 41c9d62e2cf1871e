"""Megatron's deprecated flags (tracekit.core.legacy_arguments): refused where the vendored Megatron-LM stops, with
its words; `--use-rotary-position-embeddings` and `--no-position-embedding` read as Megatron translates them;
`--padded-vocab-size` as the model's vocabulary, unpadded. Real predictions with the bundled models, Megatron's own
source for the words."""
from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from extractors.jobs.megatron import config_from_argv, config_from_log
from extractors.jobs.rows import parse_row
from tracekit.cli import app
from tracekit.core.errors import ConfigError
from tracekit.core.legacy_arguments import REFUSED
from tracekit.core.megatron_arguments import unmodelled_flags

ROOT = Path(__file__).resolve().parent.parent
VENDORED = sorted((ROOT.parent / "shared" / "vendor").glob("megatron-lm-*.tar.gz"))
BASE = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 "
        "--micro-batch-size 1 --global-batch-size 8 --tensor-model-parallel-size 2 --bf16")
runner = CliRunner()


def _predict(extra: str) -> dict:
    done = runner.invoke(app, ["predict", "--megatron-args", f"{BASE} {extra}", "--hardware", "H100-80GB-HBM3",
                               "--gpus", "2", "--json"])
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def _operators(result: dict) -> set[str]:
    return {name for part in result["estimates"]["parts"] for name in part["operators"]}


@pytest.mark.skipif(not VENDORED, reason="the vendored Megatron-LM snapshot is not beside the checkout")
def test_the_refusals_are_megatrons_own_words():
    with tarfile.open(VENDORED[-1]) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("megatron/training/arguments.py"))
        handle = tar.extractfile(member)
        assert handle is not None
        source = handle.read().decode()
    # the source splits its messages over lines ('... no longer ' \ 'valid, ...'): join the pieces
    joined = re.sub(r"""['"]\s*\\?\s*\n\s*['"]""", "", source)
    for words in REFUSED.values():
        assert words in joined, words
    assert "--no-position-embedding is deprecated, use --position-embedding-type" in joined
    assert "if args.use_rotary_position_embeddings:\n        args.position_embedding_type = 'rope'" in source


@pytest.mark.parametrize("flag", ["--batch-size 4", "--warmup 100", "--model-parallel-size 2",
                                  "--checkpoint-activations"])
def test_a_flag_megatron_stops_on_is_refused_in_one_line_naming_it(flag):
    _refused_in_one_line(flag)


def _refused_in_one_line(flag: str, *words: str) -> None:
    """`flag` typed: ConfigError naming it, and the CLI's one line on stderr (naming it and `words`), exit 2."""
    with pytest.raises(ConfigError, match=re.escape(flag.split()[0])):
        config_from_argv(f"{BASE} {flag}")
    done = runner.invoke(app, ["predict", "--megatron-args", f"{BASE} {flag}", "--hardware", "H100-80GB-HBM3",
                               "--gpus", "2"])
    assert done.exit_code == 2 and not done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert all(w in lines[0] for w in (flag.split()[0], *words)), done.stderr


def test_a_value_that_is_no_switch_or_no_number_is_refused_naming_the_key():
    for flag, key in (("--use-rotary-position-embeddings=maybe", "use_rotary_position_embeddings"),
                      ("--checkpoint-activations=maybe", "checkpoint_activations"),
                      ("--padded-vocab-size abc", "padded_vocab_size"), ("--batch-size 4.5", "batch_size")):
        with pytest.raises(ConfigError, match=f"^{key}: "):
            config_from_argv(f"{BASE} {flag}")


def test_a_stopped_flag_left_at_its_default_is_no_refusal():
    # a Megatron log prints every switch, set or not: checkpoint_activations False is what Megatron runs
    from_log = config_from_log("------ arguments ------\n  num_layers ...... 4\n  hidden_size ..... 1024\n"
                               "  num_attention_heads ... 16\n  seq_length ...... 2048\n"
                               "  checkpoint_activations ... False\n  batch_size ...... None\n"
                               "  use_rotary_position_embeddings ... False\n-------- end of arguments ---------\n")
    assert from_log.position_embedding_type == "learned_absolute" and from_log.extra == {}


def test_a_log_of_an_older_megatron_that_ran_them_reads_them_as_it_ran():
    # a record of a run (here Megatron-LM 2021's arguments block): its --checkpoint-activations ran, as full recompute
    # of every layer (checkpoint_num_layers at a time); its --batch-size was the micro-batch
    block = ("------ arguments ------\n  num_layers ...... 4\n  hidden_size ..... 1024\n"
             "  num_attention_heads ... 16\n  seq_length ...... 2048\n  checkpoint_activations ... True\n"
             "  checkpoint_num_layers ... 2\n  batch_size ...... 4\n  model_parallel_size ... 2\n"
             "  world_size ... 2\n-------- end of arguments ---------\n")
    c = config_from_log(block)
    assert (c.recompute_granularity, c.recompute_method, c.recompute_num_layers) == ("full", "uniform", 2)
    assert (c.micro_batch_size, c.tensor_model_parallel_size) == (4, 2)
    # the same words typed for today's Megatron are refused, as an override too
    done = runner.invoke(app, ["predict", "--megatron-args", BASE, "--hardware", "H100-80GB-HBM3", "--gpus", "2",
                               "--set", "batch_size=4"])
    assert done.exit_code == 2 and "--batch-size argument is no longer valid" in done.stderr, done.output


def test_rotary_position_embeddings_flag_is_rope_as_megatron_makes_it():
    legacy, rope, learned = (_predict(x) for x in ("--use-rotary-position-embeddings",
                                                   "--position-embedding-type rope", ""))
    assert config_from_argv(f"{BASE} --use-rotary-position-embeddings").position_embedding_type == "rope"
    assert legacy["iteration_time_s"] == rope["iteration_time_s"]
    assert legacy["memory_gb_per_gpu"] == rope["memory_gb_per_gpu"]
    assert not any("not modelled" in w for w in legacy["warnings"])
    # RoPE: no learned position table (its lookup and its weights gone), rotary kernels in every layer
    assert "embedding.position_embeddings" in _operators(learned)
    assert "embedding.position_embeddings" not in _operators(legacy)
    assert legacy["memory_gb_per_gpu"]["weights"] < learned["memory_gb_per_gpu"]["weights"]
    # Megatron: --use-rotary-position-embeddings wins over a stated --position-embedding-type
    stated = config_from_argv(f"{BASE} --position-embedding-type learned_absolute --use-rotary-position-embeddings")
    assert stated.position_embedding_type == "rope"


def test_no_position_embedding_changes_nothing_with_rope_and_is_refused_without():
    with_rope = "--position-embedding-type rope"
    assert _predict(f"{with_rope} --no-position-embedding")["iteration_time_s"] == \
        _predict(with_rope)["iteration_time_s"]
    for spelling in ({"add_position_embedding": False}, {"no_position_embedding": True}):
        with pytest.raises(ConfigError, match="--no-position-embedding is deprecated.*here it is learned_absolute"):
            config_from_argv(BASE, defaults=spelling)
    with pytest.raises(ConfigError, match="--no-position-embedding is deprecated"):
        config_from_argv(f"{BASE} --no-position-embedding")
    # as an override of a RoPE configuration it changes nothing there either
    done = runner.invoke(app, ["predict", "--megatron-args", f"{BASE} {with_rope}", "--hardware", "H100-80GB-HBM3",
                               "--gpus", "2", "--json", "--set", "add_position_embedding=false"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["iteration_time_s"] == _predict(with_rope)["iteration_time_s"]


def test_padded_vocab_size_is_the_vocabulary_unpadded():
    # 50257 (GPT-2's) pads to 50432 at tp 2 (a multiple of 128·2); --padded-vocab-size is taken as it is
    assert config_from_argv(BASE).padded_vocab_size == 50432
    c = config_from_argv(f"{BASE} --padded-vocab-size 50258")
    assert c.padded_vocab_size == 50258 and unmodelled_flags(c.extra) == []
    assert config_from_argv(f"{BASE} --vocab-size 32000 --padded-vocab-size 50258").padded_vocab_size == 50258
    # a log prints the padding of its vocabulary (1000 at tp 2 → 1024): the vocabulary stays as stated
    logged = config_from_argv(f"{BASE} --vocab-size 1000 --padded-vocab-size 1024")
    assert (logged.vocab_size, logged.make_vocab_size_divisible_by, logged.padded_vocab_size) == (1000, 128, 1024)
    # fewer rows of the embedding and the head: fewer weights than the padded vocabulary's
    padded, given = _predict(""), _predict("--padded-vocab-size 50258")
    assert given["memory_gb_per_gpu"]["weights"] < padded["memory_gb_per_gpu"]["weights"]
    with pytest.raises(ConfigError, match="padded_vocab_size 50257 is not a positive multiple of tp 2"):
        config_from_argv(f"{BASE} --padded-vocab-size 50257")


# -- Megatron-LM 2021–2022's renamed and removed flags ----------------------------------------------------------------
LINE_2021 = f"{BASE} --activations-checkpoint-method block --activations-checkpoint-num-layers 2"


@pytest.mark.parametrize("flag, today", [("--activations-checkpoint-method uniform", "--recompute-method"),
                                         ("--activations-checkpoint-num-layers 2", "--recompute-num-layers"),
                                         ("--DDP-impl torch", "--overlap-grad-reduce")])
def test_a_2021_flag_typed_is_refused_in_one_line_naming_todays(flag, today):
    _refused_in_one_line(flag, today)


def test_a_record_of_a_2021_run_reads_its_recompute_and_ddp_flags_as_they_ran():
    from extractors.jobs.notes import parse_megatron_argv
    from tracekit.core.config import TrainingConfig
    from tracekit.core.stacks import get_stack

    old = get_stack("megatron-lm-2021").config  # its DDP: Megatron's own, reduced after the backward
    assert old["overlap_grad_reduce"] is False

    def record(line: str, defaults: dict = old) -> TrainingConfig:
        return TrainingConfig.from_mapping(parse_megatron_argv(line), defaults)  # a run's record: not strict

    c = record(LINE_2021)
    assert (c.recompute_granularity, c.recompute_method, c.recompute_num_layers) == ("full", "block", 2)
    assert record(f"{BASE} --activations-checkpoint-method uniform").recompute_num_layers == 1  # Megatron's default
    # PyTorch's DDP: the last micro-batch's backward reduces the gradients in 25 MB buckets (fp16/bf16: 2 bytes each)
    torch_ddp = record(f"{BASE} --DDP-impl torch")
    assert torch_ddp.overlap_grad_reduce is True and torch_ddp.extra["ddp_bucket_size"] == 25 * 2 ** 20 // 2
    fp32 = record(BASE.replace(" --bf16", "") + " --DDP-impl torch")
    assert fp32.extra["ddp_bucket_size"] == 25 * 2 ** 20 // 4
    assert record(f"{BASE} --DDP-impl local", {"overlap_grad_reduce": True}).overlap_grad_reduce is False
    # what the record states itself is kept
    assert record(f"{BASE} --DDP-impl torch --ddp-bucket-size 1000000").extra["ddp_bucket_size"] == 1000000
    with pytest.raises(ConfigError, match=r"^ddp_impl: 'tourch' is not one of local, torch \(did you mean 'torch'"):
        record(f"{BASE} --DDP-impl tourch")
    # a Megatron-LM 2021 log prints them so (DDP_impl in capitals; the checkpoint method None when unused, its layer
    # count always)
    block = ("------ arguments ------\n  num_layers ...... 4\n  hidden_size ..... 1024\n"
             "  num_attention_heads ... 16\n  seq_length ...... 2048\n  DDP_impl ........ torch\n"
             "  activations_checkpoint_method ... {}\n  activations_checkpoint_num_layers ... 1\n  fp16 ... True\n"
             "-------- end of arguments ---------\n")
    logged = config_from_log(block.format("uniform"), defaults=old)
    assert (logged.recompute_granularity, logged.recompute_method, logged.overlap_grad_reduce) == \
        ("full", "uniform", True)
    assert config_from_log(block.format("None"), defaults=old).recompute_granularity == "none"


def test_pytorchs_ddp_of_a_2021_run_hides_its_gradient_reduction_behind_the_last_backward(tmp_path):
    # a row of a published table with its launch line: 4 nodes of 8 A100, one micro-batch of 8 per rank; Megatron's
    # own DDP reduces 0.4 GB of fp16 gradients over InfiniBand after the backward, PyTorch's DDP during it
    from predictor import ModelSet
    from predictor.batch import predict_rows

    cells = {"framework": "Megatron-LM (2021)", "hardware_gpu": "A100-SXM4-80GB", "gpus_per_node": "8",
             "num_gpus": "32", "interconnect": "InfiniBand HDR inter-node",
             "megatron_args": "--num-layers 4 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
                              "--max-position-embeddings 2048 --micro-batch-size 8 --global-batch-size 256 --fp16"}
    local, torch_ddp, megatron_overlap = (
        parse_row(dict(cells, megatron_args=f"{cells['megatron_args']} {extra}"), 2, None, None)
        for extra in ("--DDP-impl local", "--DDP-impl torch", "--overlap-grad-reduce --ddp-bucket-size 13107200"))
    assert not local.error and not torch_ddp.error and not megatron_overlap.error
    assert not any("micro_batch_size" in n for n in local.notes)  # the launch line states it: nothing assumed
    a, b, m = predict_rows([local, torch_ddp, megatron_overlap], ModelSet.load(None))
    assert b.breakdown["compute"] == pytest.approx(a.breakdown["compute"])
    assert b.breakdown["exposed_communication"] < 0.5 * a.breakdown["exposed_communication"]
    assert b.iteration_time_s < a.iteration_time_s
    # the same buckets as Megatron's overlapped DDP, plus PyTorch's reducer: into the bucket and back, two passes over
    # every fp16 gradient where Megatron scales its buffer once — one pass (a read and a write of 2 bytes) more,
    # at no more than the A100's 2,039 GB/s and no less than half of it. Parameters counted by hand: 4 layers of
    # 12h² + 13h, the word (50257 padded to 50304) and position (2048) tables, the final LayerNorm.
    h = 2048
    params = 4 * (12 * h * h + 13 * h) + (50304 + 2048) * h + 2 * h
    extra_s = b.iteration_time_s - m.iteration_time_s
    assert 4 * params / 2039e9 <= extra_s <= 4 * params / (0.5 * 2039e9), extra_s
