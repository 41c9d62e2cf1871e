"""Run a benchmark script's worker on local ranks of the reference trainer: the script parses its own options, and
the rest of its command line (after an optional `--`) is the trainer's; the parent re-runs the script under
torchrun with `--worker`, one torch thread per rank, as `tracekit capture` runs the trainer."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys


def parse(parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, list[str]]:
    """(the script's options, the trainer's arguments); adds the hidden --worker flag."""
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args, trainer = parser.parse_known_args()
    return args, [a for a in trainer if a != "--"]


def run(script: str, ranks: int, trainer: list[str]) -> subprocess.CompletedProcess:
    """`script --worker -- trainer...` on `ranks` local processes; its stdout (rank 0 prints its report)."""
    print(f"reference trainer, {ranks} ranks: {' '.join(trainer)}; load average {os.getloadavg()[0]:.1f}", flush=True)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(ranks), script, "--worker", "--", *trainer], env=dict(os.environ, OMP_NUM_THREADS="1"),
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
