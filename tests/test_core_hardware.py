"""Hardware ids and datasheet lookups."""
import pytest

from tracekit.core.cluster import Cluster
from tracekit.core.hardware import cpu_hardware_id, hardware_spec, normalize_hardware
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


def test_specs_by_family():
    assert hardware_spec("A100-SXM4-40GB").mem_bw_gbs == 1555
    assert hardware_spec("A100-PCIE-40GB").name == "A100-SXM4-40GB"
    assert hardware_spec("H100-80GB-HBM3").peak_tflops_fp16 == 989
    assert hardware_spec("B200").name == "B200-180GB"
    assert hardware_spec(cpu_hardware_id()) is None
    assert cpu_hardware_id().startswith("cpu-")


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
