"""The hardware id of a CPU, `cpu-<vendor>-<line>-<model>`: which CPU it is, readable, stable across its machines.

The rule, from the kernel's description of the CPU (`/proc/cpuinfo`'s first processor):

- the model name without its trademarks, "CPU"/"Processor", core count and clock: `AMD EPYC 9654 96-Core Processor`
  → `cpu-amd-epyc-9654`, `Intel(R) Xeon(R) Platinum 8480C CPU @ 2.00GHz` → `cpu-intel-xeon-platinum-8480c`;
- a model name that says no more than the vendor and the product line (a virtual machine's `AMD EPYC`, `Intel Xeon
  Processor`, `Intel(R) Xeon(R) CPU @ 2.20GHz`) takes the generation that the CPUID family and model numbers name
  (Intel's and AMD's published tables, `GENERATIONS`): `cpu-amd-epyc-genoa`, `cpu-intel-xeon-sapphire-rapids`; one
  not in the table takes the numbers themselves (`cpu-intel-xeon-family6-model190`);
- an Arm CPU (no model name) is its core, from the implementer and part numbers: `cpu-arm-neoverse-v2` (Grace,
  Graviton 4).

The core count is not part of the id: a CPU of 2 and one of 96 cores time an operator on one thread alike, and the
samples record the ranks and threads they ran with.

The earlier rule (the model name's slug alone: `cpu-amd-epyc`, `cpu-intel-xeon-processor`) named stores, models and
traces made before; `cpu_ids()` gives both names of this machine's CPU, and `same_cpu` finds the one a model set
holds, so models made under the earlier id still answer for this CPU.
"""
from __future__ import annotations

import platform
import re
from pathlib import Path
from typing import Collection

#: CPUID (vendor, family, model) → generation, from Intel's "Intel Architecture and Processor Identification with
#: CPUID Model and Family Numbers" and AMD's processor programming references (server parts and the client parts
#: clouds rent). Intel's family 6 model 85 is three generations told apart by the stepping (`_STEPPED`).
GENERATIONS: dict[tuple[str, int, int], str] = {
    ("intel", 6, 63): "haswell", ("intel", 6, 79): "broadwell", ("intel", 6, 86): "broadwell",
    ("intel", 6, 106): "ice-lake", ("intel", 6, 108): "ice-lake", ("intel", 6, 143): "sapphire-rapids",
    ("intel", 6, 207): "emerald-rapids", ("intel", 6, 173): "granite-rapids", ("intel", 6, 175): "sierra-forest",
    ("intel", 6, 158): "coffee-lake", ("intel", 6, 151): "alder-lake", ("intel", 6, 183): "raptor-lake",
    ("amd", 23, 1): "naples", ("amd", 23, 49): "rome", ("amd", 23, 113): "matisse",
    ("amd", 25, 1): "milan", ("amd", 25, 17): "genoa", ("amd", 25, 160): "bergamo", ("amd", 25, 33): "vermeer",
    ("amd", 26, 2): "turin", ("amd", 26, 17): "turin-dense",
}
#: Intel family 6 model 85: Skylake-SP up to stepping 4, Cascade Lake 5–7, Cooper Lake 10–11.
_STEPPED = ((4, "skylake"), (7, "cascade-lake"), (11, "cooper-lake"))
#: Arm (implementer, part) → core, from Arm's technical reference manuals (MIDR_EL1 values).
ARM_CORES: dict[tuple[int, int], str] = {
    (0x41, 0xD08): "arm-cortex-a72", (0x41, 0xD0B): "arm-cortex-a76", (0x41, 0xD0C): "arm-neoverse-n1",
    (0x41, 0xD40): "arm-neoverse-v1", (0x41, 0xD49): "arm-neoverse-n2", (0x41, 0xD4F): "arm-neoverse-v2",
    (0x41, 0xD8E): "arm-neoverse-n3", (0x41, 0xD84): "arm-neoverse-v3", (0xC0, 0xAC3): "ampere-ampereone",
}
#: Words of a model name that say only the vendor or the product line (and a hypervisor's generic names).
_LINES = ("intel", "amd", "xeon", "epyc", "core", "ryzen")
LINE_WORDS = {*_LINES, "genuine", "authentic", "virtual", "common", "kvm", "qemu", "version"}
_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}


def cpu_id(cpuinfo: str, machine: str = "", processor: str = "") -> str:
    """The hardware id of the CPU that `cpuinfo` (the text of /proc/cpuinfo, its first processor is read)
    describes; `machine` and `processor` (platform's) serve where it says nothing."""
    fields = _first_processor(cpuinfo)
    name = _clean(fields.get("model name", ""))
    words = [] if re.match(r"(qemu|common-kvm)\b", name) else [w for w in name.split("-") if w]
    if set(words) - LINE_WORDS:
        return "cpu-" + name  # the model name says which CPU
    arm = _arm_core(fields)
    if arm:
        return "cpu-" + arm
    line = [w for w in words if w in _LINES]
    vendor = _VENDORS.get(fields.get("vendor_id", ""), "")
    if vendor and line[:1] != [vendor]:
        line.insert(0, vendor)
    generation = _generation(vendor, fields)
    if line:
        return "-".join(["cpu", *line, *([generation] if generation else [])])
    return "cpu-" + (_clean(processor) or _clean(machine) or "unknown")


def legacy_cpu_id(cpuinfo: str, machine: str = "", processor: str = "") -> str:
    """The id the earlier rule gave the CPU: the slug of its model name (or of platform's processor or machine)."""
    model = _first_processor(cpuinfo).get("model name", "")
    text = re.sub(r"\(R\)|\(TM\)|CPU|@.*$", "", model or processor or machine, flags=re.I)
    return "cpu-" + (re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "unknown")


def machine_description() -> tuple[str, str, str]:
    """What this machine says of its CPU: (the text of /proc/cpuinfo or '', platform's machine, processor)."""
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text(errors="replace") if cpuinfo.exists() else ""
    return text, platform.machine(), platform.processor()


def this_cpu_id() -> str:
    """This machine's CPU id (the rule above)."""
    return cpu_id(*machine_description())


def cpu_ids() -> tuple[str, ...]:
    """The ids this machine's CPU goes by: this rule's first, then the earlier rule's where it differs."""
    text = machine_description()
    current, legacy = cpu_id(*text), legacy_cpu_id(*text)
    return (current,) if legacy == current else (current, legacy)


def same_cpu(hardware: str, available: Collection[str]) -> str | None:
    """The id in `available` that names the same CPU as `hardware` under the other rule (this machine's CPU only:
    the ids of another machine's CPU cannot be told apart), None when there is none."""
    if not hardware.startswith("cpu-") or hardware in available:
        return None
    names = cpu_ids()
    if hardware not in names:
        return None
    return next((other for other in names if other != hardware and other in available), None)


def _first_processor(cpuinfo: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    return fields


def _clean(name: str) -> str:
    """A model name as id words: trademarks, "CPU", "Processor", the core count and the clock left out."""
    text = re.sub(r"\((R|TM)\)|@.*$|\b\d+-Core\b|\bCPU\b|\bProcessor\b", " ", name, flags=re.I)
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def _number(text: str | None) -> int | None:
    try:
        return int(str(text), 0)
    except (TypeError, ValueError):
        return None


def _generation(vendor: str, fields: dict[str, str]) -> str:
    family, model = _number(fields.get("cpu family")), _number(fields.get("model"))
    if not vendor or family is None or model is None:
        return ""
    if (vendor, family, model) == ("intel", 6, 85):
        stepping = _number(fields.get("stepping")) or 0
        return next((name for last, name in _STEPPED if stepping <= last), f"family6-model85-stepping{stepping}")
    return GENERATIONS.get((vendor, family, model), f"family{family}-model{model}")


def _arm_core(fields: dict[str, str]) -> str:
    implementer, part = _number(fields.get("cpu implementer")), _number(fields.get("cpu part"))
    if implementer is None or part is None:
        return ""
    return ARM_CORES.get((implementer, part), f"arm-implementer{implementer:x}-part{part:x}")
