"""RMSNorm and RoPE as the kernels a stack runs (predictor.layers.norm_rope): invariants over every GPU of the
datasheet table (a fused RMSNorm never slower than the fused LayerNorm of its shape, a fused RoPE within its bytes
at a fraction of the GPU's HBM bandwidth and never faster than them at the peak, Blackwell never slower than Hopper),
the bytes the fused RoPE rows stand for, and the published Megatron-Bridge rows read with the kernels their
performance launchers run."""
from __future__ import annotations

import csv

import numpy as np
import pandas as pd
import pytest

from extractors.jobs.rows import parse_row
from predictor.assembly.graph import build_graph
from predictor.costs.learned.models import ModelSet
from predictor.costs.physics.transfer import kernel_timed
from predictor.layers.norm_rope import FUSED_RMSNORM, FUSED_ROPE
from tests.conftest import E2E
from tracekit.core.config import TrainingConfig
from tracekit.core.hardware import SPECS, hardware_spec

BRIDGE = E2E / "megatron_bridge_perf.csv"
GPUS = sorted(hw for hw in SPECS if not hw.startswith("cpu-"))
NORM_SHAPES = [(8192, 4096), (4096, 8192), (16384, 2880), (2048, 5120), (65536, 128), (1024, 1024)]
#: Fused RoPE tensors (tokens · heads, head dim): Llama 3 8B's q and k at TP 1 and a GQA k at TP 4.
ROPE_SHAPES = [(8192 * 32, 128), (8192 * 8, 128), (8192 * 2, 128), (4096 * 64, 64)]


def _norm_frame(variant: str) -> pd.DataFrame:
    rows = [dict(hardware=hw, primitive="norm", dtype="bf16", variant=variant, role=None, rows=r, width=w,
                 numel=r * w, **{"pass": p}) for hw in GPUS for p in ("fwd", "bwd") for r, w in NORM_SHAPES]
    return pd.DataFrame(rows)


def _rope_frame() -> pd.DataFrame:
    rows = []
    for hw in GPUS:
        for p in ("fwd", "bwd"):
            for n, d in ROPE_SHAPES:
                same = n * d * 2.0 / 3.0  # the res_add numel that moves a fused kernel's 2 · n · d elements
                rows.append(dict(hardware=hw, primitive="elementwise", dtype="bf16", variant=FUSED_ROPE, role=None,
                                 rows=same / d, width=d, numel=same, tensor=n * d, **{"pass": p}))
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def models() -> ModelSet:
    return ModelSet.load()


def test_a_fused_rmsnorm_is_never_slower_than_the_layernorm_of_its_shape_on_any_gpu(models):
    rms = models.predict(_norm_frame(FUSED_RMSNORM))["duration_us"].to_numpy()
    ln = models.predict(_norm_frame("layernorm"))["duration_us"].to_numpy()
    assert np.isfinite(rms).all() and (rms > 0).all()
    assert (rms <= ln * (1 + 1e-9)).all()


def test_a_fused_rope_moves_its_bytes_at_a_fraction_of_the_hbm_bandwidth_on_any_gpu(models):
    """Never faster than its bytes at the datasheet's HBM bandwidth; never slower than at a quarter of it plus a
    20 µs launch floor (the unfused chain on Blackwell had run at ~0.4 TB/s of 8) where the answering model learned
    kernel times (a GPU whose models learned `tracekit sample`'s wall clock around each call and a synchronize, the
    H200's, answers with that host time: predictor.costs.physics.transfer.WALL_CLOCK_SOURCES)."""
    frame = _rope_frame()
    t = models.predict(frame)["duration_us"].to_numpy()
    bw = np.array([hardware_spec(h).mem_bw_gbs * 1e9 for h in frame["hardware"]])
    seconds = 2.0 * frame["tensor"].to_numpy() * 2 / bw  # read and write, bf16
    assert (t * 1e-6 >= seconds).all()
    wall_clock = {hw for hw in GPUS if (m := models.resolve(hw, "elementwise", "fwd", "res_add")) is not None
                  and not kernel_timed(m)}
    kernels = ~frame["hardware"].isin(wall_clock).to_numpy()
    assert kernels.sum() > len(frame) / 2
    slow = kernels & (t > seconds / 0.25 * 1e6 + 20.0)
    assert not slow.any(), frame.assign(us=t)[slow]


@pytest.mark.parametrize("frame", [lambda: _norm_frame(FUSED_RMSNORM), _rope_frame])
def test_blackwell_is_never_slower_than_hopper_for_these_kernels(models, frame):
    f = frame()
    t = models.predict(f)["duration_us"].to_numpy()
    by = {hw: t[(f["hardware"] == hw).to_numpy()] for hw in ("H100-80GB-HBM3", "B200-180GB", "GB200-186GB")}
    assert (by["B200-180GB"] <= by["H100-80GB-HBM3"]).all() and (by["GB200-186GB"] <= by["H100-80GB-HBM3"]).all()


def _llama(**kw) -> TrainingConfig:
    base = dict(num_layers=2, hidden_size=1024, num_attention_heads=16, num_query_groups=4, seq_length=2048,
                micro_batch_size=1, global_batch_size=8, normalization="RMSNorm", position_embedding_type="rope",
                swiglu=True)
    base.update(kw)
    return TrainingConfig.from_mapping(base)


def _ops(config: TrainingConfig, prefix: str) -> list[dict]:
    """The forward rows named `prefix` of one micro-batch, each with the number of layers it runs in (`count`)."""
    g = build_graph(config, "H100-80GB-HBM3")
    return [{**g.specs[o.spec], "count": o.count} for o in g.segments[0].fwd if o.name.startswith(prefix)]


def test_fused_rope_is_one_kernel_for_q_and_one_for_k_moving_their_elements_twice():
    c = _llama(apply_rope_fusion=True)
    q, k = 2048 * 16 * 64, 2048 * 4 * 64  # tokens · heads · head dim, GQA: 4 key heads
    rows = _ops(c, "self_attention.rotary")
    assert [r["variant"] for r in rows] == [FUSED_ROPE] * 2 and sum(r["count"] for r in rows) == 4  # 2 layers
    assert sum(3 * r["numel"] * r["count"] for r in rows) == pytest.approx(2 * 2 * (q + k))  # res_add: 3 per numel


def test_unfused_rope_moves_the_elements_of_q_and_k_as_the_samples_timed_them():
    """The samples time the chain on a q and a k of as many heads; with GQA (16 query, 4 key heads) the row stands
    for the same elements, q's and k's."""
    [row] = _ops(_llama(), "self_attention.rotary")
    assert 2 * row["numel"] == pytest.approx(2048 * (16 + 4) * 64)


def test_unfused_rope_and_rmsnorm_keep_the_sampled_kernels():
    c = _llama()
    assert {r["variant"] for r in _ops(c, "self_attention.rotary")} == {"RoPE"}
    assert {r["variant"] for r in _ops(c, "input_layernorm")} == {"RMSlayernorm"}
    assert {r["variant"] for r in _ops(_llama(fused_rmsnorm=True), "input_layernorm")} == {FUSED_RMSNORM}


def test_fusing_makes_the_iteration_shorter():
    from predictor.predict import predict
    from tracekit.core.cluster import preset

    models, cluster = ModelSet.load(), preset("dgx-h100")

    def time(**kw):
        return predict(_llama(world_size=8, **kw), cluster, models).iteration_time_s

    assert time(apply_rope_fusion=True) < time()
    assert time(fused_rmsnorm=True) < time()


def _bridge_rows() -> list[tuple[dict, TrainingConfig]]:
    with open(BRIDGE, newline="") as fh:
        cells = list(csv.DictReader(fh))
    out = []
    for i, row in enumerate(cells):
        parsed = parse_row(row, i + 2, None, None)
        if parsed.config is not None:
            out.append((row, parsed.config))
    return out


def test_the_bridge_rows_run_fused_rmsnorm_and_rope_as_their_launchers_set_it():
    """Only Llama 3's provider fuses RoPE, but every Bridge performance launcher sets `apply_rope_fusion=True`
    over the model recipe (extractors.jobs.bridge.perf_launch)."""
    rows = _bridge_rows()
    assert len(rows) >= 90
    for row, c in rows:
        assert c.normalization == "RMSNorm" and c.fused_rmsnorm, row["row_ref"]
        assert c.position_embedding_type == "rope", row["row_ref"]
        assert c.apply_rope_fusion, row["row_ref"]


def test_no_rope_fusion_on_the_launch_line_turns_the_fused_kernels_off():
    row, _ = next((r, c) for r, c in _bridge_rows() if "llama" in r["model_name"].lower())
    parsed = parse_row({**row, "megatron_args": "--no-rope-fusion"}, 2, None, None)
    assert parsed.config is not None and not parsed.config.apply_rope_fusion
