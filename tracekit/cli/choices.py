"""The values of the enumerated options, as click choices: `--help` lists them and any other value is a usage error
naming them, before any work. Literal here, so that a command's start-up imports no engine for them; each mirrors
the constant of the code that acts on it (tests/test_cli_conventions.py checks they agree)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

#: tracekit.capture.megatron_flags.LAYOUTS
LAYOUTS = ("tensorboard", "torch_profile")
#: tracekit.capture.run.LAYOUT_CHOICES: a capture may pick the layout from the launch's Megatron version
CAPTURE_LAYOUTS = ("auto", *LAYOUTS)
#: tracekit.capture.run.MODES
CAPTURE_MODES = ("auto", "megatron", "hook")
#: predictor.sweeps.search.OBJECTIVES, as the command line spells them
OBJECTIVES = ("time", "tokens-per-s", "cost")
#: tracekit.sampling.compute.DTYPES
SAMPLE_DTYPES = ("fp32", "bf16", "fp16")
DEVICES = ("cpu", "cuda")
#: tracekit.cli.import_samples.FORMATS
IMPORT_FORMATS = ("ett", "nccl-tests", "xla-gemm", "xla-collectives", "aiter-gemm", "aiter-fmoe")
EVALUATE_FORMATS = (*IMPORT_FORMATS, "kineto")
#: tracekit.core.samples.PRIMITIVES
PRIMITIVES = ("gemm", "bmm", "attention", "softmax", "norm", "activation", "elementwise", "embedding",
              "cross_entropy", "optimizer", "causal_conv1d", "ssd_chunk_cumsum", "ssd_chunk_state",
              "ssd_state_passing", "ssd_bmm_chunk", "ssd_chunk_scan", "gdn_chunk_rule", "dsa_index_scores", "dsa_topk",
              "sparse_attention", "memcpy", "memset", "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
              "broadcast", "send_recv", "framework", "other")
#: tracekit.core.stacks.stacks(): the profiles shipped in tracekit/data/stacks
STACKS = tuple(sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "data" / "stacks").glob("*.json")))


class Choice(click.Choice):
    """click's Choice, whose refusal also names the closest value: "'xla-gem' is not one of 'ett', ... (did you mean
    'xla-gemm'?)"."""

    def get_invalid_choice_message(self, value: Any, ctx: click.Context | None) -> str:
        from tracekit.core.errors import did_you_mean

        return super().get_invalid_choice_message(value, ctx) + did_you_mean(str(value), self.choices)


def choice(values: tuple[str, ...]) -> click.Choice:
    """A click type that takes one of `values` (case as written)."""
    return Choice(values)
