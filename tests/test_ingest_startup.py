"""`tracekit ingest` starts without pandas (its import alone is about the time of a small folder's ingest) and, under
--json (no table printed, no bar drawn), without rich; and the Arrow arrays it builds from buffers instead of
pyarrow's converters are the ones those converters make."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa

from tests.conftest import KINETO
from tracekit.core.arrow_arrays import float64_array, int64_array, integer_values, string_array

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
                  "exit": code}), file=sys.stderr)
"""


def test_ingest_command_never_imports_pandas_nor_rich_under_json(tmp_path):
    # the 8 ranks of one job (forked workers, collectives matched) and a CPU-only trace, into one store
    run = [str(KINETO / "param" / "dlrm_8rank"),
           str(KINETO / "hta" / "cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")]
    done = subprocess.run([sys.executable, "-c", RUN, *run, "--store", str(tmp_path / "s"), "--json"],
                          capture_output=True, text=True, timeout=300)
    report = json.loads(done.stdout)
    assert len(report["traces"]) == 9 and not report["errors"]
    assert json.loads(done.stderr.strip().splitlines()[-1]) == {"pandas": False, "rich": [], "exit": 0}


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
    codes = pa.array(["b", "a", "b", "c"]).dictionary_encode().indices.slice(1)
    assert integer_values(codes).tolist() == [1, 0, 2]
