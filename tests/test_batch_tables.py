"""Published tables read as they are (predictor.batch): cells with notes, unstated and ambiguous cells, hardware
text, the stack from the `framework` column and the cluster from `gpus_per_node` + `interconnect`."""
from __future__ import annotations

import csv
import dataclasses

import pytest

from extractors.jobs.megatron import config_from_argv
from extractors.jobs.rows import parse_row
from extractors.jobs.table import read_cell
from tests.conftest import CORPUS
from tracekit.core.cluster import infer_cluster, stated_network_gbs
from tracekit.core.errors import ConfigError
from tracekit.core.stacks import get_stack, select_stack, stacks

E2E = CORPUS / "e2e"
SETS = ("vtrain_a100_single_node.csv", "vtrain_a100_multi_node.csv", "narayanan2021_table1_a100_selene.csv")


def rows_of(name: str) -> list[dict]:
    with open(E2E / name, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("name", SETS)
def test_every_corpus_row_parses_with_the_values_its_cells_state(name):
    for line, cells in enumerate(rows_of(name), start=2):
        row = parse_row(cells, line, None, None)
        assert row.error is None, (line, row.error)
        c = row.config
        # the leading value of a cell with a note: 'full (use_checkpoint=true)', 'fp16 mixed (... assumed)'
        assert c.recompute_granularity == cells["activation_recompute"].split()[0]
        assert c.precision == "fp16" and cells["precision"].startswith("fp16")
        assert (c.tp, c.pp, c.dp) == (int(cells["tp"]), int(cells["pp"]), int(cells["dp"]))
        assert c.world_size == int(cells["num_gpus"])
        assert row.cluster.gpus_per_node == int(cells["gpus_per_node"])
        assert row.cluster.hardware == "A100-SXM4-80GB"
        assert c.attention == "unfused"  # neither 2021 Megatron-LM nor 2023 Megatron-DeepSpeed had flash attention


def test_unstated_ambiguous_and_annotated_cells_take_documented_defaults_and_say_so():
    value, note = read_cell("micro_batch_size", "")
    assert value is None and note.startswith("micro_batch_size not stated: the fastest of 1, 2, 4, 8 and 16")
    assert read_cell("micro_batch_size", "not stated") == (value, note)
    value, note = read_cell("precision", "not stated")
    assert value is None and "precision 'not stated': bf16 assumed" == note
    assert read_cell("precision", "fp16/bf16") == ("bf16", "precision 'fp16/bf16' is ambiguous: bf16 assumed")
    assert read_cell("activation_recompute", "selective (attention core only)") == ("selective", None)
    assert read_cell("activation_recompute", "full (use_checkpoint=true)") == ("full", None)
    cells = dict(rows_of("narayanan2021_table1_a100_selene.csv")[3], precision="fp16/bf16",
                 activation_recompute="selective (attention core only)", sequence_parallel="not stated")
    row = parse_row(cells, 5, None, None)
    assert row.error is None
    assert row.config.precision == "bf16" and row.config.recompute_granularity == "selective"
    assert row.config.sequence_parallel is False and row.config.micro_batch_size == 1
    assert any("ambiguous" in n for n in row.notes) and any("sequence_parallel" in n for n in row.notes)
    assert any("micro_batch_size not stated" in n for n in row.notes)
    # a value given with --set is not an assumption: no note says the default was taken
    row = parse_row(cells, 5, None, None, {"micro_batch_size": 2})
    assert row.config.micro_batch_size == 2 and not any("micro_batch_size" in n for n in row.notes)


def test_num_gpus_that_disagrees_with_the_split_is_an_error_naming_both():
    cells = dict(rows_of("narayanan2021_table1_a100_selene.csv")[0], num_gpus="48")
    row = parse_row(cells, 2, None, None)
    assert row.config is None and "num_gpus 48" in row.error and "1·1·32·1 = 32" in row.error


@pytest.mark.parametrize("text, hardware, note", [
    ("NVIDIA A100-SXM4-80GB (Selene, DGX A100)", "A100-SXM4-80GB", None),
    ("NVIDIA A100 (SXM variant/memory not stated in repo)", "A100-SXM4-80GB", "memory not stated"),
    ("A100 40GB", "A100-SXM4-40GB", "A100-SXM4-40GB datasheet"),
    ("NVIDIA H100 80GB HBM3", "H100-80GB-HBM3", None),
    ("H100 SXM5", "H100-80GB-HBM3", "H100-80GB-HBM3 datasheet"),
    ("H100 PCIe", "H100-PCIE-80GB", None),  # a device name of that entry (#35)
    ("NVIDIA H200", "H200-141GB", None),
    ("GH200", "GH200-120GB", "GH200-120GB datasheet"),
    ("B200", "B200-180GB", None),
    ("AMD Instinct MI300X", "MI300X", None),
])
def test_hardware_text_maps_to_a_datasheet_entry(text, hardware, note):
    from extractors.jobs.table import hardware_text

    got, said = hardware_text({"hardware_gpu": text})
    assert got == hardware
    assert (said is None) if note is None else (note in said)


@pytest.mark.parametrize("framework, stack", [
    ("Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed)", "megatron-deepspeed-2023"),
    ("Megatron-LM (2021)", "megatron-lm-2021"),
    ("Megatron-core 0.9 with Transformer Engine", "megatron-core"),
    ("NeMo 24.07", "megatron-bridge"),
    ("Megatron-Bridge / Megatron-Core + Transformer Engine (NeMo 26.08 container)", "megatron-bridge"),
    ("GPT-NeoX", "gpt-neox"),
    ("", "megatron-core"),
])
def test_stack_is_selected_from_the_framework_column(framework, stack):
    chosen, note = select_stack(framework)
    assert chosen.name == stack and note == ""


def test_unknown_framework_falls_back_with_a_note_and_unknown_stack_suggests():
    chosen, note = select_stack("Colossal-AI 0.3")
    assert chosen.name == "megatron-core" and "not recognised" in note
    with pytest.raises(ConfigError, match="did you mean 'megatron-lm-2021'"):
        get_stack("megatron-lm-2012")


def test_stack_constants_are_fitted_on_one_set_and_shared_by_its_fork():
    # the 2021 Megatron-LM profile has no measurements of its own: it takes its fork's constants, never its rows'
    known = stacks()
    assert known["megatron-lm-2021"].constants == known["megatron-deepspeed-2023"].constants
    assert known["megatron-deepspeed-2023"].fit["rows"]["file"] == "e2e/vtrain_a100_single_node.csv"
    assert known["megatron-lm-2021"].fit["rows"]["file"] == "e2e/vtrain_a100_single_node.csv"  # its fork's rows


def test_cluster_inferred_from_the_interconnect_text():
    selene, note = infer_cluster("A100-SXM4-80GB", 8, "NVLink3/NVSwitch intra-node; InfiniBand HDR inter-node (Selene)")
    assert selene.name == "selene" and selene.inter_node_gbs == 25 and note == ""
    vtrain, note = infer_cluster("A100-SXM4-80GB", 8, "vTrain config assumes intra-node 150 GB/s, inter-node 800 Gbps")
    assert vtrain.inter_node_gbs == pytest.approx(800 / 8 / 8) and vtrain.intra_node_gbs == 300
    assert "12.5 GB/s per GPU" in note
    assert stated_network_gbs("inter-node 400 Gb/s per GPU", 8) == 50
    assert stated_network_gbs("inter-node 50 GB/s per GPU", 4) == 50
    assert stated_network_gbs("single node", 8) is None
    perl, _ = infer_cluster("A100-SXM4-80GB", 4, "")
    assert perl.name == "perlmutter" and perl.fabric == "nvlink"


def test_fp8_rows_are_predicted_and_flagged_and_refused_only_without_fp8_tensor_cores(tmp_path):
    from predictor.costs.learned.models import ModelSet
    from predictor.predict import predict_many
    from tracekit.core.calibration import NONE

    base = dict(rows_of("narayanan2021_table1_a100_selene.csv")[3], hardware_gpu="NVIDIA H100 SXM5 80GB",
                gpu_memory_gb="80", interconnect="DGX H100", framework="Megatron-core with Transformer Engine")
    fp8 = parse_row(dict(base, precision="fp8 (hybrid, delayed scaling)"), 2, None, None)
    bf16 = parse_row(dict(base, precision="bf16"), 3, None, None)
    assert fp8.error is None and fp8.config.precision == "fp8" and fp8.cluster.name == "dgx-h100"
    a, b = predict_many([fp8.config, bf16.config], [fp8.cluster, bf16.cluster], ModelSet.load(), NONE)
    assert any(w.startswith("fp8: linear layers' GEMMs in fp8") for w in a.warnings)
    by_prim = {}
    for doc, key in ((a, "fp8"), (b, "bf16")):
        for op in doc.operators:
            if op["stage"] == 0 and op["pass"] == "fwd":
                by_prim.setdefault(op["primitive"], {})[key] = op["time_s"]
    assert by_prim["gemm"]["fp8"] < by_prim["gemm"]["bf16"]  # fp8 GEMMs at the fp8 rate
    assert by_prim["norm"]["fp8"] == by_prim["norm"]["bf16"]  # the rest stays bf16
    on_a100 = parse_row(dict(base, precision="fp8", hardware_gpu="NVIDIA A100-SXM4-80GB", interconnect=""), 4,
                        None, None)
    (err,) = predict_many([on_a100.config], [on_a100.cluster], ModelSet.load(), NONE)
    assert isinstance(err, ConfigError) and "fp8 needs fp8 tensor cores: A100-SXM4-80GB" in str(err)
    for recipe in ("mxfp8", "nvfp4"):  # Hopper has no microscaled tensor cores; Blackwell has
        h100 = parse_row(dict(base, precision=recipe), 5, None, None)
        (err,) = predict_many([h100.config], [h100.cluster], ModelSet.load(), NONE)
        assert isinstance(err, ConfigError) and "tensor cores: H100-80GB-HBM3 has none" in str(err)
    args = config_from_argv("--num-layers 2 --hidden-size 64 --num-attention-heads 4 "
                                             "--seq-length 32 --bf16 --fp8-format hybrid")
    assert args.precision == "fp8"


def test_every_row_of_every_corpus_set_parses_or_names_its_contradiction():
    """Every published row is read with the CLI's defaults; the only refusal is a row whose stated split Megatron
    itself refuses (EP 64 on the 32 GPUs of a pipeline stage), named as such."""
    refused = []
    from extractors.jobs.table import read_rows

    for path in sorted(E2E.glob("*.csv")):
        _, cells = read_rows(path)
        for i, row in enumerate(cells):
            parsed = parse_row(row, i + 2, None, None)
            if parsed.error:
                refused.append((path.name, i + 2, parsed.error))
    assert [(name, line) for name, line, _ in refused] == [("megatron_bridge_perf.csv", 81)], refused
    assert "not divisible by expert_tensor_parallel_size·expert_model_parallel_size = 1·64" in refused[0][2]


def test_a_rows_recompute_modules_are_read_with_the_granularity_its_column_states():
    """Bridge rows say `selective` in activation_recompute and name the modules in their notes: both are read, and
    recomputing the norms and the MoE activation (instead of core attention) lowers the activations kept."""
    from predictor.memory.stages import config_memory

    path = CORPUS / "e2e" / "megatron_bridge_perf.csv"
    with open(path, newline="") as fh:
        cells = list(csv.DictReader(fh))
    seen = 0
    for i, row in enumerate(cells):
        text = row["activation_recompute"]
        if not text.startswith("selective (recompute_modules=["):
            continue
        stated = tuple(m.strip(" '\"") for m in text.split("[", 1)[1].split("]", 1)[0].split(","))
        parsed = parse_row(row, i + 2, None, None)
        assert parsed.error is None, parsed.error
        c = parsed.config
        assert (c.recompute_granularity, c.recompute_modules) == ("selective", stated), (i + 2, text)
        seen += 1
    assert seen >= 20
    oss = next(i for i, r in enumerate(cells) if "OSS" in r["model_name"] and r["hardware_gpu"] == "B200-180GB"
               and "moe_act" in r["activation_recompute"])
    c = parse_row(cells[oss], oss + 2, None, None).config
    kept = config_memory(c, "B200-180GB")[0]
    none = config_memory(dataclasses.replace(c, recompute_granularity="none", recompute_modules=None), "B200-180GB")[0]
    # the published run fit its 180 GB; tracekit's estimate is within 1% of that (benchmarks/memory_accuracy.py)
    assert kept["activations"] < none["activations"] and kept["total"] <= 180 * 1.02


def test_the_recompute_cells_own_settings_are_read_and_recompute_only_those_layers():
    """`full (recompute_method=block, recompute_num_layers=5: ...)` (Llama 3 8B on H100, NeMo 25.11): block
    recompute of 5 layers per chunk, not of all 32 — which keeps the other 27 layers' activations."""
    import dataclasses

    from predictor.memory.stages import config_memory

    line, cells = next((i, c) for i, c in enumerate(rows_of("megatron_bridge_perf.csv"), start=2)
                       if c["activation_recompute"].startswith("full (recompute_method=block"))
    row = parse_row(cells, line, None, None)
    assert row.error is None and row.config is not None and row.cluster is not None
    c = row.config
    assert (c.recompute_granularity, c.recompute_method, c.recompute_num_layers) == ("full", "block", 5)
    assert any("activation_recompute cell" in n for n in row.notes)
    every = dataclasses.replace(c, recompute_method="uniform", recompute_num_layers=1)
    assert config_memory(c, row.cluster.hardware)[0]["activations"] > \
        config_memory(every, row.cluster.hardware)[0]["activations"]


def test_a_row_without_its_micro_batch_takes_the_fastest_that_fits_and_says_what_the_others_give():
    """Narayanan 2021's rows state no micro-batch, and Megatron has no default (`--micro-batch-size` is required).
    Each is predicted at every micro-batch of 1, 2, 4, 8, 16 its global batch allows (global batch / dp divisible by
    it) and takes the fastest that fits: its prediction is the row's with that micro-batch stated, no other that fits
    is faster, and one warning gives each other one. A row that states its micro-batch is predicted at it alone."""
    from predictor import ModelSet
    from predictor.batch import MICRO_BATCHES, predict_rows

    models = ModelSet.load(None)
    table = rows_of("narayanan2021_table1_a100_selene.csv")
    small, large = table[0], next(c for c in table if c["row_ref"] == "row 145.6B")  # 16 and 96 samples a replica
    few = dict(small, global_batch_size="64")  # 2 per data-parallel rank: micro-batch 1 or 2
    for cells, allowed in ((small, MICRO_BATCHES), (few, (1, 2)), (large, (1, 2, 4, 8, 16))):
        per_replica = int(cells["global_batch_size"]) // int(cells["dp"])
        assert allowed == tuple(m for m in MICRO_BATCHES if per_replica % m == 0)
        stated = [dict(cells, micro_batch_size=str(m)) for m in allowed]
        rows = [parse_row(c, i + 2, None, None) for i, c in enumerate([cells, *stated])]
        assert [r.assumed for r in rows] == [("micro_batch_size",)] + [()] * len(allowed)
        unstated, *each = predict_rows(rows, models)
        taken = unstated.config.micro_batch_size
        assert taken in allowed
        same = each[allowed.index(taken)]
        assert unstated.iteration_time_s == pytest.approx(same.iteration_time_s, rel=1e-9)
        assert unstated.fits_in_memory is not False
        for m, p in zip(allowed, each):
            assert not any(w.startswith("micro_batch_size not stated") for w in p.warnings)
            if p.fits_in_memory is not False:
                assert p.iteration_time_s >= unstated.iteration_time_s * (1 - 1e-9), (cells["row_ref"], m)
        line = next(w for w in unstated.warnings if w.startswith("micro_batch_size not stated"))
        assert line.startswith(f"micro_batch_size not stated: {taken} taken, the fastest that fits of the "
                               f"micro-batches the global batch allows ({', '.join(map(str, allowed))};")
        for m, p in zip(allowed, each):
            if m != taken:
                fits = ", does not fit" if p.fits_in_memory is False else ""
                assert f"{m}: {p.iteration_time_s:.4g} s (" in line and (not fits or fits in line)
        others = line.split("at micro-batch ")[1]
        assert all(f"; {m}: " not in others and not others.startswith(f"{m}: ") for m in MICRO_BATCHES
                   if m not in allowed)
    # a replica of 96 samples at micro-batch 16 of a 146B model on 8 A100s a stage: over 80 GB even recomputed
    assert each[-1].fits_in_memory is False and taken < 16


def test_the_narayanan_launch_lines_state_what_each_row_states_and_what_it_leaves_out():
    """benchmarks/launch/narayanan2021_sc21.json: the authors' scripts for Table 1. Each run's line agrees with its
    corpus row on every column both state (the row parsed alone and with the line: the same model, split, batch and
    GPUs), and fills what the row leaves out — the micro-batch (no longer assumed), the interleaving, the DDP."""
    import json
    from pathlib import Path

    launch = json.loads((Path(__file__).resolve().parent.parent / "benchmarks" / "launch" /
                         "narayanan2021_sc21.json").read_text())["rows"]
    for i, cells in enumerate(rows_of("narayanan2021_table1_a100_selene.csv")):
        run = launch[cells["row_ref"]]
        alone, launched = (parse_row(c, i + 2, None, None) for c in (cells, dict(cells,
                                                                                   megatron_args=run["megatron_args"])))
        assert not alone.error and not launched.error, (cells["row_ref"], alone.error, launched.error)
        a, b = alone.config, launched.config
        for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "tp", "pp", "dp",
                    "global_batch_size", "world_size", "recompute_granularity"):
            assert getattr(a, key) == getattr(b, key), (cells["row_ref"], key)
        assert int(cells["num_gpus"]) == 8 * run["nodes"]
        assert a.micro_batch_size == 1 and "micro_batch_size" in alone.assumed
        assert "micro_batch_size" not in launched.assumed
        assert not any(n.startswith("micro_batch_size") for n in launched.notes)
        words = run["megatron_args"].split()
        assert b.micro_batch_size == int(words[words.index("--micro-batch-size") + 1])
        assert b.overlap_grad_reduce == (words[words.index("--DDP-impl") + 1] == "torch")
        if "--num-layers-per-virtual-pipeline-stage" in words:
            per = int(words[words.index("--num-layers-per-virtual-pipeline-stage") + 1])
            assert b.vp == b.num_layers // (b.pp * per) > 1
        else:
            assert b.vp == 1
