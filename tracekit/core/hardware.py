"""Hardware ids (one normalized string per device kind) and datasheet peak rates (clusters: `tracekit.core.cluster`)."""
from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from pathlib import Path

_VENDOR_WORDS = {"NVIDIA", "TESLA", "AMD", "INSTINCT", "QUADRO", "GEFORCE", "RADEON"}
_FUSED = re.compile(r"^(GH200|GB200|H100|H200|H800|A100|A800|B200|B100|V100|L40S|L4|A10G?|MI\d{3}X?)(\d+GB)$")


def normalize_hardware(name: str) -> str:
    """Normalize a device name from a trace or a sample file into tracekit's hardware id.

    >>> normalize_hardware("NVIDIA A100-SXM4-80GB")
    'A100-SXM4-80GB'
    >>> normalize_hardware("NVIDIA H100 80GB HBM3")
    'H100-80GB-HBM3'
    >>> normalize_hardware("NVIDIAGH200120GB")
    'GH200-120GB'
    """
    text = (name or "").strip()
    if not text:
        return "unknown"
    if text.lower().startswith("cpu-"):
        return "cpu-" + _slug(text[4:])
    upper = text.upper()
    for word in ("NVIDIA", "AMD"):  # sample file names glue the vendor to the model: NVIDIAA100-SXM4-80GB
        if upper.startswith(word) and not upper.startswith(word + " ") and len(upper) > len(word) + 1:
            upper = upper[len(word):]
    words = [w for w in re.split(r"[\s_/]+", upper) if w and w not in _VENDOR_WORDS]
    joined = "-".join(words)
    fused = _FUSED.match(joined)
    if fused:
        joined = f"{fused.group(1)}-{fused.group(2)}"
    return re.sub(r"-{2,}", "-", joined) or "unknown"


def _slug(text: str) -> str:
    text = re.sub(r"\(R\)|\(TM\)|CPU|@.*$", "", text, flags=re.I)
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "unknown"


def cpu_hardware_id() -> str:
    """Hardware id of this machine's CPU: `cpu-<model>`."""
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1]
                break
    return "cpu-" + _slug(model or platform.processor() or platform.machine())


@dataclass(frozen=True)
class HardwareSpec:
    """Datasheet figures of one device kind (dense fp16/bf16 and fp8 tensor-core peaks, no sparsity)."""

    name: str
    peak_tflops_fp16: float
    peak_tflops_fp32: float
    mem_bw_gbs: float
    memory_gb: float
    sms: int
    intra_node_gbs: float  # per-GPU unidirectional bandwidth to peers inside a node (NVLink/xGMI)
    inter_node_gbs: float  # per-GPU unidirectional network bandwidth between nodes (typical deployment)
    peak_tflops_fp8: float = 0.0  # dense fp8 tensor-core peak; 0 where the part has no fp8 tensor cores


#: Datasheet figures. Inter-node: one 200 Gb/s NIC per GPU unless the system is known to differ.
SPECS: dict[str, HardwareSpec] = {
    "V100-SXM2-16GB": HardwareSpec("V100-SXM2-16GB", 125, 15.7, 900, 16, 80, 150, 12.5),
    "V100-SXM2-32GB": HardwareSpec("V100-SXM2-32GB", 125, 15.7, 900, 32, 80, 150, 12.5),
    "A100-SXM4-40GB": HardwareSpec("A100-SXM4-40GB", 312, 19.5, 1555, 40, 108, 300, 25),
    "A100-SXM4-80GB": HardwareSpec("A100-SXM4-80GB", 312, 19.5, 2039, 80, 108, 300, 25),
    "A100-PCIE-80GB": HardwareSpec("A100-PCIE-80GB", 312, 19.5, 1935, 80, 108, 32, 12.5),
    "H100-80GB-HBM3": HardwareSpec("H100-80GB-HBM3", 989, 67, 3350, 80, 132, 450, 50, 1979),
    "H100-PCIE-80GB": HardwareSpec("H100-PCIE-80GB", 756, 51, 2000, 80, 114, 64, 25, 1513),
    "H800-80GB-HBM3": HardwareSpec("H800-80GB-HBM3", 989, 67, 3350, 80, 132, 200, 50, 1979),
    "H200-141GB": HardwareSpec("H200-141GB", 989, 67, 4800, 141, 132, 450, 50, 1979),
    # GH200 nodes ship with one 400 Gb/s NIC per superchip (TACC Vista: NDR400; its all-reduces reach 48 GB/s).
    "GH200-120GB": HardwareSpec("GH200-120GB", 989, 67, 4000, 96, 132, 450, 50, 1979),
    "B200-180GB": HardwareSpec("B200-180GB", 2250, 80, 8000, 180, 148, 900, 50, 4500),
    "MI250X": HardwareSpec("MI250X", 383, 47.9, 3277, 128, 220, 200, 25),
    "MI300X": HardwareSpec("MI300X", 1307, 163, 5300, 192, 304, 448, 50, 2615),
}

_FAMILY_RULES = (  # (substring tests on the id, spec key); first match wins
    (("GH200",), "GH200-120GB"),
    (("H200",), "H200-141GB"),
    (("H800",), "H800-80GB-HBM3"),
    (("H100", "PCIE"), "H100-PCIE-80GB"),
    (("H100",), "H100-80GB-HBM3"),
    (("B200",), "B200-180GB"),
    (("A100", "40GB"), "A100-SXM4-40GB"),
    (("A100", "PCIE"), "A100-PCIE-80GB"),
    (("A100",), "A100-SXM4-80GB"),
    (("V100", "16GB"), "V100-SXM2-16GB"),
    (("V100",), "V100-SXM2-32GB"),
    (("MI300",), "MI300X"),
    (("MI250",), "MI250X"),
)


def hardware_spec(hardware: str) -> HardwareSpec | None:
    """Datasheet spec for a hardware id (exact id first, then its family); None when unknown or a CPU."""
    if hardware in SPECS:
        return SPECS[hardware]
    upper = hardware.upper()
    for needles, key in _FAMILY_RULES:
        if all(n in upper for n in needles):
            return SPECS[key]
    return None
