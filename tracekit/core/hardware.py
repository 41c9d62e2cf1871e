"""Hardware ids (one normalized string per device kind) and the datasheet table (`tracekit/data/hardware.json`: peaks,
bandwidths, SM/CU count, L2, clock and the source of each entry). Clusters: `tracekit.core.cluster`."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tracekit.core.data_files import DATA
from tracekit.core.errors import InputError

_VENDOR_WORDS = {"NVIDIA", "TESLA", "AMD", "INSTINCT", "QUADRO", "GEFORCE", "RADEON"}
_FUSED = re.compile(
    r"^(GH200|GB200|GB300|H100|H200|H800|A100|A800|B200|B300|B100|V100|L40S|L4|A10G?|MI\d{3}X?)(\d+GB)$")


#: Device names (as `torch.cuda.get_device_name`, `nvidia-smi` and a trace's `deviceProperties` give them, once
#: normalized) that name one datasheet part exactly, but not in its id's words: the id of its datasheet entry. A name
#: that is absent maps to its normalized self (`NVIDIA H200 NVL` → `H200-NVL`, `NVIDIA H20` → `H20`: other parts).
DEVICE_IDS = {
    "H200": "H200-141GB",  # NVIDIA H200 (SXM, 141 GB HBM3e); the H200 NVL (PCIe) is another part
    "H100-PCIE": "H100-PCIE-80GB",  # NVIDIA H100 PCIe
    "A100-80GB-PCIE": "A100-PCIE-80GB",  # NVIDIA A100 80GB PCIe
    "H800": "H800-80GB-HBM3",  # NVIDIA H800 (SXM5)
    "GH200-480GB": "GH200-120GB",  # NVIDIA GH200 480GB / 120GB / 96GB: the 96 GB HBM3 GH200, named for the Grace
    "GH200-96GB": "GH200-120GB",  # memory beside it (480 or 120 GB LPDDR5X); the 144 GB HBM3e one is another part
    "B200": "B200-180GB",  # NVIDIA B200
    "GB200": "GB200-186GB",  # NVIDIA GB200
    "B300": "B300-288GB",  # NVIDIA B300
    "B300-SXM6-AC": "B300-288GB",  # NVIDIA B300 SXM6 AC
    "GB300": "GB300-288GB",  # NVIDIA GB300
}


def normalize_hardware(name: str) -> str:
    """Normalize a device name from a trace or a sample file into tracekit's hardware id: the id of the part's
    datasheet entry where the name identifies one (`DEVICE_IDS`), else the name's own words.

    >>> normalize_hardware("NVIDIA A100-SXM4-80GB")
    'A100-SXM4-80GB'
    >>> normalize_hardware("NVIDIA H100 80GB HBM3")
    'H100-80GB-HBM3'
    >>> normalize_hardware("NVIDIAGH200120GB")
    'GH200-120GB'
    >>> normalize_hardware("NVIDIA H200")
    'H200-141GB'
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
    joined = re.sub(r"-{2,}", "-", joined) or "unknown"
    return DEVICE_IDS.get(joined, joined)


def _slug(text: str) -> str:
    text = re.sub(r"\(R\)|\(TM\)|CPU|@.*$", "", text, flags=re.I)
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "unknown"


def cpu_hardware_id() -> str:
    """Hardware id of this machine's CPU: `cpu-<vendor>-<line>-<model or generation>` (the rule of
    `tracekit.core.cpu_id`, e.g. `cpu-intel-xeon-platinum-8480c`, `cpu-amd-epyc-genoa`)."""
    from .cpu_id import this_cpu_id

    return this_cpu_id()


@dataclass(frozen=True)
class HardwareSpec:
    """Datasheet figures of one device kind (dense fp16/bf16 and fp8 tensor-core peaks, no sparsity); units in
    `tracekit/data/hardware.json`."""

    name: str
    peak_tflops_fp16: float
    peak_tflops_fp32: float
    mem_bw_gbs: float
    memory_gb: float
    sms: int
    intra_node_gbs: float  # per-GPU unidirectional bandwidth to peers inside a node (NVLink/xGMI)
    inter_node_gbs: float  # per-GPU unidirectional network bandwidth between nodes (typical deployment)
    peak_tflops_fp8: float = 0.0  # dense fp8 tensor-core peak; 0 where the part has no fp8 tensor cores
    l2_mb: float = 0.0
    clock_mhz: float = 0.0
    source: str = ""
    peak_tflops_fp4: float = 0.0  # dense fp4 (nvfp4 / mxfp4) tensor-core peak; 0 where the part has none
    die: str = ""  # the GPU die: parts on one die share operator models (scaled by their peaks)
    host_link_gbs: float = 0.0  # per-GPU unidirectional GPU↔host-memory bandwidth (PCIe, NVLink-C2C); 0: unknown

    def peak_tflops(self, dtype: str) -> float:
        """Dense tensor-core peak (TFLOP/s) for a GEMM input dtype (`PEAK_KIND` names which peak serves it); 0 where
        the part has no tensor cores for it: the microscaled formats (MXFP8, MXFP4) need fp4-generation tensor cores
        (Blackwell, CDNA 4), NVFP4 NVIDIA's."""
        kind = PEAK_KIND.get(dtype, "fp16")
        if dtype in ("mxfp8", "mxfp4", "nvfp4") and not self.peak_tflops_fp4:
            return 0.0
        if dtype == "nvfp4" and self.die.startswith("gfx"):
            return 0.0
        return {"fp32": self.peak_tflops_fp32, "tf32": self.peak_tflops_fp16 / 2.0, "fp16": self.peak_tflops_fp16,
                "fp8": self.peak_tflops_fp8, "fp4": self.peak_tflops_fp4}[kind]

    def gemm_ceiling_tflops(self, dtype: str) -> float:
        """The fastest a GEMM of the input dtype can run on the part: its dtype's dense peak, except that an fp32
        GEMM may run on the TF32 tensor cores (PyTorch's `allow_tf32`, on by default for matmuls before 1.12, and
        cuBLAS's TF32 math mode), so its ceiling is the higher of the fp32 and TF32 peaks."""
        if dtype == "fp32":
            return max(self.peak_tflops("fp32"), self.peak_tflops("tf32"))
        return self.peak_tflops(dtype)


#: Which datasheet peak serves a GEMM of each input dtype: per-tensor fp8 (delayed or current scaling), blockwise
#: fp8 (1×128 / 128×128 scales) and MXFP8 (32-element blocks) run on the fp8 tensor cores; NVFP4 (16-element blocks)
#: and MXFP4 on the fp4 ones; fp32 is the vector peak; TF32 runs at half the fp16 peak, as on every datasheet that
#: lists it (A100 156/312, H100 495/989, B200 1125/2250, MI300X 654/1307).
PEAK_KIND = {"fp32": "fp32", "tf32": "tf32", "fp16": "fp16", "bf16": "fp16", "fp8": "fp8", "fp8_block": "fp8",
             "fp8_row": "fp8", "mxfp8": "fp8", "nvfp4": "fp4", "mxfp4": "fp4"}


DATASHEETS = DATA / "hardware.json"
_REQUIRED = ("id", "peak_tflops_fp16", "peak_tflops_fp32", "mem_bw_gbs", "memory_gb", "sms", "l2_mb", "clock_mhz",
             "intra_node_gbs", "inter_node_gbs", "source")


def load_datasheets(path: Path = DATASHEETS) -> dict[str, HardwareSpec]:
    """The datasheet table (one entry per GPU, each with its source): hardware id → HardwareSpec."""
    import json

    try:
        entries = json.loads(path.read_text())["gpus"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(path, f"unreadable datasheet table ({exc})") from exc
    out: dict[str, HardwareSpec] = {}
    for i, entry in enumerate(entries):
        missing = [k for k in _REQUIRED if not isinstance(entry, dict) or entry.get(k) in (None, "")]
        if missing:
            raise InputError(path, f"entry {i + 1}: missing {', '.join(missing)}")
        out[entry["id"]] = HardwareSpec(
            entry["id"], float(entry["peak_tflops_fp16"]), float(entry["peak_tflops_fp32"]),
            float(entry["mem_bw_gbs"]), float(entry["memory_gb"]), int(entry["sms"]), float(entry["intra_node_gbs"]),
            float(entry["inter_node_gbs"]), float(entry.get("peak_tflops_fp8") or 0.0), float(entry["l2_mb"]),
            float(entry["clock_mhz"]), str(entry["source"]), float(entry.get("peak_tflops_fp4") or 0.0),
            str(entry.get("die") or ""), float(entry.get("host_link_gbs") or 0.0))
    return out


#: Datasheet figures (tracekit/data/hardware.json).
SPECS: dict[str, HardwareSpec] = load_datasheets()

_FAMILY_RULES = (  # (substring tests on the id, spec key); first match wins
    (("GH200",), "GH200-120GB"),
    (("H200",), "H200-141GB"),
    (("H800",), "H800-80GB-HBM3"),
    (("H100", "PCIE"), "H100-PCIE-80GB"),
    (("H100",), "H100-80GB-HBM3"),
    (("GB300",), "GB300-288GB"),
    (("GB200",), "GB200-186GB"),
    (("B300",), "B300-288GB"),
    (("B200",), "B200-180GB"),
    (("A100", "40GB"), "A100-SXM4-40GB"),
    (("A100", "PCIE"), "A100-PCIE-80GB"),
    (("A100",), "A100-SXM4-80GB"),
    (("V100", "16GB"), "V100-SXM2-16GB"),
    (("V100",), "V100-SXM2-32GB"),
    (("MI355",), "MI355X"),
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


#: The architecture of each die: what a part's sustained efficiency under training load is a property of.
ARCHITECTURES = {"GV100": "volta", "GA100": "ampere", "GH100": "hopper", "GB100": "blackwell", "GB110": "blackwell",
                 "gfx90a": "cdna2", "gfx942": "cdna3", "gfx950": "cdna4"}


def architecture(hardware: str) -> str | None:
    """The GPU architecture of a hardware id (`hopper`, `blackwell`, ...), None for a CPU or an unknown part."""
    spec = hardware_spec(hardware)
    return ARCHITECTURES.get(spec.die) if spec is not None else None


def gpu_family(hardware: str) -> str:
    """The GPU family of a hardware id, whose parts share operator models (scaled by their datasheet peaks): the
    model name before the memory size (`A100` for every A100), a Grace-Blackwell superchip's GPU as its Blackwell
    part (`GB200-186GB` → `B200`, `GB300-288GB` → `B300`: one die, another clock)."""
    spec = hardware_spec(hardware)
    name = (spec.name if spec else hardware).split("-")[0].upper()
    return name[1:] if name.startswith("GB") else name

