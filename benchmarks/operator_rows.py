"""What benchmarks/operator_accuracy.py and table_accuracy.py both read: where the corpus's operator samples and
traces are, the TraceLens kernels of the corpus traces as `tracekit ingest` reads them, and the GPUs whose bundled
models come from published tables."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from predictor.costs.learned.model_keys import shapeless_rows  # noqa: E402
from tracekit.core.samples import COLLECTIVE_PRIMITIVES  # noqa: E402

#: The corpus, as the test suite finds it (tests/conftest.py): `TRACEKIT_CORPUS`, else ../shared/corpus.
CORPUS = Path(os.environ.get("TRACEKIT_CORPUS") or ROOT.parent / "shared" / "corpus")
DEFAULT = CORPUS / "operator-samples" / "estimate-train-time"
TRACES = ("h100__*.json.gz", "b200__*.json.gz", "mi300__*.json.gz")
#: GPUs whose bundled models come from published tables (#24); `--transfer` scores the corpus traces without them.
TABLE_GPUS = ("H100-80GB-HBM3", "B200-180GB", "MI300X", "MI355X")


def corpus_rows(corpus: Path) -> pd.DataFrame:
    """Shaped compute kernels of the TraceLens H100, B200 and MI300X traces, as `tracekit ingest` reads them."""
    from extractors.kineto import read_trace, trace_samples

    files = sorted(p for pattern in TRACES for p in (corpus / "kineto" / "tracelens").glob(pattern))
    if not files:
        raise SystemExit(f"{corpus}/kineto/tracelens: no H100/B200/MI300X traces")
    frame = pd.concat([trace_samples(read_trace(p), p.name) for p in files], ignore_index=True)
    frame = frame[~frame["primitive"].isin((*COLLECTIVE_PRIMITIVES, "other", "memcpy", "memset"))
                  & (frame["duration_us"] > 0)]
    shapeless = shapeless_rows(frame)
    left = frame[shapeless].groupby("hardware").size()
    print("corpus kernels without shapes, left out (no launch call in the trace and no agreeing twins, or an op "
          "with no shape rule): " + ", ".join(f"{hw} {n}" for hw, n in left.items()), file=sys.stderr)
    return frame[~shapeless].reset_index(drop=True)
