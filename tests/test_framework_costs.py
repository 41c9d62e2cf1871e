"""Megatron-core's own costs (#21 part 6): the run-settings section, CUDA-graph capture, the per-parameter passes and
timers, deterministic mode's NCCL algorithm, the host CPU scales of the stack constants and their fit, and the class
of every Megatron flag with the one warning line for flags that change the time unmodelled. Real models (bundled),
real corpus rows, Megatron's own flag list."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from extractors import jobs as B
from extractors.jobs.megatron import config_from_argv
from predictor.architecture.tensors import chunk_tensors
from predictor.assembly.graph import build_graph
from predictor.predict import predict, prepare_many
from predictor.schedule.framework_costs import capture, cluster_for, pass_costs
from predictor.schedule.stage_work import simulate_graph
from predictor.sweeps.calibration_fit import fit_with_hosts
from tests.conftest import E2E
from tracekit.cli import app
from tracekit.core.calibration import HOST_CONSTANTS, NONE, host_scaled
from tracekit.core.cluster import preset
from tracekit.core.config import TrainingConfig, own_setting_names
from tracekit.core.errors import ConfigError
from tracekit.core.hardware import hardware_spec
from tracekit.core.hosts import host_class, host_cpus
from tracekit.core.megatron_arguments import CLASSES, dest_form, flag_classes, unmodelled_flags
from tracekit.core.stacks import get_stack, stacks

ROOT = Path(__file__).resolve().parent.parent
FLAGS = json.loads((ROOT / "tracekit" / "data" / "megatron_flags.json").read_text())["flags"]
#: A small host-bound GPT (Megatron-LM CI's shape): 12 layers of h512, 8 micro-batches per iteration.
TINY = ("--num-layers 12 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --micro-batch-size 4 "
        "--global-batch-size 32 --bf16 --disable-bias-linear --untie-embeddings-and-output-weights")
runner = CliRunner()


@pytest.fixture(scope="module")
def models():
    from predictor.costs.learned.models import ModelSet

    return ModelSet.load()


def config(extra: str = "", base: str = TINY) -> TrainingConfig:
    return config_from_argv(f"{base} {extra}", get_stack("megatron-core").config)


def prediction(models, extra: str = "", hardware: str = "A100-SXM4-80GB", cal=None, base: str = TINY):
    c = config(extra, base)
    cluster = preset("dgx-a100" if hardware.startswith("A100") else "dgx-h100", hardware)
    return predict(c, cluster, models, cal if cal is not None else get_stack("megatron-core").calibration(hardware))


# -- flag classes ----------------------------------------------------------------------------------------------
def test_every_megatron_flag_has_a_class_and_the_flags_tracekit_reads_are_modelled():
    classes = flag_classes()
    assert set(classes) == set(FLAGS)  # no flag without a class, no class of a flag Megatron lacks
    assert set(classes.values()) <= set(CLASSES)
    own = own_setting_names()
    for flag, entry in FLAGS.items():
        names = {dest_form(flag), entry["dest"].lower()}
        if flag.startswith("--no-"):
            names.add(dest_form(flag[5:]))
        read = bool(names & own)
        assert (classes[flag] == "modelled") == read, f"{flag}: read by tracekit {read}, class {classes[flag]}"


def test_the_inputs_page_counts_the_flags_of_each_class():
    page = (ROOT / "docs" / "inputs.md").read_text()
    counts = {name: list(flag_classes().values()).count(name) for name in CLASSES}
    assert f"Every one of the {len(FLAGS)} flags" in page
    for name, count in counts.items():
        assert re.search(rf"`{name}` \({count}:", page), (name, count)


def test_the_flags_the_costs_are_modelled_for_are_modelled_and_the_costless_are_not_warned():
    classes = flag_classes()
    for flag in ("--deterministic-mode", "--log-params-norm", "--log-num-zeros-in-grad",
                 "--no-gradient-accumulation-fusion", "--timing-log-level", "--cuda-graph-impl", "--cuda-graph-scope",
                 "--enable-cuda-graph", "--external-cuda-graph", "--attention-backend",
                 "--no-check-for-nan-in-loss-and-grad", "--check-for-large-grads", "--check-for-spiky-loss",
                 "--loss-scale", "--calculate-per-token-loss", "--ddp-average-in-collective", "--use-tp-pp-dp-mapping",
                 "--use-precision-aware-optimizer", "--exp-avg-dtype"):
        assert classes[flag] == "modelled", flag
    for flag in ("--lr", "--save", "--data-path", "--log-timers-to-tensorboard", "--seed", "--eval-interval"):
        assert classes[flag] == "no_effect", flag


def test_unmodelled_flags_are_named_unless_set_to_megatrons_default():
    c = config("--openai-gelu --manual-gc --distributed-backend nccl --clip-grad 1.0 --lr 3e-4 --save /x "
               "--no-check-for-nan-in-loss-and-grad")
    # --distributed-backend nccl is Megatron's default: it changes nothing; --lr and --save have no effect; the
    # result checks are modelled (tracekit.core.runtime.result_checks)
    assert unmodelled_flags(c.extra) == ["--openai-gelu", "--manual-gc"]
    assert unmodelled_flags(config("--distributed-backend gloo").extra) == ["--distributed-backend"]


def test_predict_prints_one_warning_line_naming_the_unmodelled_flags():
    res = runner.invoke(app, ["predict", "--megatron-args",
                              f"{TINY} --openai-gelu --manual-gc --lr 1e-4",
                              "--hardware", "A100-SXM4-80GB", "--json"])
    assert res.exit_code == 0, res.output
    lines = [w for w in json.loads(res.stdout)["warnings"] if "not modelled" in w]
    assert len(lines) == 1 and "--openai-gelu" in lines[0] and "--manual-gc" in lines[0]
    assert "--lr" not in lines[0]


def test_a_batch_rows_megatron_args_are_warned_about_in_its_warnings_column(tmp_path):
    out = tmp_path / "out.csv"
    res = runner.invoke(app, ["predict", "--batch", str(E2E / "megatron_ci_golden.csv"), "--csv-out", str(out)])
    assert res.exit_code == 0, res.output
    import csv

    rows = list(csv.DictReader(out.open()))
    collected = [r for r in rows if "--manual-gc" in r["megatron_args"]]
    assert collected and all("--manual-gc" in r["warnings"] for r in collected)
    assert all(r["warnings"].count("not modelled") <= 1 for r in rows)
    for modelled in ("--defer-embedding-wgrad-compute", "--overlap-p2p-communication-warmup-flush"):  # no warning
        stated = [r for r in rows if modelled in r["megatron_args"]]
        assert stated and not any(modelled in r["warnings"] for r in stated)


def test_regenerating_the_flag_list_keeps_the_classes(tmp_path):
    spec = importlib.util.spec_from_file_location("megatron_flags_tool", ROOT / "tools" / "megatron_flags.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    path = tmp_path / "classes.json"
    path.write_text(json.dumps({"what": "x", "classes": {"--lr": "no_effect", "--gone": "modelled"}}))
    new = tool.merge_classes({"--lr": {}, "--brand-new": {}}, path)
    assert new == ["--brand-new"]
    doc = json.loads(path.read_text())
    assert doc["classes"] == {"--brand-new": "time_unmodelled", "--lr": "no_effect"} and doc["what"] == "x"


# -- the run-settings section --------------------------------------------------------------------------------
def test_cuda_graph_flags_as_megatron_migrates_them():
    assert config("--enable-cuda-graph").run.graph_impl == "local"
    assert config("--external-cuda-graph").run.graph_impl == "transformer_engine"
    assert config("--cuda-graph-scope full_iteration").run.graph_impl == "full_iteration"
    scoped = config("--cuda-graph-impl transformer_engine --cuda-graph-scope attn moe_router").run
    assert scoped.graph_modules == {"attn", "moe_router"}
    assert config("--cuda-graph-impl local --cuda-graph-modules full").run.graph_modules == frozenset()
    assert config("--no-gradient-accumulation-fusion").run.accumulation_fused is False
    assert config("").run is None  # nothing stated: Megatron's defaults


@pytest.mark.parametrize("flags", ["--enable-cuda-graph --cuda-graph-impl local",
                                   "--enable-cuda-graph --external-cuda-graph",
                                   "--cuda-graph-impl full_iteration --cuda-graph-modules attn",
                                   "--cuda-graph-impl everything", "--cuda-graph-impl local --cuda-graph-modules atn"])
def test_cuda_graph_settings_megatron_refuses_are_refused(flags):
    with pytest.raises(ConfigError):
        config(flags).validate()


def test_ci_rows_read_their_run_settings_and_environment():
    _, cells = B.read_rows(E2E / "megatron_ci_golden.csv")
    rows = [B.parse_row(c, i + 2, None, None) for i, c in enumerate(cells)]
    assert all(r.error is None for r in rows)
    deterministic = [r for r in rows if "--deterministic-mode" in r.cells["megatron_args"]]
    assert deterministic and all(r.config.run.deterministic_mode for r in deterministic)
    ring = [r for r in rows if "NCCL_ALGO=Ring" in r.cells["notes"]]
    assert ring and all(r.config.run.nccl_algo == "Ring" and not r.config.run.in_network_reduction for r in ring)
    graphs = [r for r in rows if "--cuda-graph-impl" in r.cells["megatron_args"]]
    assert graphs and all(capture(r.config).any for r in graphs)


# -- CUDA graphs ---------------------------------------------------------------------------------------------
def test_cuda_graphs_remove_host_time_and_leave_device_time(models):
    none = prediction(models)
    attn = prediction(models, "--cuda-graph-impl transformer_engine --cuda-graph-scope attn")
    layer = prediction(models, "--cuda-graph-impl local")
    full = prediction(models, "--cuda-graph-impl full_iteration")
    compute = {p.breakdown["compute"] for p in (none, attn, layer, full)}
    assert max(compute) == pytest.approx(min(compute), rel=1e-12)  # the same kernels run
    other = [p.breakdown["other"] for p in (none, attn, layer, full)]
    assert other[0] > other[1] > other[2] > other[3]  # more captured, less host time
    assert none.iteration_time_s > attn.iteration_time_s > layer.iteration_time_s > full.iteration_time_s


def test_the_attention_scope_captures_the_attention_ops_and_nothing_of_the_mlp():
    c = config("--cuda-graph-impl transformer_engine --cuda-graph-scope attn")
    g = build_graph(c, "A100-SXM4-80GB")
    cap = capture(c)
    ops = [o for seg in g.segments for o in seg.fwd + seg.bwd if o.per_layer and o.group is None]
    captured = {o.name for o in ops if cap.region(o) is not None}
    assert captured == {o.name for o in ops if o.name.startswith(("input_layernorm", "self_attention."))}
    assert not any(cap.region(o) is not None for o in ops if o.name.startswith(("mlp.", "pre_mlp_layernorm")))
    assert not any(capture(config("--cuda-graph-impl local --cuda-graph-modules moe")).region(o) is not None
                   for o in ops)  # a moe scope captures nothing of a dense model


def test_full_iteration_graphs_take_no_host_time_per_call(models):
    cal = NONE.with_values(microbatch_overhead_us=1000.0)
    unchecked = "--no-check-for-nan-in-loss-and-grad"  # as a captured iteration runs (tests/test_result_checks.py)
    many = prediction(models, f"--cuda-graph-impl full_iteration {unchecked}", cal=cal)
    eager = prediction(models, unchecked, cal=cal)
    # 8 micro-batches × (forward + backward) calls of 1 ms each are gone with the whole iteration captured
    assert eager.iteration_time_s - many.iteration_time_s == pytest.approx(16e-3, rel=1e-6)


# -- per-parameter passes, timers, NCCL algorithm ----------------------------------------------------------------
def test_gradient_accumulation_without_fusion_moves_the_weight_gradients_per_micro_batch(models):
    cal = NONE  # no host time: the device moving bytes alone
    fused = prediction(models, cal=cal)
    unfused = prediction(models, "--no-gradient-accumulation-fusion", cal=cal)
    c = fused.config
    h, layers, vocab = c.hidden_size, c.num_layers, c.padded_vocab_size
    weights = layers * 12 * h * h + vocab * h  # QKV 3h², proj h², fc1 and fc2 4h² each; the untied output layer
    per_element = 2 + 4 + 4  # read the bf16 gradient and the fp32 main gradient, write the main gradient
    bandwidth = hardware_spec("A100-SXM4-80GB").mem_bw_gbs * 1e9 * 0.8  # roofline's achievable memory fraction
    expected = c.num_microbatches * weights * per_element / bandwidth
    extra = unfused.breakdown["compute"] - fused.breakdown["compute"]
    assert extra == pytest.approx(expected, rel=0.02)  # the norms' few parameters are the 2%


@pytest.mark.parametrize("flag", ["--log-params-norm", "--log-num-zeros-in-grad", "--no-gradient-accumulation-fusion",
                                  "--timing-log-level 1", "--timing-log-level 2"])
def test_each_costly_flag_makes_the_iteration_slower(models, flag):
    assert prediction(models, flag).iteration_time_s > prediction(models).iteration_time_s


def test_timer_barriers_cost_only_when_level_1_timers_run(models):
    level1 = prediction(models, "--timing-log-level 1").iteration_time_s
    no_barrier = prediction(models, "--timing-log-level 1 --no-barrier-with-level-1-timing").iteration_time_s
    assert level1 > no_barrier > prediction(models).iteration_time_s
    assert prediction(models, "--no-barrier-with-level-1-timing").iteration_time_s == \
        pytest.approx(prediction(models).iteration_time_s)


def test_parameter_tensors_of_a_dense_layer():
    c = config()  # LayerNorm, no biases: per layer QKV, proj, fc1, fc2 weights and two norms of 2 tensors
    per_chunk = chunk_tensors(c, 0, 0)
    assert per_chunk.linear_weights == 12 * 4 + 1  # + the untied output layer
    assert per_chunk.tensors == 12 * (4 + 2 * 2) + 1 + 1 + 2 + 1  # + word and position embeddings, final norm, head
    costs = pass_costs(build_graph(config("--log-num-zeros-in-grad"), "A100-SXM4-80GB"))
    plain = pass_costs(build_graph(c, "A100-SXM4-80GB"))
    assert costs.iteration_steps[0] - plain.iteration_steps[0] == per_chunk.tensors  # one zero count per gradient


def test_deterministic_mode_runs_nccl_without_in_network_reduction(models):
    h100 = preset("dgx-h100")
    assert h100.in_network_reduction != "none"
    assert cluster_for(config("--deterministic-mode"), h100).in_network_reduction == "none"
    assert cluster_for(config(""), h100) is h100
    assert cluster_for(TrainingConfig.from_mapping({**config("").to_dict(), "nccl_algo": "NVLS,Ring"}),
                       h100) is h100
    dp = ("--num-layers 4 --hidden-size 4096 --num-attention-heads 32 --seq-length 2048 --micro-batch-size 1 "
          "--global-batch-size 8 --bf16")  # dp 8: the gradient all-reduce inside one NVSwitch node
    def on_8(flags: str) -> TrainingConfig:
        return TrainingConfig.from_mapping({**config(flags, dp).to_dict(), "world_size": 8, "data_parallel_size": None})

    nvls = predict(on_8(""), h100, models, NONE)
    ring = predict(on_8("--deterministic-mode"), h100, models, NONE)
    assert nvls.config.dp == 8
    assert ring.iteration_time_s > nvls.iteration_time_s


def test_nccl_nvls_enable_0_takes_nvls_away_and_keeps_sharp(models):
    h100 = preset("dgx-h100")
    assert "nvls" in h100.in_network_reduction
    base = config("").to_dict()
    off = TrainingConfig.from_mapping({**base, "nccl_nvls_enable": "0"})
    on = TrainingConfig.from_mapping({**base, "nccl_nvls_enable": "1"})
    assert cluster_for(on, h100) is h100
    assert cluster_for(off, h100).in_network_reduction == ("sharp" if "sharp" in h100.in_network_reduction else "none")
    both = dataclasses.replace(h100, in_network_reduction="nvls+sharp")
    assert cluster_for(off, both).in_network_reduction == "sharp"  # SHARP over the network is another setting
    # the CI rows whose launch environment says NCCL_NVLS_ENABLE=0 read it
    _, cells = B.read_rows(E2E / "megatron_ci_golden.csv")
    rows = [B.parse_row(c, i + 2, None, None) for i, c in enumerate(cells)]
    stated = [r for r in rows if "NCCL_NVLS_ENABLE=0" in r.cells["notes"]]
    assert stated and all(r.config.run.nvls_off for r in stated)
    assert not any(r.config.run and r.config.run.nvls_off for r in rows if r not in stated)
    # dp 8 inside one NVSwitch node: the gradient all-reduce without NVLS is slower, the compute the same
    dp = ("--num-layers 4 --hidden-size 4096 --num-attention-heads 32 --seq-length 2048 --micro-batch-size 1 "
          "--global-batch-size 8 --bf16")
    def on_8(extra: dict) -> TrainingConfig:
        return TrainingConfig.from_mapping({**config("", dp).to_dict(), "world_size": 8, "data_parallel_size": None,
                                            **extra})

    with_nvls = predict(on_8({}), h100, models, NONE)
    without = predict(on_8({"nccl_nvls_enable": "0"}), h100, models, NONE)
    assert without.iteration_time_s > with_nvls.iteration_time_s
    assert without.breakdown["compute"] == pytest.approx(with_nvls.breakdown["compute"])


# -- stack constants and host CPUs ------------------------------------------------------------------------------
def test_host_classes_of_the_usual_nodes():
    assert host_class("A100-SXM4-80GB") == "amd-zen2"
    assert host_class("H100-80GB-HBM3") == host_class("B200-180GB") == "intel-golden-cove"
    assert host_class("GB200-186GB") == "arm-neoverse-v2"  # Grace, not the B200's Xeon
    assert host_class("MI300X") is None
    for stack in stacks().values():
        assert set(stack.host_scale) <= set(host_cpus())


def test_a_stacks_host_scale_multiplies_its_host_constants_only():
    core = get_stack("megatron-core")
    a100, h100 = core.calibration("A100-SXM4-80GB"), core.calibration("H100-80GB-HBM3")
    scale = core.host_scale.get("intel-golden-cove", 1.0)
    for key in HOST_CONSTANTS:
        assert getattr(h100, key) == pytest.approx(getattr(a100, key) * scale)
    for key in ("memory_scale", "comm_scale"):
        assert getattr(h100, key) == getattr(a100, key)
    # the compute scale is the stack's own (no device scale of megatron-core's, none taken from another stack)
    assert h100.compute_scale == pytest.approx(a100.compute_scale * core.device_scale.get("hopper", 1.0))
    assert get_stack("megatron-bridge").host_scale == core.host_scale  # constants_from carries the scales
    assert core.calibration("cpu-x").host_op_us == 0.0


def test_the_host_fit_recovers_planted_constants_and_a_host_scale(models):
    # runs whose host time grows with the layers × micro-batches (per op) or with the micro-batches alone (per call),
    # on DGX A100 and on DGX H100, whose host CPU is planted 0.7× as slow
    shapes = [f"--num-layers {layers} --micro-batch-size {mb} --global-batch-size 32"
              for layers in (2, 8, 16) for mb in (1, 4)]
    base = "--hidden-size 512 --num-attention-heads 8 --seq-length 1024 --bf16"
    configs, clusters, hosts = [], [], []
    for hardware, name in (("A100-SXM4-80GB", "dgx-a100"), ("H100-80GB-HBM3", "dgx-h100")):
        for shape in shapes:
            configs.append(config(shape, base))
            clusters.append(preset(name, hardware))
            hosts.append(host_class(hardware))
    prepared = prepare_many(configs, clusters, models)
    planted = NONE.with_values(host_op_us=150.0, microbatch_overhead_us=2000.0)
    measured = np.array([simulate_graph(g, est, host_scaled(planted, 0.7 if h != "amd-zen2" else 1.0))[3]
                         .iteration_us / 1e6 for (g, est, _, _), h in zip(prepared, hosts)])
    cal, scales, history = fit_with_hosts(prepared, measured, hosts, ("host_op_us", "microbatch_overhead_us"),
                                          "amd-zen2", rounds=8)
    assert min(history) < 0.01
    assert cal.host_op_us == pytest.approx(150.0, rel=0.05)
    assert cal.microbatch_overhead_us == pytest.approx(2000.0, rel=0.1)
    assert scales["intel-golden-cove"] == pytest.approx(0.7, rel=0.05) and scales["amd-zen2"] == 1.0


def test_a_stack_reads_its_own_fitted_numbers_and_those_it_declares_only(corpus):
    """A profile's calibration is made of its own file's numbers and, where it declares `constants_from`, that
    profile's host constants and host CPU scales — nothing else: no stack takes another's device scales (torchtitan,
    which measured nothing, gets none on any GPU; Composer's scales on an H100 are the ones it fitted on A100s).
    A device scale is fitted on the stack's own runs: every row of the file its fit names is that stack's."""
    import csv
    import json

    from tests.conftest import E2E, ROOT
    from tracekit.core.hardware import architecture
    from tracekit.core.stacks import get_stack, select_stack

    assert architecture("GB200-186GB") == architecture("B200-180GB") == architecture("B300-288GB") == "blackwell"
    assert architecture("H200-141GB") == "hopper" and architecture("cpu-amd-epyc") is None
    docs = {p.stem: json.loads(p.read_text()) for p in (ROOT / "tracekit" / "data" / "stacks").glob("*.json")}
    for name, doc in docs.items():
        source = docs[doc["constants_from"]] if "constants_from" in doc else doc
        constants = source.get("constants", {})
        for hw in ("A100-SXM4-80GB", "H100-80GB-HBM3", "H200-141GB", "B200-180GB", "GB200-186GB"):
            cal = get_stack(name).calibration(hw)
            device = doc.get("device_scale", {}).get(architecture(hw), 1.0)
            host = source.get("host_scale", {}).get(host_class(hw) or "", 1.0)
            assert cal.compute_scale == pytest.approx(constants.get("compute_scale", 1.0) * device), (name, hw)
            for key in HOST_CONSTANTS:
                assert getattr(cal, key) == pytest.approx(constants.get(key, 0.0) * host), (name, hw, key)
        if doc.get("device_scale"):
            with (E2E / doc["device_fit"]["rows"]["file"].removeprefix("e2e/")).open(newline="") as f:
                assert {select_stack(row["framework"])[0].name for row in csv.DictReader(f)} == {name}
    titan = get_stack("torchtitan").calibration("H100-80GB-HBM3")
    assert titan.compute_scale == 1.0 and titan.host_op_us == 0.0
    assert get_stack("composer").calibration("B200-180GB").attention_scale == docs["composer"]["constants"][
        "attention_scale"]
    assert get_stack("megatron-core").calibration("cpu-amd-epyc").compute_scale == 1.0
