"""What Megatron-Bridge's model recipes set beyond provider and precision (extractors.jobs.bridge.recipes), and the
pipeline layout a published row without one ran with (tracekit.core.pipeline_layout.filled_layout), on the corpus's
published Bridge rows."""
from __future__ import annotations

import pytest

from extractors.jobs.bridge.recipes import preset_model_recipe, recipe_settings
from extractors.jobs.rows import parse_row
from predictor.costs.learned.models import ModelSet
from predictor.predict import predict_many
from tests.conftest import bridge_rows
from tracekit.core.pipeline_layout import filled_layout, parse_layout


@pytest.mark.parametrize("clause, recipe", [
    ("recipe preset LLAMA3_70B_H100_FP8_CS_BASE_CONFIG in scripts/performance/configs/w.py@v0.2.0", "llama3_70b"),
    ("recipe preset perf_matrix[h100][num_gpus_64][common+fp8_cs] in "
     "scripts/performance/configs/llama3/llama3_70b_llm_pretrain.yaml@r0.1.0 (matches)", "llama3_70b"),
    ("recipe preset LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_MX_V2 in scripts/performance/l.py", "llama3_70b"),
    ("recipe preset LLAMA3_8B_H100_FP8_CS_BASE_CONFIG in scripts/performance/configs/llama3/w.py", None),
    ("recipe preset LLAMA3_70BX_CONFIG in a.py", None),  # a longer name that only contains the recipe's
    ("arch: Llama3ModelProvider70B, no preset named", None),
])
def test_a_preset_names_its_model_recipe(clause, recipe):
    assert preset_model_recipe(f"x | {clause} | y") == recipe


def test_bridge_turns_tensor_parallel_overlap_off_below_tp2_without_sequence_parallelism_or_in_nvfp4():
    notes = "recipe preset LLAMA3_70B_H100_FP8_CS_BASE_CONFIG in scripts/performance/configs/llama3/w.py"
    settings, note = recipe_settings(notes, 4, True, "fp8-cs", set())
    assert settings == {"tp_comm_overlap": True} and note and "tp_comm_overlap=True" in note
    assert recipe_settings(notes, 1, False, "fp8-cs", set()) == ({}, None)
    assert recipe_settings(notes, 2, False, "fp8-cs", set()) == ({}, None)
    assert recipe_settings(notes, 2, True, "nvfp4", set()) == ({}, None)  # the NVFP4 performance configs
    assert recipe_settings(notes, 4, True, "fp8-cs", {"tp_comm_overlap"}) == ({}, None)  # the row's own wins


def test_every_published_llama3_70b_row_with_tp_and_sp_overlaps_tp_communication_and_no_other_row_does():
    seen = {True: 0, False: 0}
    for line, cells in bridge_rows():
        row = parse_row(cells, line, None, None)
        if row.config is None:
            continue
        expected = ("70B" in cells["model_name"] and row.config.tp > 1 and row.config.sequence_parallel
                    and row.config.precision != "nvfp4")
        if "tp_comm_overlap" in cells["notes"]:
            continue  # the row states it: not the recipe's to say
        assert row.config.tp_comm_overlap is expected, (line, cells["model_name"])
        seen[expected] += 1
    assert seen[True] >= 8 and seen[False] >= 50  # H100 tp4 and GB200 tp2 rows; every other model's


def test_61_layers_over_8_by_4_stages_take_bridges_deepseek_v3_layout():
    """Bridge's DeepSeek-V3 H100 performance scripts pass `Et|(tt|)*30mL` for pp 8 · vp 4."""
    assert parse_layout(filled_layout(61, 32, 1)) == parse_layout("Et|(tt|)*30mL")
    assert parse_layout(filled_layout(61, 32, 0)) == parse_layout("Et|(tt|)*30L")
    # the other rules stand: 61 over 16 stages is 4 × 15 + 1 (Bridge's layout map), over 8 stages 8 × 7 + 5
    assert parse_layout(filled_layout(61, 16, 1)) == parse_layout("Etttt|(tttt|)*14tmL")
    assert parse_layout(filled_layout(61, 8, 1)) == parse_layout("Etttttttt|(tttttttt|)*6tttttmL")


@pytest.mark.parametrize("layers, stages, mtp", [(61, 32, 1), (61, 32, 0), (30, 16, 1), (20, 16, 0), (13, 4, 1),
                                                  (95, 48, 0), (7, 6, 1)])
def test_a_filled_layout_holds_every_layer_once_on_every_stage(layers, stages, mtp):
    parsed = parse_layout(filled_layout(layers, stages, mtp))
    joined = "".join(parsed)
    assert len(parsed) == stages
    assert joined.count("t") == layers and joined.count("m") == mtp
    assert parsed[0].startswith("E") and parsed[-1].endswith("L") and joined.count("E") == joined.count("L") == 1


def test_llama3_70b_on_h100_hides_its_tensor_parallel_communication_under_the_gemms():
    """Line 90 (Llama 3 70B, 64 × H100, tp 4 with SP) with the recipe's overlap, against the same row stating
    `tp_comm_overlap=False`: less exposed communication, the same compute."""
    line, cells = next((n, c) for n, c in bridge_rows() if n == 90)
    assert "70B" in cells["model_name"] and cells["hardware_gpu"].startswith("H100")
    off = dict(cells, notes=cells["notes"] + " | tp_comm_overlap=False")
    rows = [parse_row(cells, line, None, None), parse_row(off, line, None, None)]
    assert [r.config.tp_comm_overlap for r in rows] == [True, False]
    on_pred, off_pred = predict_many([r.config for r in rows], [r.cluster for r in rows], ModelSet.load())
    assert on_pred.breakdown["exposed_communication"] < 0.5 * off_pred.breakdown["exposed_communication"]
    assert on_pred.breakdown["compute"] == pytest.approx(off_pred.breakdown["compute"], rel=1e-6)
    assert on_pred.iteration_time_s < off_pred.iteration_time_s
