"""Fine-grained activation offloading as time (predictor.schedule.activation_offload): the bytes each module's group
copies are what its ops save for the backward, worked out here by hand from Megatron-core's modules; the copies back
hide at most their own time; a run that offloads is slower and holds less memory than the same run without it; the flags
are classified as modelled."""
from __future__ import annotations

import csv

import numpy as np
import pytest

from extractors.jobs.rows import parse_row
from predictor.assembly.graph import build_graph
from predictor.costs.learned.models import ModelSet
from predictor.layers.decoder import blocks_named
from predictor.memory.stages import stage_memory
from predictor.predict import predict
from predictor.schedule.activation_offload import (
    LINK_EFFICIENCY,
    LayerCopies,
    backward_exposed_us,
    group_bytes,
    link_bytes_per_us,
    segment_copies,
)
from tests.conftest import CORPUS
from tracekit.core.config import TrainingConfig
from tracekit.core.megatron_arguments import flag_classes, unmodelled_flags

S, B, H, A, TP = 4096, 1, 1024, 32, 2
BASE = dict(num_layers=4, hidden_size=H, num_attention_heads=A, seq_length=S, micro_batch_size=B,
            tensor_model_parallel_size=TP, sequence_parallel=True, world_size=TP, attention="unfused",
            hidden_dropout=0.0, attention_dropout=0.0, position_embedding_type="rope", normalization="RMSNorm")
MODULES = ["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm"]
DENSE = blocks_named("dense")  # a dense layer's blocks: attention and MLP


def _config(**more) -> TrainingConfig:
    return TrainingConfig.from_mapping({**BASE, **more})


def test_each_group_copies_what_its_module_saves_for_the_backward():
    """One layer, one micro-batch, 2 bytes an element: the norms and QKV's input are the local sequence shard (SP),
    core attention keeps q, k, v of its 16 local heads and, unfused, the [b, heads, s, s] softmax output; the output
    projection's input is the attention output of the local heads."""
    c = _config(fine_grained_activation_offloading=True, offload_modules=MODULES)
    got = group_bytes(c, DENSE)
    d, heads, local = H // A, A // TP, S * B // TP
    assert got["attn_norm"] == got["mlp_norm"] == got["qkv_linear"] == 2 * local * H  # 4 MiB each
    assert got["core_attn"] == 2 * (3 * S * B * heads * d + B * heads * S * S)  # 3 × 4 MiB + 512 MiB
    assert got["attn_proj"] == 2 * S * B * heads * d
    small = _config(fine_grained_activation_offloading=True, offload_modules=MODULES,
                    min_offloaded_tensor_size=local * H + 1)  # the norm inputs now fall under the floor
    assert group_bytes(small, DENSE)["attn_norm"] == 0.0


def test_nothing_is_copied_without_the_switch_and_half_with_half_the_groups():
    assert group_bytes(_config(offload_modules=MODULES), DENSE) == {}
    full = group_bytes(_config(fine_grained_activation_offloading=True, offload_modules=MODULES), DENSE)
    half = group_bytes(_config(fine_grained_activation_offloading=True, offload_modules=MODULES,
                               activation_offload_fraction=0.5), DENSE)
    assert half == {k: v / 2 for k, v in full.items()}


def test_host_link_is_the_narrower_of_the_gpus_link_and_its_share_of_host_memory():
    # DGX H100: Gen5 x16 (64 GB/s a direction) but 2 × 307.2 GB/s of DDR5 for 8 GPUs, halved for both directions
    assert link_bytes_per_us("H100-80GB-HBM3") == pytest.approx(2 * 307.2 / 8 / 2 * 1e3 * LINK_EFFICIENCY)
    # GB200: NVLink-C2C (450 GB/s a direction); 18.4 TB/s of LPDDR5X per 72 GPUs, halved
    assert link_bytes_per_us("GB200") == pytest.approx(18.4e3 / 72 / 2 * 1e3 * LINK_EFFICIENCY, rel=1e-3)


def test_copies_back_expose_at_most_their_time_and_only_what_the_ops_between_groups_do_not_hide():
    copies = LayerCopies({"core_attn": 1000.0, "mlp_norm": 1000.0}, rate=10.0)  # 100 µs each
    # backward order: the MLP (no group) hides mlp_norm's copy for 30 µs; core attention follows the projection
    ops = [("mlp.linear_fc2", 30.0), ("pre_mlp_layernorm", 5.0), ("self_attention.linear_proj", 40.0),
           ("self_attention.core_attention.bmm", 10.0)]
    assert backward_exposed_us(ops, copies) == pytest.approx((100 - 30) + (100 - 40))
    assert backward_exposed_us([("mlp.linear_fc2", 500.0), ("pre_mlp_layernorm", 5.0)], copies) == 0.0


def test_every_segment_waits_between_nothing_and_all_of_its_copies():
    c = _config(fine_grained_activation_offloading=True, offload_modules=MODULES, pipeline_model_parallel_size=2,
                world_size=2 * TP)
    graph = build_graph(c, "H100-80GB-HBM3")
    for scale in (0.0, 1.0, 1e4):  # ops that take nothing, little, or far longer than the copies
        dur = np.full(len(graph.specs), scale)
        for seg in graph.segments:
            copies, waits = segment_copies(c, graph.hardware, seg.bwd, dur)
            assert copies > 0 and 0.0 <= waits <= copies
            if scale == 0.0:
                assert waits == pytest.approx(copies)


@pytest.fixture(scope="module")
def models():
    return ModelSet.load()


def test_offloading_ci_run_is_slower_and_holds_less_than_the_same_run_without_it(models):

    with open(CORPUS / "e2e" / "megatron_ci_golden.csv", newline="") as fh:
        cells = next(r for r in csv.DictReader(fh) if r["model_name"].endswith("etp1_fine_grained_offloading"))
    row = parse_row(cells, 0, None, None)
    c, cluster, _ = row.complete()
    plain = parse_row(cells, 0, None, None, {"fine_grained_activation_offloading": False}).complete()[0]
    with_off = predict(c, cluster, models, row.calibration)
    without = predict(plain, cluster, models, row.calibration)
    assert with_off.iteration_time_s > without.iteration_time_s
    assert stage_memory(c)[0]["activations"] < stage_memory(plain)[0]["activations"]
    assert not any("offload" in w for w in with_off.warnings)


def test_offloading_flags_are_modelled():
    classes = flag_classes()
    for flag in ("--fine-grained-activation-offloading", "--offload-modules", "--min-offloaded-tensor-size",
                 "--activation-offload-fraction"):
        assert classes[flag] == "modelled"
    assert unmodelled_flags({"fine_grained_activation_offloading": True, "offload_modules": ["core_attn"]}) == []
