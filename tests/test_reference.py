"""The reference trainer's parallelism is real: every tp/sp/pp/dp split of one model on the same data must train
exactly like the single-process model (same losses, iteration after iteration, with a learning rate large enough
that a wrong or missing gradient collective would show)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tracekit.reference.launch import launch_argv, megatron_flags

BASE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, micro_batch_size=2,
            global_batch_size=4, vocab_size=1000, train_iters=3, log_interval=1, hidden_dropout=0,
            attention_dropout=0, lr=0.01)
SWIGLU = dict(BASE, swiglu=True, normalization="RMSNorm", disable_bias_linear=True)


def _losses(argv: list[str]) -> list[float]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [float(v) for v in re.findall(r"lm loss: ([0-9.E+-]+)", done.stdout)]
    assert len(losses) == BASE["train_iters"], done.stdout[-2000:]
    return losses


def _single(model: dict) -> list[float]:
    return _losses([sys.executable, "-m", "tracekit.reference", *megatron_flags(**model)])


@pytest.fixture(scope="module")
def single() -> list[float]:
    return _single(BASE)


@pytest.mark.parametrize("split", [
    dict(tensor_model_parallel_size=2),
    dict(pipeline_model_parallel_size=2),
    dict(),  # data parallel over 2 ranks
    dict(use_torch_fsdp2=True),  # FSDP2 over 2 ranks: gathers and reduce-scatters per layer
    dict(use_torch_fsdp2=True, torch_fsdp2_no_reshard_after_forward=True),
], ids=["tp2", "pp2-1f1b", "dp2", "fsdp2", "fsdp2-no-reshard"])
def test_two_rank_split_trains_like_one_process(single, split):
    losses = _losses(launch_argv(2, **BASE, **split))
    assert losses == pytest.approx(single, rel=2e-5)
    assert losses[0] != pytest.approx(losses[2], rel=1e-4)  # the model did change between iterations


def test_swiglu_rmsnorm_sequence_parallel_matches_one_process():
    expected = _single(SWIGLU)
    assert _losses(launch_argv(2, **SWIGLU, tensor_model_parallel_size=2, sequence_parallel=True)) == \
        pytest.approx(expected, rel=2e-5)


def test_invalid_split_is_refused_with_megatrons_argument_error():
    argv = [sys.executable, "-m", "tracekit.reference", *megatron_flags(**dict(BASE, num_attention_heads=3))]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--num-attention-heads" in done.stderr


def test_fsdp_with_gradient_accumulation_matches_one_process():
    """Two micro-batches per rank: FSDP2 reduce-scatters after each backward and accumulates the sharded
    gradients; the sum must be the whole batch's gradient."""
    model = dict(BASE, global_batch_size=8)
    assert _losses(launch_argv(2, **model, use_torch_fsdp2=True)) == pytest.approx(_single(model), rel=2e-5)


def test_fsdp_needs_tp_and_pp_of_one():
    done = subprocess.run(launch_argv(2, **BASE, use_torch_fsdp2=True, tensor_model_parallel_size=2),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "data-parallel ranks only (tp = pp = 1)" in done.stderr
