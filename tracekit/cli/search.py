"""`tracekit search`: the best split of a job over N GPUs, ranked by predicted iteration time."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .app import app
from .choices import OBJECTIVES, STACKS, choice
from .executor import Executor, check_ray_address, executor_option, ray_address_option
from .output import ALLOW_UNKNOWN_HELP, console, err_console, fail, print_json, progress, user_errors
from .where import cluster_of, complete_cluster, complete_hardware, say_assumed

#: A job file's settings a search varies rather than keeps (the split it states; pipelines split evenly).
JOB_SPLIT = ("world_size", "data_parallel_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
             "virtual_pipeline_model_parallel_size", "pipeline_model_parallel_layout", "micro_batch_size",
             "sequence_parallel", "num_distributed_optimizer_instances")

HELP = """Find the best configuration of a job on N GPUs: every split Megatron accepts (tp, pp, dp, cp, ep, virtual
stages, micro-batch, sequence parallelism, activation recompute, distributed optimizer), pruned by the memory
model, predicted in one batched model call, ranked.

Settings the input states stay fixed; --vary KEYS opens them (comma-separated Megatron names or tp, pp, cp,
micro_batch_size, vp, sequence_parallel, recompute_granularity, use_distributed_optimizer, and for an MoE model ep,
etp; `all` opens every one);
a boolean setting opened is searched both ways. The input's own split is always predicted and shown with its rank;
when nothing can be ranked, search exits 2 and says what to open.

\b
Examples:
  tracekit search --megatron-args "--num-layers 32 --hidden-size 4096
      --num-attention-heads 32 --seq-length 4096 --global-batch-size 512
      --bf16" --gpus 64 --hardware H100-80GB-HBM3 --top 5
  tracekit search job.yaml --gpus 256 --cluster selene --objective cost
      --price-per-gpu-hour 2.5 --json
  tracekit search llama3_70b.toml --gpus 64 --hardware H100-80GB-HBM3

A torchtitan job (or a Composer YAML), as in the last example: its model, batch, precision and checkpointing stay;
tp, pp, micro-batch and the FSDP/HSDP shard group are searched.
"""


@app.command("search", help=HELP)
def search_command(
    config: Optional[Path] = typer.Argument(None, help="Job: YAML/JSON of Megatron argument names, a torchtitan "
                                                       "TOML job or a Composer/llm-foundry YAML."),
    megatron_args: Optional[str] = typer.Option(None, "--megatron-args",
                                                help="Job as Megatron command-line arguments."),
    gpus: int = typer.Option(..., "--gpus", min=1, help="GPUs the job gets (world size)."),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="GPU hardware id, e.g. H100-80GB-HBM3.",
                                           autocompletion=complete_hardware),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", min=1, help="GPUs per node."),
    cluster_name: Optional[str] = typer.Option(None, "--cluster", autocompletion=complete_cluster,
                                               help="Cluster preset or YAML/JSON file (see `tracekit predict "
                                                    "--help`)."),
    stack: Optional[str] = typer.Option(None, "--stack", click_type=choice(STACKS), metavar="NAME",
                                        help=f"Software-stack profile ({', '.join(STACKS)}; default "
                                             "megatron-core)."),
    vary: Optional[str] = typer.Option(None, "--vary", help="Comma-separated settings to vary although the input "
                                                            "states them; `all` for every one."),
    top: int = typer.Option(10, "--top", min=1, help="How many candidates to print."),
    objective: str = typer.Option("time", "--objective", click_type=choice(OBJECTIVES),
                                  help="What to rank by (cost needs --price-per-gpu-hour)."),
    executor: Executor = executor_option(),
    ray_address: Optional[str] = ray_address_option(),
    price: Optional[float] = typer.Option(None, "--price-per-gpu-hour", min=0.0, help="For --objective cost."),
    models_dir: Optional[Path] = typer.Option(None, "--models", help="Model directory (default: bundled models)."),
    allow_unknown: bool = typer.Option(False, "--allow-unknown", help=ALLOW_UNKNOWN_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    check_ray_address(executor, ray_address)
    with user_errors():
        from extractors.jobs.megatron import parse_megatron_argv
        from predictor import (
            DEFAULT_STACK as DEFAULT,
            SEARCH_KEYS,
            ModelSet,
            get_stack,
            nothing_fits,
            search_configurations as search,
        )
        from tracekit.core.config import check_settings, own_setting_names
        from tracekit.core.megatron_arguments import refuse_unknown
        from tracekit.core.settings import setting_name

        from .job_file import job_mapping, job_text

        if (config is None) == (megatron_args is None):
            fail("give the job as CONFIG or --megatron-args (one of them)")
        native = None  # a torchtitan TOML or a Composer YAML (extractors.jobs.files): its split is what is searched
        if config is not None:
            from extractors.jobs.files import read_job

            text = job_text(config, "search")
            if config.suffix.lower() in (".yaml", ".yml", ".json"):
                job_mapping(config, text)  # a syntax error is one line saying where, whatever the job's kind
            placed = cluster_of(hardware, gpus_per_node, cluster_name)[0]
            native = read_job(config, gpus, placed.domain_size if placed else gpus_per_node)
            if native is not None:
                base = {k: v for k, v in native.settings.items() if k not in JOB_SPLIT}
                stack = stack or native.stack
                for line in native.notes:
                    err_console.print(f"[yellow]note:[/yellow] {line}")
            else:
                base = job_mapping(config, text)
        else:
            assert megatron_args is not None  # exactly one of the two was given
            base = parse_megatron_argv(megatron_args)
        warnings: list[str] | None = [] if allow_unknown else None
        strange = set(refuse_unknown(base, own_setting_names(), warnings))  # kept aside, as predict does
        base = {k: v for k, v in base.items() if k not in strange}
        for line in warnings or []:
            err_console.print(f"[yellow]warning:[/yellow] {line}")
        opened = {setting_name(k) for k in (vary or "").split(",") if k.strip()}
        if opened - {"all"}:
            check_settings({k: 1 for k in opened - {"all"}})
        fixed = set() if "all" in opened else {setting_name(k) for k in base} - opened
        profile = get_stack(stack or DEFAULT)
        base = {**profile.config, **base}
        where, note = cluster_of(hardware, gpus_per_node, cluster_name)
        if where is None:
            fail("name the GPU with --hardware ID or --cluster NAME|FILE")
        models = ModelSet.load(models_dir)
        runner = None
        if executor is Executor.ray:
            from predictor import RayExecutor

            runner = RayExecutor(ray_address)
        with progress(quiet=as_json) as bar:
            task = bar.add_task(f"searching ({executor.value})", total=None)
            result = search(base, gpus, where, models, fixed & {*SEARCH_KEYS, "num_distributed_optimizer_instances"},
                            profile.calibration(where.hardware), objective, price, runner,
                            context_parallel=bool(opened & {"all", "context_parallel_size"}),
                            progress=lambda done, total: bar.update(task, completed=done, total=total))
        if note:
            result.warnings.insert(0, note)
        if not result.candidates:
            fail(f"{nothing_fits(result, gpus, profile.framework)}; {_hint(result, gpus)}")
        say_assumed(note, quiet=as_json)  # once the answer is sure: an error stays one line
    if as_json:
        print_json(result.to_dict(top))
        return
    _print(result, top, where, gpus, profile.framework, skip=1 if note else 0)


#: The --vary names of the settings that have short ones.
VARY_NAMES = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp", "context_parallel_size": "cp",
              "virtual_pipeline_model_parallel_size": "vp", "expert_model_parallel_size": "ep",
              "expert_tensor_parallel_size": "etp"}


def _hint(result, gpus: int) -> str:
    """What to try when nothing fits: open the settings the input fixed, else more GPUs."""
    if result.fixed:
        names = ",".join(VARY_NAMES.get(k, k) for k in result.fixed)
        return f"open the settings the input fixes with --vary {names}"
    return f"every split was searched: give the job more GPUs than {gpus} or a smaller global batch"


def _print(result, top: int, cluster, gpus: int, framework: str, skip: int = 0) -> None:
    """The ranked table (the input's own row marked, and shown below the top when it ranks lower or does not fit),
    the pruning line (the splits `framework` would refuse), what separates the best from the next, and the best
    candidate's warnings on stderr (`skip`: the cluster note, said before the search)."""
    from rich.table import Table

    from predictor import split_name

    table = Table(title=f"best of {result.evaluated} configurations on {gpus} × {cluster.hardware} "
                        f"({cluster.name}), by {result.objective.replace('_', ' ')}")
    for col in ("#", "split", "s/iter", "comm", "bubble", "GB/GPU", "MFU"):
        table.add_column(col, justify="left" if col == "split" else "right", overflow="fold")

    def add(rank: str, c: dict) -> None:
        b = c["breakdown"]
        name = split_name(c["config"]) + ("  ← input" if c.get("input") else "")
        table.add_row(rank, name, f"{c['iteration_time_s']:.4g}", f"{b['exposed_communication']:.3g}",
                      f"{b['pipeline_bubble']:.3g}", f"{c['memory_gb_per_gpu']:.1f}",
                      "n/a" if c["mfu"] is None else f"{100 * c['mfu']:.1f}%")

    for i, c in enumerate(result.candidates[:top], start=1):
        add(str(i), c)
    mine = result.input
    if mine is not None and (mine["rank"] is None or mine["rank"] > top):
        table.add_section()
        add(str(mine["rank"]) if mine["rank"] else "—", mine)
    console.print(table)
    pruned = result.pruned
    console.print(f"pruned: {pruned['memory']} for memory, {pruned['invalid']} that {framework} would refuse"
                  + (f", {pruned['failed']} not predictable" if pruned["failed"] else "")
                  + (f", {pruned['implausible']} above the GPU's peak (a bug)" if pruned["implausible"] else "")
                  + f"; {result.seconds:.1f} s")
    if mine is None:
        console.print(f"not ranked: {result.input_error}", markup=False)
    elif mine["rank"] is None:
        console.print(f"input: does not fit ({mine['memory_gb_per_gpu']:.1f} GB per GPU), not ranked", markup=False)
    else:
        best = result.candidates[0]["iteration_time_s"]
        console.print(f"input: rank {mine['rank']} of {len(result.candidates)}, {mine['iteration_time_s']:.4g} s"
                      + (f" ({mine['iteration_time_s'] / best - 1:+.1%} vs the best)" if mine["rank"] > 1 else
                         " (the best)"), markup=False)
    for note in result.notes:
        console.print(note, markup=False)
    for line in result.problems.values():
        err_console.print(f"[yellow]warning:[/yellow] not ranked: {line}", soft_wrap=True)
    for w in result.warnings[skip:]:
        err_console.print(f"[yellow]warning:[/yellow] best candidate: {w}")
