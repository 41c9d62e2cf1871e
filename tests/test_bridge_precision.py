"""Megatron-Bridge's precision presets (extractors.jobs.bridge.precision) on the corpus's published rows."""
from __future__ import annotations

import csv
import dataclasses

import pytest

from extractors.jobs.bridge.precision import precision_settings, preset_recipe
from extractors.jobs.rows import parse_row
from predictor.memory.stages import config_memory
from tests.conftest import CORPUS

BRIDGE = CORPUS / "e2e" / "megatron_bridge_perf.csv"


def bridge_rows() -> list[dict]:
    with open(BRIDGE, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("preset, recipe", [
    ("QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1", "fp8-cs"),
    ("LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_MX_V2", "mxfp8"),
    ("perf_matrix[gb200][num_gpus_8][common+fp8_cs]", "fp8-cs"),
    ("deepseek_v3_pretrain_256gpu_gb200_fp8mx_config()", "mxfp8"),
    ("LLAMA3_70B_PRETRAIN_CONFIG_GB200_NVFP4_V2", "nvfp4"),
    ("DEEPSEEK_V3_GB200_BF16_BASE_CONFIG", "bf16"),
    ("LLAMA3_8B_H100_FP8_DS_BASE_CONFIG", "fp8"),
    ("LLAMA3_8B_H100_FP8_SS_BASE_CONFIG", "fp8-block"),
    ("MY_FP8CSX_CONFIG", None),  # a word that only contains the spelling is no precision
])
def test_a_preset_name_spells_its_recipe(preset, recipe):
    assert preset_recipe(f"x | recipe preset {preset} in scripts/performance/configs/a.py@v0.5.0 (matches)") == recipe


def test_a_generic_fp8_column_takes_the_presets_scaling_and_what_bridge_sets_for_it():
    notes = "recipe preset QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 in scripts/performance/configs/q.py"
    settings, note = precision_settings(notes, "fp8", {"precision"})
    assert settings == {"precision": "fp8-cs", "fp8_param_gather": True}
    assert note and "fp8_param_gather=True" in note
    # a row that states the setting keeps its own; MXFP8 keeps quantised parameters too, blockwise sets nothing
    # (module docstring)
    assert precision_settings(notes, "fp8", {"precision", "fp8_param_gather"})[0] == {"precision": "fp8-cs"}
    mx = "recipe preset LLAMA3_70B_PRETRAIN_CONFIG_GB200_FP8_MX_V2 in scripts/performance/configs/l.py"
    assert precision_settings(mx, "mxfp8", {"precision"})[0] == {"fp8_param_gather": True}
    ss = "recipe preset DEEPSEEK_V3_PRETRAIN_CONFIG_H100_FP8_SC_V1 in scripts/performance/configs/d.py"
    assert precision_settings(ss, "fp8-block", {"precision"}) == ({}, None)
    # a column that names another recipe than the preset wins, and nothing is read from the preset
    assert precision_settings(notes, "bf16", {"precision"}) == ({}, None)
    assert precision_settings("no preset here", "fp8", {"precision"}) == ({}, None)


def test_every_published_fp8_row_runs_current_scaling_with_fp8_parameters():
    """The tables write "fp8" for H100/GB200 rows whose presets are all current scaling (`_FP8_CS_`)."""
    checked = 0
    for line, cells in enumerate(bridge_rows(), start=2):
        if cells["precision"].strip().lower() not in ("fp8", "fp8-cs"):
            continue
        row = parse_row(cells, line, None, None)
        assert row.config is not None, row.error
        assert row.config.precision == "fp8-cs"
        assert row.config.lowp is not None and row.config.lowp.fp8_param_gather
        checked += 1
    assert checked == 30


def test_fp8_parameters_drop_the_bf16_weight_copy_from_memory():
    """Qwen3-30B-A3B on 16 H100 (fp8-cs, the published row that had come out at 80.4 of 80 GB): with fp8 parameter
    gathering the quantised weights replace the bf16 ones, so the weights take less and nothing else changes."""
    cells = next(c for c in bridge_rows() if c["model_name"] == "Qwen3_30B_a3B" and c["precision"] == "fp8-cs"
                 and c["hardware_gpu"].startswith("H100"))
    row = parse_row(cells, 0, None, None)
    assert row.config is not None and row.cluster is not None
    gathered, _ = config_memory(row.config, row.cluster.hardware)
    plain = dataclasses.replace(row.config, lowp=dataclasses.replace(row.config.lowp, fp8_param_gather=False))
    kept, _ = config_memory(plain, row.cluster.hardware)
    assert gathered["weights"] < kept["weights"]
    for part in ("gradients", "optimizer_state", "activations"):
        assert gathered[part] == pytest.approx(kept[part])
    assert gathered["total"] < 80.0  # the run was measured on 80 GB GPUs
