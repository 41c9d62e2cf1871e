"""`tracekit ingest` starts without pandas (its import alone is about the time of a small folder's ingest), without
pyarrow.compute and numpy.ma (~70 and ~20 ms), without pydantic (typer >= 0.25's parameter coercion imports it and
builds an adapter per parameter: ~0.19 s; pyproject keeps typer below 0.25) and, under --json (no table printed, no
bar drawn), without rich; the Arrow arrays it builds from buffers instead of pyarrow's converters are the ones those
converters make, the codes it reads from them are pyarrow's dictionary encoding, and the store gives back what it was
given."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from extractors.kineto.ingest import sample_table
from extractors.kineto.sets import distinct, members
from extractors.kineto.trace import read_trace
from tests.conftest import KINETO
from tracekit.core.arrow_arrays import float64_array, holds_only, int64_array, string_array, string_codes
from tracekit.core.store import SampleStore

#: A training step on MI300X: backward rows linked to their forward ops (roles, some null), dtypes partly null.
RESNET = KINETO / "tracelens" / "mi300__ddp_resnet18_no_pool__train_resnet18.json.gz"
#: One inference-only trace on another GPU (other hardware, other primitives).
BERT = KINETO / "tracelens" / "h100__gaunernst_bert-small-uncased__1016001.json.gz"

RUN = """
import json, sys
from tracekit.cli import main
sys.argv = ["tracekit", "ingest", *sys.argv[1:]]
code = None
try:
    main()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"pandas": "pandas" in sys.modules, "rich": sorted(m for m in sys.modules if m.startswith("rich")),
                  "slow": sorted(m for m in ("pyarrow.compute", "numpy.ma", "pydantic") if m in sys.modules),
                  "exit": code}),
      file=sys.stderr)
"""


def test_ingest_command_never_imports_pandas_pyarrow_compute_numpy_ma_pydantic_nor_rich_under_json(tmp_path):
    # the 8 ranks of one job (forked workers, collectives matched), a CPU-only trace and a GPU training step (backward
    # kernels linked to their ops), into one store
    run = [str(KINETO / "param" / "dlrm_8rank"),
           str(KINETO / "hta" / "cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"), str(RESNET)]
    done = subprocess.run([sys.executable, "-c", RUN, *run, "--store", str(tmp_path / "s"), "--json"],
                          capture_output=True, text=True, timeout=300)
    report = json.loads(done.stdout)
    assert len(report["traces"]) == 10 and not report["errors"]
    assert json.loads(done.stderr.strip().splitlines()[-1]) == {"pandas": False, "rich": [], "slow": [], "exit": 0}
    stored = SampleStore(tmp_path / "s")
    assert len(stored.read()) == sum(trace["samples_written"] for trace in report["traces"]) > 0


def test_arrays_from_buffers_equal_pyarrows_conversion():
    floats = np.array([1.5, np.nan, -0.0, 1e300, np.nan, 3.0] * 7)
    assert float64_array(floats).equals(pa.array(floats, type=pa.float64(), from_pandas=True))
    assert float64_array(floats[1:][::2]).equals(pa.array(floats[1:][::2], type=pa.float64(), from_pandas=True))
    kept = float64_array(floats, nan_as_null=False)
    assert kept.null_count == 0 and np.isnan(kept.to_numpy()).sum() == 14
    ints = np.arange(-5, 20, dtype=np.int64)
    valid = ints % 3 != 0
    assert int64_array(ints, valid).equals(pa.array(ints, type=pa.int64(), mask=~valid))
    assert int64_array(ints).equals(pa.array(ints, type=pa.int64()))
    texts = ["aten::mm", None, "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "", "µs – ünïcode", None,
             "aten::mm"] * 5
    assert string_array(texts).equals(pa.array(texts, type=pa.string()))
    assert string_array(np.array(texts, dtype=object)[::-2]).equals(pa.array(texts[::-2], type=pa.string()))
    assert string_array([None, None]).equals(pa.array([None, None], type=pa.string()))
    assert string_array([]).equals(pa.array([], type=pa.string()))


def test_string_columns_of_a_real_trace_and_their_codes_are_pyarrows():
    table = sample_table(read_trace(RESNET), "r" * 64)
    for name in ("primitive", "pass", "dtype", "variant", "role", "kernel"):
        texts = table.column(name).to_pylist()
        assert string_array(texts).equals(pa.array(texts, type=pa.string())), name
        assert string_array(texts[::-3]).equals(pa.array(texts[::-3], type=pa.string())), name
    for texts in (table.column("kernel").to_pylist(), ["a", "a\0", "a", "", "a\0\0", "", "ü", "a"]):
        texts = [t for t in texts if t is not None]
        for array in (pa.array(texts, type=pa.string()), pa.array(texts, type=pa.string()).slice(3)):
            codes, values = string_codes(array)
            encoded = array.dictionary_encode()
            assert values == encoded.dictionary.to_pylist() and codes.tolist() == encoded.indices.to_pylist()
    source = pa.array(["s" * 64] * 5 + ["t" * 64], type=pa.string())
    assert holds_only(source.slice(0, 5), "s" * 64) and not holds_only(source, "s" * 64)
    assert not holds_only(source.slice(0, 5), "s" * 63) and not holds_only(pa.array(["s", None]), "s")


def test_store_reads_back_real_samples_as_written_nulls_kept(tmp_path):
    """Two real traces' samples, one in the order ingest gives (grouped by primitive), one interleaved (every
    partition in many runs): read back, each partition's rows in the order given, per source."""
    resnet = sample_table(read_trace(RESNET), "r" * 64)
    bert = sample_table(read_trace(BERT), "b" * 64)
    assert resnet.column("primitive").to_pylist() == sorted(resnet.column("primitive").to_pylist(),
                                                           key=resnet.column("primitive").to_pylist().index)
    bert = bert.take(np.r_[np.arange(0, bert.num_rows, 2), np.arange(1, bert.num_rows, 2)])
    store = SampleStore(tmp_path / "s")
    assert store.add_many([("r" * 64, resnet, None), ("b" * 64, bert, None)]) == [resnet.num_rows, bert.num_rows]
    read = pa.Table.from_pandas(store.read(), schema=resnet.schema, preserve_index=False)
    written = pa.concat_tables([bert, resnet])  # sources in name order: b..., then r...
    order = pc.sort_indices(written, [("hardware", "ascending"), ("primitive", "ascending")])  # a stable sort
    assert read.equals(written.take(order))
    for name in ("role", "dtype", "m"):
        assert read.column(name).null_count == resnet.column(name).null_count + bert.column(name).null_count > 0
    assert sorted(set(read.column("role").to_pylist()) - {None}) == ["bgrad", "dgrad", "wgrad", "whole"]


def test_sets_are_numpys():
    values = np.array([5, -3, 5, 7, 0, -3, 2**40, 7])
    assert distinct(values).tolist() == np.unique(values).tolist() and len(distinct(values[:0])) == 0
    for wanted in (distinct(values[2:5]), values[:0]):
        assert members(values, wanted).tolist() == np.isin(values, wanted).tolist()
