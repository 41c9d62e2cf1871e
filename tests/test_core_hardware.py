"""Hardware ids and datasheet lookups."""
from pathlib import Path

import pytest

from tracekit.core.cluster import Cluster
from tracekit.core.hardware import SPECS, cpu_hardware_id, hardware_spec, normalize_hardware
from tracekit.core.redact import redact


@pytest.mark.parametrize(
    "name, expected",
    [
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIAA100-SXM4-80GB", "A100-SXM4-80GB"),  # the seed paper's file-name form
        ("NVIDIA H100 80GB HBM3", "H100-80GB-HBM3"),
        ("NVIDIAGH200120GB", "GH200-120GB"),
        ("NVIDIA GH200 120GB", "GH200-120GB"),
        ("Tesla V100-SXM2-16GB", "V100-SXM2-16GB"),
        ("AMD Instinct MI300X", "MI300X"),
        ("", "unknown"),
    ],
)
def test_normalize(name, expected):
    assert normalize_hardware(name) == expected


#: What `torch.cuda.get_device_name()` (cudaDeviceProp.name, as nvidia-smi and a trace's deviceProperties print it)
#: returns on each part with a datasheet entry, from published logs and code that checks the name.
DEVICE_NAMES = [
    ("NVIDIA H200", "H200-141GB"),
    ("NVIDIA H100 80GB HBM3", "H100-80GB-HBM3"),
    ("NVIDIA H100 PCIe", "H100-PCIE-80GB"),
    ("NVIDIA H800", "H800-80GB-HBM3"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
    ("NVIDIA A100 80GB PCIe", "A100-PCIE-80GB"),
    ("NVIDIA GH200 480GB", "GH200-120GB"),  # the 96 GB HBM3 GH200, named for the Grace memory beside it
    ("NVIDIA GH200 120GB", "GH200-120GB"),
    ("NVIDIA GH200 96GB", "GH200-120GB"),
    ("NVIDIA B200", "B200-180GB"),
    ("NVIDIA GB200", "GB200-186GB"),
    ("NVIDIA B300 SXM6 AC", "B300-288GB"),
    ("NVIDIA GB300", "GB300-288GB"),
    ("Tesla V100-SXM2-16GB", "V100-SXM2-16GB"),
    ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"),
    ("AMD Instinct MI250X", "MI250X"),
    ("AMD Instinct MI300X", "MI300X"),
    ("AMD Instinct MI355X", "MI355X"),
]


@pytest.mark.parametrize("name, expected", DEVICE_NAMES)
def test_real_device_names_give_their_datasheet_id(name, expected):
    """The sampler, ingest, capture and the CLI all key samples and models by this id: `NVIDIA H200` was `H200`,
    which no bundled model or datasheet entry is named (#35)."""
    assert normalize_hardware(name) == expected
    assert hardware_spec(expected).name == expected


@pytest.mark.parametrize("name, expected, family_entry", [
    ("NVIDIA H200 NVL", "H200-NVL", "H200-141GB"),  # PCIe H200: lower clocks and power than the SXM part
    ("NVIDIA H100 NVL", "H100-NVL", "H100-80GB-HBM3"),  # 94 GB
    ("NVIDIA GH200 144G HBM3e", "GH200-144G-HBM3E", "GH200-120GB"),  # 144 GB HBM3e, 4.9 TB/s
    ("NVIDIA H20", "H20", None),  # a cut-down Hopper, not an H200
    ("NVIDIA L40S", "L40S", None),
    ("NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB", "A100-SXM4-40GB"),
])
def test_parts_without_their_own_datasheet_entry_keep_their_own_id(name, expected, family_entry):
    """Another part is never given a neighbour's id (its samples and models stay its own); for its peaks it falls
    back to its family's entry, or to none."""
    assert normalize_hardware(name) == expected
    spec = hardware_spec(expected)
    assert (spec.name if spec else None) == family_entry


def test_every_datasheet_id_is_its_own_normal_form():
    for entry in SPECS:
        assert normalize_hardware(entry) == entry
        assert normalize_hardware("NVIDIA " + entry.replace("-", " ")) == entry  # as a spaced device name


def test_specs_by_family():
    assert hardware_spec("A100-SXM4-40GB").mem_bw_gbs == 1555
    assert hardware_spec("A100-PCIE-40GB").name == "A100-SXM4-40GB"
    assert hardware_spec("H100-80GB-HBM3").peak_tflops_fp16 == 989
    assert hardware_spec("B200").name == "B200-180GB"
    assert hardware_spec(cpu_hardware_id()) is None
    assert cpu_hardware_id().startswith("cpu-")


@pytest.mark.parametrize("text, entry", [("GB200", "GB200-186GB"), ("NVIDIA GB200", "GB200-186GB"),
                                         ("GB300", "GB300-288GB"), ("B300", "B300-288GB"), ("B200", "B200-180GB"),
                                         ("MI355X", "MI355X"), ("H200", "H200-141GB")])
def test_every_blackwell_part_has_its_own_datasheet_entry(text, entry):
    """GB200 is not a B200 (its clock and peaks are higher), GB300 and B300 are not refused."""
    assert hardware_spec(normalize_hardware(text)).name == entry


def test_peaks_per_gemm_dtype_follow_the_tensor_cores():
    """Microscaled formats need fp4-generation tensor cores; fp8 is twice bf16 and fp4 above fp8 where they exist."""
    h100, b200, gb200 = hardware_spec("H100"), hardware_spec("B200"), hardware_spec("GB200")
    assert h100.peak_tflops("mxfp8") == 0 and h100.peak_tflops("nvfp4") == 0
    fp8 = h100.peak_tflops("fp8")
    assert fp8 == h100.peak_tflops("fp8_block") == pytest.approx(2 * h100.peak_tflops("bf16"), rel=0.01)
    for spec in (b200, gb200, hardware_spec("GB300")):
        assert spec.peak_tflops("nvfp4") > spec.peak_tflops("mxfp8") == spec.peak_tflops("fp8") > \
            spec.peak_tflops("bf16") > 0
    assert gb200.peak_tflops("bf16") > b200.peak_tflops("bf16")
    assert hardware_spec("MI355X").peak_tflops("nvfp4") == 0 < hardware_spec("MI355X").peak_tflops("mxfp4")


def test_nvl72_racks_are_one_nvlink_domain():
    from tracekit.core.cluster import default_cluster, infer_cluster, preset

    rack, _ = default_cluster("GB200-186GB", 4)
    assert rack.name == "gb200-nvl72" and rack.gpus_per_node == 4 and rack.domain_size == 72
    assert preset("dgx-h100").domain_size == 8
    text = "GB200 NVL72: 4 GPUs per compute tray ... USE_MNNVL=1, NVLINK_DOMAIN_SIZE=72"
    assert infer_cluster("GB200-186GB", 4, text)[0].domain_size == 72
    with pytest.raises(ValueError, match="multiple of gpus_per_node"):
        Cluster("GB200-186GB", gpus_per_node=4, nvlink_domain=70)


def test_cluster_links():
    cluster = Cluster("A100-SXM4-80GB", gpus_per_node=4, inter_node_gbs=12.5)
    assert cluster.link_gbs(crosses_nodes=False) == 300
    assert cluster.link_gbs(crosses_nodes=True) == 12.5


def test_redact_drops_environment_and_tokens():
    trace = {"metadata": {"system": {"env": {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz"}}},
             "deviceProperties": [{"name": "NVIDIA H100"}],
             "note": "token hf_abcdefghijklmnopqrstuvwxyz0 here", "api_key": "x"}
    clean = redact(trace)
    assert "metadata" not in clean and clean["deviceProperties"][0]["name"] == "NVIDIA H100"
    assert "hf_" not in str(clean) and clean["api_key"] == "<redacted>"


def test_command_lines_lose_every_credential_and_keep_the_rest():
    from tracekit.core.redact import redact_argv

    wandb = "0123456789abcdef0123456789abcdef01234567"
    argv = ["env", f"WANDB_API_KEY={wandb}", "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG", "CUDA_VISIBLE_DEVICES=0,1",
            "python3", "train.py", "--hf-token", "hf_x", "--password", "p", "--api-key=abc", "--num-layers", "24",
            "--wandb-key", wandb, "--note", "hf_abcdefghijklmnopqrstuvwxyz0", "--lr", "1e-4"]
    clean = redact_argv(argv)
    text = " ".join(clean)
    for secret in (wandb, "wJalrXUtnFEMI", "hf_x", " p ", "abc", "hf_abcdefghijklmnopqrstuvwxyz0"):
        assert secret not in f" {text} ", secret
    assert clean[:5] == ["env", "WANDB_API_KEY=<redacted>", "AWS_SECRET_ACCESS_KEY=<redacted>",
                         "CUDA_VISIBLE_DEVICES=0,1", "python3"]
    assert clean[6:8] == ["--hf-token", "<redacted>"] and "--api-key=<redacted>" in clean
    assert clean[clean.index("--num-layers") + 1] == "24" and clean[-1] == "1e-4"  # the rest is kept as typed


#: /proc/cpuinfo's first processor of CPUs as their kernels describe them (vendor, CPUID family/model/stepping and
#: model name as Intel's, AMD's and Arm's references list them for the part).
CPUINFO = {
    "sapphire-rapids": "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
                       "model name\t: Intel(R) Xeon(R) Platinum 8480C\nstepping\t: 8\n",
    "genoa": "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
             "model name\t: AMD EPYC 9654 96-Core Processor\nstepping\t: 1\n",
    "xeon-vm": "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\nmodel name\t: Intel Xeon Processor\n"
               "stepping\t: 8\n",
    "epyc-vm": "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\nstepping\t: 1\n",
    "cascade-vm": "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\n"
                  "model name\t: Intel(R) Xeon(R) CPU @ 2.80GHz\nstepping\t: 7\n",
    "grace": "processor\t: 0\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\nCPU architecture: 8\n"
             "CPU variant\t: 0x0\nCPU part\t: 0xd4f\nCPU revision\t: 0\n",
}


@pytest.mark.parametrize("cpu, expected", [
    ("sapphire-rapids", "cpu-intel-xeon-platinum-8480c"), ("genoa", "cpu-amd-epyc-9654"),
    ("xeon-vm", "cpu-intel-xeon-sapphire-rapids"), ("epyc-vm", "cpu-amd-epyc-genoa"),
    ("cascade-vm", "cpu-intel-xeon-cascade-lake"), ("grace", "cpu-arm-neoverse-v2")])
def test_a_cpu_id_says_which_cpu_it_is(cpu, expected):
    """The model number where the model name has one, else the generation its CPUID numbers name (a VM's generic
    name), the core of an Arm CPU; an id is its own normal form (a trace's cpu_model comes back as the same id)."""
    from tracekit.core.cpu_id import cpu_id

    made = cpu_id(CPUINFO[cpu], "aarch64" if cpu == "grace" else "x86_64")
    assert made == expected and normalize_hardware(made) == made


def test_this_machines_cpu_id_says_more_than_the_vendor_and_line():
    """`cpu-amd-epyc` or `cpu-intel-xeon-processor` (a VM's generic model name) say nothing of which CPU it is."""
    from tracekit.core.cpu_id import LINE_WORDS

    words = set(cpu_hardware_id().removeprefix("cpu-").split("-"))
    assert words - LINE_WORDS - {"processor"}, cpu_hardware_id()
    assert normalize_hardware(cpu_hardware_id()) == cpu_hardware_id()


def test_models_made_under_this_cpus_earlier_id_answer_for_it(tmp_path):
    """A model set trained before the id rule changed (its CPU named `cpu-amd-epyc`, the model name's slug) still
    answers for this machine's CPU: predict resolves to it and validate does not call the models missing."""
    import pandas as pd

    from predictor import ModelSet, train_models
    from predictor.costs.estimates import resolve_hardware
    from tracekit.core.cpu_id import cpu_ids, legacy_cpu_id, machine_description
    from tracekit.validate.run import missing_models

    earlier = legacy_cpu_id(*machine_description())
    assert cpu_ids()[-1] == earlier
    samples = pd.read_csv(Path(__file__).parent / "data" / "cpu_collectives.csv", comment="#")
    samples = samples[samples["primitive"] == "all_reduce"].assign(hardware=earlier)  # gloo all-reduces, timed
    train_models(samples, tmp_path, {}, folds=2)
    models = ModelSet.load(tmp_path)
    assert list(models.hardware_ids()) == [earlier]
    hardware, note = resolve_hardware(cpu_hardware_id(), list(models.hardware_ids()))
    assert hardware == earlier and (note is None or "earlier id" in note)
    assert missing_models(models, cpu_hardware_id(), tmp_path) is None
