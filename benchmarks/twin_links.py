"""How often a kernel whose launch is not in the trace gets the wrong op from its twins (`extractors/kineto/twins.py`).

On every corpus trace with device kernels, the launches of the first 10% and 30% of the kernels that do have one
(by start time: what a profiler window opening late looks like) are hidden; the rule then names an op for some of
them. Recovered: how many it names; wrong: how many of those differ from the hidden launch's op in name, Input Dims
or Input type. Without the rules none is recovered (the kernels stay unshaped and unscored). Side by side: the
kernel name alone as the signature, name + grid/block with one twin enough, tracekit's rule 1 alone (name +
grid/block, at least MIN_TWINS twins that agree) and tracekit's rules 1 and 2 (runs that recur kernel for kernel).

    python benchmarks/twin_links.py [--corpus DIR]        (~5 s)
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from extractors.kineto.decode import decode_events, event_columns  # noqa: E402
from extractors.kineto.linkage import link, op_context  # noqa: E402
from extractors.kineto.load import open_trace  # noqa: E402
from extractors.kineto.twins import MIN_RUN, MIN_TWINS, twin_ops  # noqa: E402
from tracekit.core.errors import InputError  # noqa: E402

CORPUS = ROOT.parent / "shared" / "corpus" / "kineto"
RULES = {"name only, 1 twin": ("name", 1, None), "name + grid/block, 1 twin": ("geometry", 1, None),
         f"rule 1: name + grid/block, {MIN_TWINS} twins": ("geometry", MIN_TWINS, None),
         f"rules 1 + 2: and runs of {MIN_RUN}+ (tracekit)": ("geometry", MIN_TWINS, MIN_RUN)}


def columns(path: Path):
    tf = open_trace(path)
    return event_columns(tf.events) if tf.events is not None else decode_events(tf.events_raw)


def score(c, share: float, signature: str, min_twins: int, min_run: int | None) -> tuple[int, int, int]:
    """(hidden, recovered, wrong) when the launches of the first `share` of the linked kernels are hidden."""
    if signature == "name":  # every kernel with a geometry gets the same one: the name alone decides
        c = replace(c, dev_geometry=[b"-" if g else b"" for g in c.dev_geometry])
    ops, _ = op_context(c)
    linked = link(c)
    own = np.flatnonzero((linked.dev_op >= 0) & np.array([bool(g) for g in c.dev_geometry]))
    if not len(own):
        return 0, 0, 0
    hidden = own[c.dev_ts[own] < np.quantile(c.dev_ts[own], share)]
    masked = linked.dev_op.copy()
    masked[hidden] = -1
    got = twin_ops(c, ops, masked, min_twins, min_run)[hidden]

    def inputs(op: int) -> tuple:
        launcher = int(ops.cpu_op[op]) if ops.cpu_op[op] >= 0 else op
        return c.op_name[launcher], c.op_dims[launcher], c.op_types[launcher]

    named = got >= 0
    wrong = sum(inputs(int(g)) != inputs(int(t)) for g, t in zip(got[named], linked.dev_op[hidden][named]))
    return len(hidden), int(named.sum()), int(wrong)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default=str(CORPUS), help="Kineto corpus folder")
    args = parser.parse_args()
    start = time.perf_counter()
    traces = []
    for path in sorted(Path(args.corpus).rglob("*.json*")):
        try:
            c = columns(path)
        except (InputError, ValueError):
            continue
        if len(c.dev_ts):
            traces.append(c)
    print(f"{len(traces)} corpus traces with device kernels\n")
    print(f"{'rule':46s} {'hidden':>7s} {'recovered':>10s} {'wrong':>6s} {'wrong %':>8s}")
    for share in (0.1, 0.3):
        print(f"first {share:.0%} of each trace's linked kernels hidden")
        for label, rule in RULES.items():
            hidden, named, wrong = (int(x) for x in np.sum([score(c, share, *rule) for c in traces], axis=0))
            print(f"  {label:44s} {hidden:7d} {named:10d} {wrong:6d} {100 * wrong / max(named, 1):7.2f}%")
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
