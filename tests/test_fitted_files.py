"""The shipped fitted numbers are what `make profiles` (tools/fit_profiles.py) makes from this tree (#36).

The fit itself takes minutes (tools/fit_profiles.py says how long), so the suite does not rerun it: it checks the
manifest the command wrote (tracekit/data/fitted.json) against the tree — every code, data and corpus file the fits
read, by digest, and every fitted file as written. The check is exercised on a copy of the tree, where an edited
constant, an edited line of predictor code and a new data file must each be caught, and a reworded comment must not.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from predictor.costs.physics import sustained_gemm
from tests.conftest import ROOT
from tools import profile_fingerprint as fp

#: The part whose ceiling a doc quotes as "the A100's" or "Hopper's" sustained GEMM ceiling.
CEILING_PART = {"A100": "A100-SXM4-80GB", "Hopper": "H100-80GB-HBM3"}

REMEDY = (f"run `{fp.COMMAND}` (tools/fit_profiles.py: about 3 minutes of CPU, each stage in a fresh process) and "
          "commit the files it rewrites (tracekit/data/fitted.json lists them)")


def test_the_shipped_fitted_files_are_what_make_profiles_makes(corpus):
    found = fp.problems()
    assert not found, ("the shipped fitted numbers may not be what the fit makes from this tree:\n  "
                       + "\n  ".join(found) + f"\n{REMEDY}")


def test_every_fitted_number_of_a_stack_profile_is_written_by_the_command():
    """A stack profile with constants or scales of its own is one the command writes (and records the rows it was
    fitted on and its held-out score): no number is shipped by hand."""
    for path in sorted((ROOT / "tracekit" / "data" / "stacks").glob("*.json")):
        doc = json.loads(path.read_text())
        fitted = [k for k in ("constants", "host_scale", "device_scale") if doc.get(k)]
        if not fitted:
            continue
        rel = path.relative_to(ROOT).as_posix()
        assert rel in fp.OUTPUTS, f"{rel} ships {fitted} that `make profiles` does not write"
        blocks = [doc[k] for k in ("fit", "device_fit") if k in doc]
        assert blocks and all(b["rows"]["file"].startswith("e2e/") and b["rows"]["rows"] > 0 for b in blocks), rel
        assert all(0 < b["held_out"]["mape"] < 1 and b["held_out"]["how"] for b in blocks), rel


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of what the check reads: tracekit/data and the code files the manifest lists."""
    shutil.copytree(ROOT / "tracekit" / "data", tmp_path / "tracekit" / "data")
    for rel in json.loads(fp.MANIFEST.read_text())["inputs"]["code"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


def test_the_check_catches_an_edited_constant_code_change_and_new_data_but_not_a_comment(tree, corpus):
    assert fp.problems(tree) == fp.problems()  # the copy is checked as the tree is
    before = set(fp.problems(tree))

    module = tree / "predictor" / "costs" / "physics" / "transfer.py"
    module.write_text(module.read_text().replace("DISTANCE_FLOOR = 0.05", "DISTANCE_FLOOR = 0.05  # reworded note"))
    assert set(fp.problems(tree)) == before
    module.write_text(module.read_text().replace("DISTANCE_FLOOR = 0.05", "DISTANCE_FLOOR = 0.06"))
    assert any("predictor/costs/physics/transfer.py (edited)" in p for p in fp.problems(tree))

    profile = tree / "tracekit" / "data" / "stacks" / "megatron-deepspeed-2023.json"
    doc = json.loads(profile.read_text())
    doc["constants"]["host_op_us"] += 1.0
    profile.write_text(json.dumps(doc))
    assert any(p.startswith("tracekit/data/stacks/megatron-deepspeed-2023.json is not the file the fit wrote")
               for p in fp.problems(tree))

    (tree / "tracekit" / "data" / "stacks" / "new-stack.json").write_text("{}")
    assert any("tracekit/data/stacks/new-stack.json (added)" in p for p in fp.problems(tree))


def test_code_text_keeps_code_and_drops_wording():
    source = '"""Module doc."""\nX = 1  # why\n\n\ndef f():\n    """Doc\n    on two lines."""\n    return X\n'
    assert fp.code_text(source) == "X = 1\ndef f():\n    return X"
    assert fp.code_text(source.replace("return X", "return X + 1")) != fp.code_text(source)


def test_the_docs_quote_the_shipped_fitted_numbers():
    """Where the docs quote a shipped fitted number as today's (Megatron-Bridge's device scales as `Blackwell ×1.39`,
    megatron-core's host constants as `… µs per operator, … ms per call, … µs per parameter tensor`, a sustained GEMM
    ceiling as `the A100's sustained GEMM ceiling (233 TFLOP/s`), it is the
    number the shipped profile holds, rounded as written: the docs once printed a figure the CLI no longer gave.
    History (a scale before a change) is written without the ×."""
    import re

    stacks = ROOT / "tracekit" / "data" / "stacks"
    scales = json.loads((stacks / "megatron-bridge.json").read_text())["device_scale"]
    host = json.loads((stacks / "megatron-core.json").read_text())["constants"]
    ceilings = sustained_gemm.ceilings()
    docs = {p.relative_to(ROOT).as_posix(): p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]}
    quoted = 0
    for name, text in docs.items():
        for arch, value in re.findall(r"\b(Hopper|Blackwell) ×(\d+\.\d+)", text):
            quoted += 1
            digits = len(value.split(".")[1])
            assert arch.lower() in scales, (name, arch, value, "quoted as today's; the profile has no such scale")
            assert float(value) == round(scales[arch.lower()], digits), (name, arch, value, scales)
        number = r"(\d+(?:\.\d+)?)"
        sentence = rf"{number} µs per operator, {number} ms per call, {number} µs per parameter tensor"
        for op_us, call_ms, tensor_us in re.findall(sentence, text):
            quoted += 1
            for written, shipped in ((op_us, host["host_op_us"]), (call_ms, host["microbatch_overhead_us"] / 1e3),
                                     (tensor_us, host["tensor_op_us"])):
                digits = len(written.split(".")[1]) if "." in written else 0
                assert float(written) == round(shipped, digits), (name, written, shipped)
        # the sustained GEMM ceilings, quoted as today's as "the A100's sustained GEMM ceiling (233 TFLOP/s"
        for part, value in re.findall(r"\b(A100|Hopper)'s sustained GEMM ceiling \((\d+) TFLOP/s", text):
            quoted += 1
            assert float(value) == ceilings[CEILING_PART[part]]["bf16"], (name, part, value)
    assert quoted >= 6
