"""Megatron-core's native vocab-parallel cross entropy (predictor.layers.embedding.cross_entropy): never faster than its
fp32 passes at the GPU's HBM bandwidth on any datasheet GPU, the fused loss (Transformer Engine's) not held to them, the
loss's time growing with the vocabulary and with slower memory, and the published Megatron-Bridge rows read with the
fused loss every Bridge model provider runs (GPTModelProvider's `cross_entropy_loss_fusion`)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from extractors.jobs.rows import parse_row
from predictor.assembly.graph import build_graph
from predictor.costs.learned.models import ModelSet
from predictor.layers.embedding.cross_entropy import FUSED, NATIVE
from tests.conftest import bridge_rows
from tracekit.core.config import TrainingConfig
from tracekit.core.hardware import SPECS, hardware_spec

GPUS = sorted(hw for hw in SPECS if not hw.startswith("cpu-") and hardware_spec(hw).mem_bw_gbs)
#: (tokens, vocab per TP rank): GPT-OSS's micro-batch of 4 × 4096 at TP 1, its 1 × 4096 on H100, a GPT-2 vocabulary.
SHAPES = [(16384, 201088), (4096, 201088), (8192, 50304)]


def _frame(variant: str, shapes=SHAPES, gpus=GPUS) -> pd.DataFrame:
    return pd.DataFrame([dict(hardware=hw, primitive="cross_entropy", dtype="bf16", variant=variant, role=None,
                              rows=t, width=v, numel=t * v, tp=1, **{"pass": p})
                         for hw in gpus for p in ("fwd", "bwd") for t, v in shapes])


@pytest.fixture(scope="module")
def models() -> ModelSet:
    return ModelSet.load()


def test_the_native_loss_is_never_faster_than_its_fp32_passes_at_the_hbm_bandwidth(models):
    """Forward: the bf16 logits read once, fp32 written by the cast, read by max, read and written by the
    subtraction, the exp and the division, read by the sum (38 bytes a logit); backward: the gradient scaled in
    place and cast back to bf16 (14)."""
    frame = _frame(NATIVE)
    t = models.predict(frame)["duration_us"].to_numpy()
    bw = np.array([hardware_spec(h).mem_bw_gbs * 1e9 for h in frame["hardware"]])
    per_logit = np.where(frame["pass"] == "fwd", 2 + 4 + 4 + 4 + 4 + 4 + 4 + 4 + 4 + 4, 4 + 4 + 4 + 2)
    assert (t * 1e-6 >= frame["numel"].to_numpy() * per_logit / bw * (1 - 1e-9)).all()


def test_the_fused_loss_is_not_held_to_the_native_chains_bytes(models):
    """On Hopper and Blackwell the transfer answer of a 201,088-entry loss is below the native chain's bytes (the
    floor binds), and the fused loss keeps it: faster than the native chain, never slower."""
    gpus = ["H100-80GB-HBM3", "B200-180GB", "GB200-186GB"]
    native = models.predict(_frame(NATIVE, SHAPES[:2], gpus))["duration_us"].to_numpy()
    fused = models.predict(_frame(FUSED, SHAPES[:2], gpus))["duration_us"].to_numpy()
    assert (fused <= native).all()
    assert (fused < native).any()


def test_the_native_loss_grows_with_the_vocabulary_and_with_slower_memory(models):
    vocab = models.predict(_frame(NATIVE, [(8192, 50304), (8192, 100608), (8192, 201088)], ["H100-80GB-HBM3"]))
    t = vocab["duration_us"].to_numpy().reshape(2, 3)  # pass × vocabulary
    assert (np.diff(t, axis=1) > 0).all()
    # H100 SXM (3.35 TB/s) against H200 (4.8 TB/s): the floor binds on both at GPT-OSS's loss, so the times are in
    # the inverse ratio of the bandwidths
    pair = models.predict(_frame(NATIVE, SHAPES[:1], ["H100-80GB-HBM3", "H200-141GB"]))["duration_us"].to_numpy()
    ratio = hardware_spec("H200-141GB").mem_bw_gbs / hardware_spec("H100-80GB-HBM3").mem_bw_gbs
    assert pair[0] / pair[2] == pytest.approx(ratio, rel=1e-6)  # forward rows: H100, then H200


def _loss_variant(config: TrainingConfig) -> str:
    g = build_graph(config, "H100-80GB-HBM3")
    (spec,) = {o.spec for o in g.segments[-1].fwd if o.name == "loss.vocab_parallel_cross_entropy"}
    return g.specs[spec]["variant"]


def test_cross_entropy_loss_fusion_selects_the_fused_loss():
    base = dict(num_layers=2, hidden_size=1024, num_attention_heads=16, seq_length=2048, micro_batch_size=1,
                global_batch_size=8, vocab_size=201088)
    assert _loss_variant(TrainingConfig.from_mapping(base)) == NATIVE
    assert _loss_variant(TrainingConfig.from_mapping({**base, "cross_entropy_loss_fusion": True})) == FUSED


def test_the_bridge_rows_run_the_loss_their_model_providers_set():
    seen: dict[str, set[str]] = {}
    for line, c in bridge_rows():
        row = parse_row(c, line, None, None)
        if row.error:
            continue
        family = c["model_name"].split()[0].split("_")[0].upper()
        seen.setdefault(family, set()).add(_loss_variant(row.config))
    # every Bridge provider derives from GPTModelProvider, which fuses the loss
    assert seen["GPT"] == seen["QWEN3"] == seen["LLAMA3"] == seen["DEEPSEEKV3"] == {FUSED}
