"""Adam's state (tracekit.core.optimizer_state) and Transformer Engine's precision-aware FusedAdam: the bytes each
parameter costs in memory and in the data-parallel reduction, what the step moves, and Megatron's refusals. Facts:
12 bytes of state a parameter by default (fp32 main parameter and moments), the moments in their dtypes and the bf16
remainders (2 bytes) with the precision-aware optimizer, gradients kept and reduced in bf16 with bf16 main
gradients, and a memory-bound step that takes as much longer as it moves bytes."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from extractors.jobs.megatron import config_from_argv, config_from_log
from predictor.assembly.graph import build_graph
from predictor.memory.stages import stage_memory
from tracekit.cli import app
from tracekit.core.errors import ConfigError

JOB = ("--num-layers 8 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --micro-batch-size 1 "
       "--global-batch-size 64 --tensor-model-parallel-size 2 --bf16 --use-distributed-optimizer")
AWARE = "--use-precision-aware-optimizer"


def memory(extra: str) -> dict[str, float]:
    return stage_memory(config_from_argv(f"{JOB} {extra}", {"world_size": 16}).validate(), "H100-80GB-HBM3")[0]


@pytest.mark.parametrize("extra, state_bytes", [
    ("", 12), (AWARE, 2 + 4 + 4), (f"{AWARE} --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16", 2 + 2 + 2),
    (f"{AWARE} --exp-avg-dtype fp8 --exp-avg-sq-dtype fp8", 2 + 1 + 1),
    (f"{AWARE} --main-params-dtype fp16 --exp-avg-dtype fp16 --exp-avg-sq-dtype fp16", 2 + 2 + 2),
    # an fp8 recipe other than delayed scaling keeps Megatron's own fp32 main parameters
    ("--fp8-format hybrid --fp8-recipe tensorwise " + AWARE + " --exp-avg-dtype bf16", 4 + 2 + 4),
])
def test_the_state_a_parameter_costs(extra, state_bytes):
    assert memory(extra)["optimizer_state"] == pytest.approx(memory("")["optimizer_state"] * state_bytes / 12)


def test_bf16_main_gradients_halve_the_gradients_and_their_reduction():
    job = f"{AWARE} --main-grads-dtype bf16"
    assert memory(job)["gradients"] == pytest.approx(memory("")["gradients"] / 2)
    assert memory(job)["weights"] == pytest.approx(memory("")["weights"])
    plain, half = (build_graph(config_from_argv(f"{JOB} {x}", {"world_size": 16}), "H100-80GB-HBM3", 8)
                   for x in ("", job))
    moved = [sum(g.specs[o.spec]["bytes"] for o in g.grad_sync[0] if o.group == "dpcp") for g in (plain, half)]
    assert moved[1] == pytest.approx(moved[0] / 2) and moved[0] > 0


def test_a_step_over_fewer_bytes_is_shorter():
    """The fused step is memory-bound: bf16 gradients and moments move 2 + 2·(4 + 2 + 2) = 18 bytes a parameter
    against 28; the optimizer's part of the iteration shrinks by about as much."""
    runner = CliRunner()

    def optimizer_s(extra: str) -> float:
        done = runner.invoke(app, ["predict", "--megatron-args", f"{JOB} {extra}", "--hardware", "H100-80GB-HBM3",
                                   "--gpus", "16", "--json"])
        assert done.exit_code == 0, done.output
        return json.loads(done.stdout)["breakdown"]["optimizer"]

    ratio = optimizer_s(f"{AWARE} --main-grads-dtype bf16 --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16") \
        / optimizer_s("")
    assert 0.45 < ratio < 0.8


@pytest.mark.parametrize("extra, words", [
    ("--exp-avg-dtype bf16", "exp_avg_dtype can only be fp32 when not using precision-aware optimizer"),
    ("--main-grads-dtype bf16", "main_grads_dtype can only be fp32 when not using precision-aware optimizer"),
    (f"{AWARE} --optimizer muon", "only supported with adam"),
    (f"{AWARE} --main-grads-dtype bf16 --accumulate-allreduce-grads-in-fp32",
     "--main-grads-dtype can only be fp32 when --accumulate-allreduce-grads-in-fp32 is set"),
    (f"{AWARE} --exp-avg-dtype fp4", "exp_avg_dtype: 'fp4' is not one of fp32, fp16, bf16, fp8"),
])
def test_megatrons_refusals(extra, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        config_from_argv(f"{JOB} {extra}", {"world_size": 16}).validate()


def test_the_precision_aware_optimizer_needs_the_distributed_optimizer_and_transformer_engine():
    plain = JOB.replace(" --use-distributed-optimizer", "")
    with pytest.raises(ConfigError, match="only supported with distributed optimizer"):
        config_from_argv(f"{plain} {AWARE}", {"world_size": 16}).validate()
    with pytest.raises(ConfigError, match="requires FusedAdam from TransformerEngine"):
        config_from_argv(f"{JOB} {AWARE} --transformer-impl local",
                         {"world_size": 16, "te_available": False}).validate()


def test_a_logs_torch_dtypes_are_read():
    """Megatron prints the dtypes as torch's (`main_grads_dtype ...... torch.bfloat16`; fp8 moments as uint8)."""
    log = ("------------------------ arguments ------------------------\n"
           "  num_layers ...................................... 8\n"
           "  hidden_size ..................................... 2048\n"
           "  num_attention_heads ............................. 16\n"
           "  seq_length ...................................... 2048\n"
           "  bf16 ............................................ True\n"
           "  use_distributed_optimizer ....................... True\n"
           "  use_precision_aware_optimizer ................... True\n"
           "  main_grads_dtype ................................ torch.bfloat16\n"
           "  exp_avg_dtype ................................... torch.uint8\n"
           "  exp_avg_sq_dtype ................................ torch.float32\n"
           "  accumulate_allreduce_grads_in_fp32 .............. False\n"
           "-------------------- end of arguments ---------------------\n")
    c = config_from_log(log).validate()
    assert (c.extra["main_grads_dtype"], c.extra["exp_avg_dtype"], c.extra["exp_avg_sq_dtype"]) == \
        ("bf16", "fp8", "fp32")
    assert c.grad_bytes == 2
