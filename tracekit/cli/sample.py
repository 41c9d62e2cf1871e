"""`tracekit sample`: micro-benchmark operator primitives on this machine into the sample store."""
from __future__ import annotations

from pathlib import Path

import typer

from .app import app
from .choices import DEVICES, SAMPLE_DTYPES, choice
from .output import console, err_console, print_json, progress, shows_progress, user_errors

#: Off a terminal (a CI log, `| tee`), a line each time this share of the budget has gone by.
LINE_EVERY = 0.1


class ProgressLines:
    """What `sample` has timed so far, a line on stderr every LINE_EVERY of the budget, each naming every primitive
    timed yet and how many timings of its shapes (every pass counts): where a progress bar is not drawn, the
    minutes of a sampling run are not silent."""

    def __init__(self, budget: float):
        import time

        self.clock = time.monotonic
        self.start = self.clock()
        self.budget = budget
        self.counts: dict[str, int] = {}
        self.next = LINE_EVERY * budget

    def timed(self, primitive: str, fraction: float) -> None:
        """A shape of `primitive` was timed (`fraction`: of the budget; the collectives' share counts from when
        their processes are up, so the run can outlast it: the lines follow the clock)."""
        self.counts[primitive] = self.counts.get(primitive, 0) + 1
        elapsed = self.clock() - self.start
        if elapsed >= self.next:
            so_far = ", ".join(f"{name} {n}" for name, n in sorted(self.counts.items()))
            err_console.print(f"sampling: {elapsed:.0f} s of ~{self.budget:.0f} s, timings so far: {so_far}",
                              markup=False, soft_wrap=True)
            step = LINE_EVERY * self.budget
            self.next = (int(elapsed / step) + 1) * step


@app.command("sample")
def sample_command(
    device: str = typer.Option("cpu", "--device", click_type=choice(DEVICES), help="The device to time."),
    primitives: str = typer.Option(
        None, "--primitives",
        help="Comma list (default all): gemm (with MoE experts' and fp8 GEMMs), bmm, attention, softmax, norm, "
        "elementwise (with FSDP2's copies, RoPE, dropout, MoE routing), activation, embedding, cross_entropy, "
        "optimizer, framework (CPU only: time per operator beyond the operators' own, from tracekit's reference "
        "layer), all_reduce, all_gather, reduce_scatter, send_recv.",
    ),
    budget: float = typer.Option(120.0, "--budget", help="Time budget in seconds (approximate)."),
    processes: int = typer.Option(2, "--processes", min=1,
                                  help="Local processes the collectives run over (as torchrun's --nproc-per-node)."),
    rounds: int = typer.Option(3, "--rounds", help="Passes over the shapes; each sample is the median over passes "
                               "(a slow spell of a busy machine then spoils one pass, not the sample)."),
    dtype: str = typer.Option(None, "--dtype", click_type=choice(SAMPLE_DTYPES),
                              help="Default: fp32 on cpu, bf16 on cuda."),
    threads: int = typer.Option(1, "--threads",
                                help="CPU threads for compute timings (torchrun's default is 1 per rank)."),
    store: Path = typer.Option(None, "--store", help="Sample store (default $TRACEKIT_HOME or ./.tracekit)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Time each primitive over a small spread of transformer shapes (forward and backward, warm-up + repeats) and
    collectives over local processes, then add the samples to the store under this device's hardware id.

    The budget is shared between compute and collectives by their number of primitives. The first pass covers as
    many shapes as it allows, spread over the range; further passes (--rounds) re-time those shapes.

    On a GPU each kernel sample is its time on the device (CUDA events, the call queued behind a spin kernel: no
    launch or synchronize in it), once that clock has passed a check on one GEMM (else the host's clock, and the
    summary says why); host costs and collectives, and everything on a CPU, are timed by the host's clock.

    \b
    Example:
      tracekit sample --device cpu --budget 60 --processes 2
          --primitives gemm,attention,all_reduce
    """
    from tracekit.core.store import SampleStore, default_store
    from tracekit.sampling.run import parse_primitives, sample

    with user_errors():
        chosen = parse_primitives(primitives)
        lines = None if as_json or shows_progress() else ProgressLines(budget)  # off a terminal: lines, not a bar
        with progress(quiet=as_json) as bar:
            task = bar.add_task(f"sampling {device}", total=100)
            result = sample(device, chosen, budget, processes, SampleStore(store or default_store()), dtype, threads,
                            rounds=rounds, progress=lambda fraction: bar.update(task, completed=round(100 * fraction)),
                            timed=lines.timed if lines else None)
    counts = result.counts()
    summary = {"hardware": result.hardware, "device": result.device, "dtype": result.dtype, "source": result.source,
               "seconds": round(result.seconds, 1), "stopped_by_budget": result.stopped_by_budget,
               "samples": counts, "skipped": result.skipped, "kernel_clock": result.kernel_clock,
               "clock_problem": result.clock_problem, "store": str(store or default_store())}
    if as_json:
        print_json(summary)
        return
    from rich.table import Table

    # The heading is a line of its own, not the table's title: rich wraps a title to the table's width (two narrow
    # columns), which broke a long CPU id inside a word.
    console.print(f"samples on {result.hardware} ({result.dtype}, {summary['seconds']} s)", markup=False,
                  soft_wrap=True)
    table = Table()
    table.add_column("primitive")
    table.add_column("samples", justify="right")
    for name, count in sorted(counts.items()):
        table.add_row(name, str(count))
    console.print(table)
    if result.clock_problem:
        console.print(f"kernels timed by the host's clock: {result.clock_problem}", markup=False, soft_wrap=True)
    for name, reason in sorted(result.skipped.items()):
        console.print(f"not sampled: {name}: {reason}")
    if result.stopped_by_budget:
        console.print("the budget ran out before every shape was timed; a larger --budget times more shapes")
