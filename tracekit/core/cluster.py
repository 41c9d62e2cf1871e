"""Cluster descriptions: the device kind, GPUs per node and the link classes collectives run over.

A cluster is a hardware id plus its links: the per-GPU bandwidth inside a node and its fabric (`nvswitch`: every
GPU reaches every other at full rate; `nvlink`: a point-to-point mesh, a pair gets only its share of the links;
`pcie`; `xgmi`), the per-GPU share of the node's network bandwidth (NICs × NIC rate / GPUs per node), the
latency of one step on each link class, and in-network reduction where the hardware has it (`nvls`: NVSwitch
SHARP on NVLink 4+, `sharp`: InfiniBand SHARP). Bandwidths are unidirectional GB/s (10⁹ bytes/s).

Named presets describe real systems (`PRESETS`; sources in each entry's `source`); `load_cluster` reads one's own
from YAML/JSON with the same keys; `infer_cluster` picks a preset from what a published row or a trace says
(hardware, GPUs per node, interconnect text) and says which it picked.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from tracekit.core.errors import ConfigError, InputError, did_you_mean
from tracekit.core.hardware import hardware_spec, normalize_hardware
from tracekit.core.yaml_file import read_yaml

FABRICS = ("nvswitch", "nvlink", "pcie", "xgmi", "none")
REDUCTIONS = ("none", "nvls", "sharp", "nvls+sharp")


@dataclass(frozen=True)
class Cluster:
    """Where a job runs. Link figures left as None come from the hardware's datasheet entry."""

    hardware: str
    gpus_per_node: int = 8
    nodes: int = 1
    name: str = "custom"
    fabric: str = "nvswitch"
    intra_node_gbs: float | None = None  # per GPU, unidirectional, to peers inside the node
    inter_node_gbs: float | None = None  # per GPU share of the node's NICs, unidirectional
    intra_latency_us: float = 2.0  # one ring step inside a node
    inter_latency_us: float = 8.0  # one ring step across the network
    in_network_reduction: str = "none"
    source: str = ""
    #: GPUs that share one NVLink domain (a rack-scale NVLink switch: 72 in a GB200/GB300 NVL72 rack, whose
    #: compute trays hold 4); None: the node is the domain. Collectives inside it run at the intra-node rate.
    nvlink_domain: int | None = None

    def __post_init__(self) -> None:
        if self.fabric not in FABRICS:
            raise ValueError(f"fabric must be one of {', '.join(FABRICS)}, not {self.fabric!r}")
        if self.in_network_reduction not in REDUCTIONS:
            raise ValueError(f"in_network_reduction must be one of {', '.join(REDUCTIONS)}, "
                             f"not {self.in_network_reduction!r}")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be ≥ 1, not {self.gpus_per_node}")
        if self.nvlink_domain is not None and (self.nvlink_domain < self.gpus_per_node
                                               or self.nvlink_domain % self.gpus_per_node):
            raise ValueError(f"nvlink_domain ({self.nvlink_domain}) must be a multiple of gpus_per_node "
                             f"({self.gpus_per_node})")

    @property
    def domain_size(self) -> int:
        """GPUs reachable over NVLink (or the node's own fabric) from each GPU: the unit a parallel group's
        placement is measured in (`predictor.ir.placement`): a group inside it uses the intra-node links."""
        return self.nvlink_domain or self.gpus_per_node

    def link_gbs(self, crosses_nodes: bool) -> float | None:
        """Per-GPU unidirectional bandwidth of a link class (GB/s); None when neither given nor on a datasheet."""
        spec = hardware_spec(self.hardware)
        if crosses_nodes:
            return self.inter_node_gbs or (spec.inter_node_gbs if spec else None)
        return self.intra_node_gbs or (spec.intra_node_gbs if spec else None)

    def with_hardware(self, hardware: str) -> "Cluster":
        return dataclasses.replace(self, hardware=hardware)

    def fingerprint(self) -> tuple:
        """What a collective estimate depends on (cache key)."""
        return (self.name, self.gpus_per_node, self.domain_size, self.fabric, self.link_gbs(False),
                self.link_gbs(True), self.intra_latency_us, self.inter_latency_us, self.in_network_reduction)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _preset(name: str, hardware: str, gpus_per_node: int, fabric: str, intra: float, nics: int, nic_gbps: float,
            source: str, reduction: str = "none", intra_latency_us: float = 2.0,
            inter_latency_us: float = 8.0, nvlink_domain: int | None = None) -> Cluster:
    return Cluster(hardware, gpus_per_node, 1, name, fabric, intra, nics * nic_gbps / 8 / gpus_per_node,
                   intra_latency_us, inter_latency_us, reduction, source, nvlink_domain)


#: Real systems. Intra-node: NVLink 3 = 12 links × 25 GB/s, NVLink 4 = 18 × 25, NVLink 5 = 18 × 50 per GPU.
PRESETS: dict[str, Cluster] = {c.name: c for c in (
    _preset("dgx-a100", "A100-SXM4-80GB", 8, "nvswitch", 300, 8, 200,
            "NVIDIA DGX A100 datasheet: 8 A100 on 6 NVSwitches (NVLink 3, 600 GB/s bidirectional per GPU), "
            "8 × 200 Gb/s HDR InfiniBand compute NICs"),
    _preset("selene", "A100-SXM4-80GB", 8, "nvswitch", 300, 8, 200,
            "Selene (NVIDIA, DGX A100 SuperPOD): DGX A100 nodes, HDR InfiniBand fat tree (Narayanan et al. 2021)"),
    _preset("dgx-h100", "H100-80GB-HBM3", 8, "nvswitch", 450, 8, 400,
            "NVIDIA DGX H100 datasheet: 8 H100 on 4 NVSwitches (NVLink 4, 900 GB/s bidirectional per GPU, NVLS), "
            "8 × 400 Gb/s NDR ConnectX-7", "nvls"),
    _preset("dgx-b200", "B200-180GB", 8, "nvswitch", 900, 8, 400,
            "NVIDIA DGX B200 datasheet: NVLink 5 (1.8 TB/s bidirectional per GPU), 8 × 400 Gb/s ConnectX-7", "nvls"),
    _preset("dgx-b300", "B300-288GB", 8, "nvswitch", 900, 8, 800,
            "NVIDIA DGX B300 / HGX B300 datasheets: NVLink 5 (1.8 TB/s bidirectional per GPU), 8 × 800 Gb/s "
            "ConnectX-8 SuperNICs", "nvls"),
    _preset("gb200-nvl72", "GB200-186GB", 4, "nvswitch", 900, 4, 400,
            "NVIDIA GB200 NVL72 datasheet: 18 compute trays of 4 GPUs in one NVLink 5 domain of 72 GPUs (1.8 TB/s "
            "bidirectional per GPU, NVLink Switch trays with SHARP), one ConnectX-7 400 Gb/s NIC per GPU between "
            "racks (Megatron-Bridge runs it with USE_MNNVL=1, NVLINK_DOMAIN_SIZE=72)", "nvls", nvlink_domain=72),
    _preset("gb300-nvl72", "GB300-288GB", 4, "nvswitch", 900, 4, 800,
            "NVIDIA GB300 NVL72 datasheet: 18 compute trays of 4 Blackwell Ultra GPUs in one NVLink 5 domain of 72 "
            "GPUs (1.8 TB/s bidirectional per GPU), one ConnectX-8 800 Gb/s SuperNIC per GPU between racks", "nvls",
            nvlink_domain=72),
    _preset("perlmutter", "A100-SXM4-80GB", 4, "nvlink", 300, 4, 200,
            "NERSC Perlmutter GPU node: 4 A100 fully connected by NVLink 3 (4 links per pair), 4 × 200 Gb/s "
            "Slingshot 11 NICs (the seed paper's A100 samples)"),
    _preset("vista", "GH200-120GB", 1, "none", 450, 1, 400,
            "TACC Vista: one GH200 per node, one 400 Gb/s NDR InfiniBand NIC (the seed paper's GH200 samples)"),
    _preset("mi300x", "MI300X", 8, "xgmi", 448, 8, 400,
            "AMD Instinct MI300X platform: 8 GPUs fully connected by Infinity Fabric (7 × 64 GB/s), "
            "8 × 400 Gb/s NICs"),
    _preset("mi355x", "MI355X", 8, "xgmi", 538, 8, 400,
            "AMD Instinct MI355X platform: 8 GPUs fully connected by Infinity Fabric (7 × 76.8 GB/s), "
            "8 × 400 Gb/s NICs"),
    _preset("pcie", "A100-PCIE-80GB", 8, "pcie", 25, 2, 100,
            "a generic PCIe 4.0 node: GPUs behind PCIe switches (~25 GB/s per GPU), 2 × 100 Gb/s NICs"),
)}
ALIASES = {"dgx-a100-superpod": "selene", "dgxa100": "dgx-a100", "dgxh100": "dgx-h100", "eos": "dgx-h100",
           "nvl72": "gb200-nvl72", "gb200": "gb200-nvl72", "gb300": "gb300-nvl72", "dgx-gb200": "gb200-nvl72",
           "dgx-gb300": "gb300-nvl72"}
#: Clusters of hosts without GPUs: the collectives of a CPU run go over the host's loopback or its network.
LOCAL = "local"


def preset(name: str, hardware: str | None = None, gpus_per_node: int | None = None) -> Cluster:
    """A named preset (case-insensitive), optionally with another hardware id or node size; ConfigError naming the
    known ones."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in PRESETS:
        raise ConfigError(f"unknown cluster {name!r}{did_you_mean(key, PRESETS)}; presets: {', '.join(PRESETS)}")
    found = PRESETS[key]
    if hardware:
        found = found.with_hardware(hardware)
    if gpus_per_node and gpus_per_node != found.gpus_per_node:
        domain = found.nvlink_domain
        if domain is not None and domain % gpus_per_node:
            domain = None  # trays of another size: the rack-scale domain no longer applies
        found = dataclasses.replace(found, gpus_per_node=gpus_per_node, nvlink_domain=domain)
    return found


def load_cluster(path: str | Path, hardware: str | None = None, gpus_per_node: int | None = None) -> Cluster:
    """A cluster file (YAML/JSON mapping with Cluster's keys; `preset: NAME` starts from a preset)."""
    path = Path(path)
    data = read_yaml(path, "YAML/JSON")
    if not isinstance(data, dict):
        raise InputError(path, "a cluster file is a mapping (hardware, gpus_per_node, fabric, intra_node_gbs, ...)")
    allowed = {f.name for f in dataclasses.fields(Cluster)} | {"preset"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise InputError(path, f"unknown key(s) {unknown}{did_you_mean(unknown[0], sorted(allowed))}; "
                               f"allowed: {sorted(allowed)}")
    try:
        base = preset(str(data.pop("preset"))).to_dict() if "preset" in data else {"name": path.stem}
        base.update(data)
        if hardware:
            base["hardware"] = hardware
        if gpus_per_node:
            base["gpus_per_node"] = gpus_per_node
        if "hardware" not in base:
            raise ValueError("no `hardware` (or `preset`)")
        base["hardware"] = normalize_hardware(str(base["hardware"]))
        return Cluster(**base)
    except (TypeError, ValueError, ConfigError) as exc:
        raise InputError(path, str(exc)) from exc


def default_cluster(hardware: str, gpus_per_node: int | None = None) -> tuple[Cluster, str]:
    """The preset a GPU usually sits in (an 8-GPU NVSwitch node for SXM parts), with a note saying so. A CPU id
    gets the `local` cluster; an unknown GPU a generic 8-GPU node with its datasheet links."""
    if hardware.startswith("cpu-"):
        return Cluster(hardware, gpus_per_node or 1, name=LOCAL, fabric="none"), ""
    upper = hardware.upper()
    if "PCIE" in upper:
        name = "pcie"
    elif "GH200" in upper:
        name = "vista"
    elif "GB200" in upper:
        name = "gb200-nvl72"
    elif "GB300" in upper:
        name = "gb300-nvl72"
    elif "H100" in upper or "H200" in upper or "H800" in upper:
        name = "dgx-h100"
    elif "B300" in upper:
        name = "dgx-b300"
    elif "B200" in upper:
        name = "dgx-b200"
    elif "MI300" in upper:
        name = "mi300x"
    elif "MI355" in upper:
        name = "mi355x"
    elif "A100" in upper or "A800" in upper:
        name = "perlmutter" if gpus_per_node == 4 else "dgx-a100"
    else:
        name = ""
    if not name:
        spec = hardware_spec(hardware)
        return Cluster(hardware, gpus_per_node or 8, name="generic",
                       intra_node_gbs=spec.intra_node_gbs if spec else None,
                       inter_node_gbs=spec.inter_node_gbs if spec else None), \
            f"no cluster preset for {hardware}: datasheet links, 8 GPUs per node"
    found = preset(name, hardware, gpus_per_node)
    if found.gpus_per_node != PRESETS[name].gpus_per_node:
        found = dataclasses.replace(found, name=f"{name}-like")
    return found, f"cluster {found.name} assumed ({found.gpus_per_node} GPUs per node, {found.fabric})"


_INTERCONNECT_HINTS = (
    (re.compile(r"selene", re.I), "selene"),
    (re.compile(r"perlmutter", re.I), "perlmutter"),
    (re.compile(r"vista", re.I), "vista"),
    (re.compile(r"\bdgx[- ]?h100|\beos\b", re.I), "dgx-h100"),
    (re.compile(r"\bdgx[- ]?a100", re.I), "dgx-a100"),
    (re.compile(r"\bdgx[- ]?b200", re.I), "dgx-b200"),
    (re.compile(r"\bdgx[- ]?b300|\bhgx[- ]?b300", re.I), "dgx-b300"),
)
#: A rack-scale NVLink domain named in a row's text (`GB200 NVL72`, `NVLINK_DOMAIN_SIZE=72`, `USE_MNNVL=1`).
_NVL_DOMAIN = re.compile(r"NVLINK_DOMAIN_SIZE\s*=\s*(\d+)|\bNVL(\d+)\b|USE_MNNVL\s*=\s*1", re.I)


_NETWORK_FIGURE = re.compile(r"inter[- ]?node\D{0,20}?([0-9]+(?:\.[0-9]+)?)\s*(gbps|gb/s|gbit/s)(\s*per\s*gpu)?",
                             re.I)


def stated_network_gbs(text: str, gpus_per_node: int) -> float | None:
    """Per-GPU network bandwidth (GB/s) from a stated figure such as `inter-node 800 Gbps` (a node's injection
    bandwidth unless followed by `per GPU`; `Gbps`/`Gb/s` are bits, `GB/s` bytes); None when none is stated."""
    found = _NETWORK_FIGURE.search(text or "")
    if not found:
        return None
    value = float(found.group(1))
    unit = found.group(2)
    gbs = value if unit == "GB/s" else value / 8  # the unit's case tells bytes (GB/s) from bits (Gb/s, Gbps)
    return gbs if found.group(3) else gbs / max(gpus_per_node, 1)


def infer_cluster(hardware: str, gpus_per_node: int | None = None, text: str = "") -> tuple[Cluster, str]:
    """The cluster a published row describes: a system named in its text (`Selene`, `Perlmutter`, ...), else the
    usual node of its GPU (`default_cluster`); a network figure the text states (`inter-node 800 Gbps`) replaces
    the preset's. Intra-node links come with the GPU part (an SXM A100 has NVLink 3 whatever the text assumes), so
    the datasheet rate stays. Returns the cluster and a note saying what was assumed."""
    note = ""
    for pattern, name in _INTERCONNECT_HINTS:
        if pattern.search(text or ""):
            cluster = preset(name, hardware, gpus_per_node)
            break
    else:
        cluster, note = default_cluster(hardware, gpus_per_node)
        if re.search(r"pcie", text or "", re.I) and cluster.fabric != "pcie":
            cluster = preset("pcie", hardware, gpus_per_node)
            note = f"cluster pcie assumed from the interconnect text ({cluster.gpus_per_node} GPUs per node)"
    domain = _NVL_DOMAIN.search(text or "")
    if domain and cluster.fabric == "nvswitch":
        size = int(domain.group(1) or domain.group(2) or 72)
        if size != cluster.domain_size and size % cluster.gpus_per_node == 0:
            cluster = dataclasses.replace(cluster, nvlink_domain=size, name=f"{cluster.name}+nvl{size}")
            note = "; ".join(filter(None, [note, f"one NVLink domain of {size} GPUs from the interconnect text"]))
    network = stated_network_gbs(text, cluster.gpus_per_node)
    if network:
        cluster = dataclasses.replace(cluster, inter_node_gbs=network, name=f"{cluster.name}+stated-network")
        note = "; ".join(filter(None, [note, f"network {network:g} GB/s per GPU from the interconnect text"]))
    return cluster, note
