"""Property-based tests (hypothesis) on mutated real inputs: the trace reader, the e2e CSV reader and the config
parser answer any mutation with a result or one of tracekit's one-line errors — never a traceback. Bounded (tens of
examples each, derandomized) so the suite stays fast and every run tries the same inputs."""
from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from extractors.jobs.rows import parse_row
from extractors.kineto import read_trace, trace_samples
from tests.conftest import E2E
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import TracekitError

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "kineto" / "dlrm_8rank" / "worker0_step_12.1694128201545.pt.trace.json.gz"
CONFIG = yaml.safe_load((ROOT / "traces" / "configs" / "llemma-7b-a100.yaml").read_text())
with open(E2E / "narayanan2021_table1_a100_selene.csv", newline="") as fh:
    ROWS = list(csv.DictReader(fh))
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
NASTY = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                  st.text(max_size=12), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4),
                                                                                            st.integers(), max_size=2))


def _clean(call) -> None:
    try:
        call()
    except TracekitError as exc:
        assert "\n" not in str(exc).strip() and str(exc).strip()


@SETTINGS
@given(cut=st.integers(0, 100), events=st.lists(st.tuples(st.integers(0, 10**6), st.text(max_size=10), NASTY),
                                                max_size=6), drop=st.sampled_from([None, "traceEvents",
                                                                                   "deviceProperties",
                                                                                   "distributedInfo"]))
def test_trace_reader_mutations(tmp_path_factory, cut, events, drop):
    doc = json.loads(gzip.decompress(TRACE.read_bytes()))
    if drop:
        doc.pop(drop, None)
    trace_events = doc.get("traceEvents") or []
    for index, key, value in events:  # overwrite or add a field of some event with anything
        if trace_events:
            event = trace_events[index % len(trace_events)]
            event[key or "ts"] = value
    raw = json.dumps(doc).encode()
    path = tmp_path_factory.mktemp("fuzz") / "mutated.pt.trace.json"
    path.write_bytes(raw[: max(1, len(raw) * cut // 100)] if cut < 100 else raw)

    def read() -> None:
        trace = read_trace(path)
        trace_samples(trace, "fuzz")

    _clean(read)


@SETTINGS
@given(row=st.integers(0, len(ROWS) - 1),
       cells=st.dictionaries(st.sampled_from(sorted(ROWS[0])), st.text(max_size=16), max_size=5))
def test_e2e_row_reader_mutations(row, cells):
    parsed = parse_row(dict(ROWS[row], **cells), 2, None, None)  # never raises: a bad row carries its error
    assert (parsed.error is None) == (parsed.config is not None)
    if parsed.error:
        assert "\n" not in parsed.error


@SETTINGS
@given(changes=st.dictionaries(st.sampled_from(sorted(CONFIG) + ["micro_bach_size", "tp", "pp", "dp", "vp",
                                                                  "num_gpus", "precision", "fp8_format"]),
                               NASTY, max_size=4),
       drop=st.lists(st.sampled_from(sorted(CONFIG)), max_size=2))
def test_config_parser_mutations(changes, drop):
    mapping = {k: v for k, v in CONFIG.items() if k not in drop}
    mapping.update(changes)
    _clean(lambda: TrainingConfig.from_mapping(mapping, strict=True).validate())
