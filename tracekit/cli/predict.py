"""`tracekit predict`: iteration time of a Megatron configuration on a cluster, with its breakdown."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from tracekit.core.cluster import PRESETS
from tracekit.core.hardware import SPECS
from tracekit.report.numbers import percent, seconds

from .app import app
from .choices import STACKS, choice
from .output import (
    ALLOW_UNKNOWN_HELP,
    EXIT_PARTIAL,
    console,
    err_console,
    fail,
    print_json,
    progress,
    user_errors,
    working,
)
from .where import cluster_of, complete_cluster, complete_hardware, say_assumed

HELP = """Predict one training iteration of a Megatron GPT configuration: operator graph per pipeline stage →
operator estimates from the trained models → pipeline schedule simulation.

Prints the iteration time, where it goes (compute, exposed communication, pipeline bubble, optimizer, other),
TFLOP/s per GPU, MFU, tokens/s, memory per GPU and the operators that used a fallback estimate.

\b
Examples:
  tracekit predict job.yaml --hardware A100-SXM4-80GB --gpus-per-node 4
  tracekit predict --megatron-args "--num-layers 32 --hidden-size 4096
      --num-attention-heads 32 --seq-length 4096 --micro-batch-size 4
      --global-batch-size 64 --tensor-model-parallel-size 2
      --pipeline-model-parallel-size 4 --fp16" --hardware A100-SXM4-80GB
      --gpus-per-node 4 --json
  tracekit predict --batch runs.csv --csv-out predicted.csv

With --batch, each row's stack (framework column), hardware and cluster (hardware_gpu, gpus_per_node,
interconnect) are read from the row; the output's notes column says what was assumed where a cell did not say. A
file without hardware_gpu needs --hardware; a column it lacks takes its default in every row, said once. A row
without a micro-batch (Megatron has no default) takes the fastest of 1, 2, 4, 8, 16 that fits; its warnings say which.
"""


@app.command("predict", help=HELP)
def predict_command(
    config: Optional[Path] = typer.Argument(None, help="Configuration: YAML/JSON of Megatron argument names, a "
                                                       "Megatron log (its arguments block), a torchtitan TOML job "
                                                       "or a Composer/llm-foundry YAML (with --gpus)."),
    megatron_args: Optional[str] = typer.Option(None, "--megatron-args", help="Megatron command-line arguments."),
    megatron_log: Optional[Path] = typer.Option(None, "--megatron-log", help="Megatron log with its arguments block."),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="Hardware id: a datasheet entry ("
                                           f"{', '.join(SPECS)}) or a CPU's cpu-<vendor>-<line>-<model> (as "
                                           "`tracekit sample` names it).", autocompletion=complete_hardware),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", min=1, help="GPUs per node (default 8)."),
    cluster_name: Optional[str] = typer.Option(
        None, "--cluster", autocompletion=complete_cluster,
        help=f"Cluster preset ({', '.join(PRESETS)}) or a YAML/JSON file (hardware, gpus_per_node, fabric, "
             "intra_node_gbs, inter_node_gbs, latencies, in_network_reduction, nvlink_domain; `preset:` to start from "
             "one). Default: the usual node of --hardware; with --batch, what each row says."),
    stack: Optional[str] = typer.Option(
        None, "--stack", click_type=choice(STACKS), metavar="NAME",
        help=f"Software-stack profile ({', '.join(STACKS)}): attention kernel, overlap defaults and host constants. "
             "Default: what the input says (a batch row's framework column), else megatron-core."),
    models_dir: Optional[Path] = typer.Option(None, "--models", help="Model directory (default: bundled models)."),
    calibration: Optional[str] = typer.Option(None, "--calibration", help="Calibration name (shipped: see docs) or "
                                                                          "JSON file, used instead of the stack "
                                                                          "profile's constants."),
    gpus: Optional[int] = typer.Option(None, "--gpus", "--world-size", min=1,
                                       help="GPUs of the job (world size); dp = GPUs / (tp·pp·cp)."),
    sets: list[str] = typer.Option([], "--set", help="KEY=VALUE Megatron setting that overrides the input (every "
                                                     "row with --batch; repeatable), e.g. --set attention=unfused."),
    batch: Optional[Path] = typer.Option(None, "--batch", help="CSV of configurations (e2e CSV column layout)."),
    out: Optional[Path] = typer.Option(None, "--csv-out", help="Output CSV for --batch (required with it)."),
    trace_out: Optional[Path] = typer.Option(None, "--trace-out", help="Write the predicted timeline as Kineto "
                                                                       "traces (rank-{r}.json.gz) into this folder."),
    trace_gzip: bool = typer.Option(True, "--trace-gzip/--trace-plain", help="--trace-out files gzip-compressed "
                                                                            "(default) or plain JSON."),
    allow_unknown: bool = typer.Option(False, "--allow-unknown", help=ALLOW_UNKNOWN_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    with user_errors():
        from tracekit.validate import parse_sets

        overrides: dict[str, Any] = parse_sets(sets)
        if gpus is not None:  # the world decides dp: a dp the input states would contradict it
            overrides = {**overrides, "world_size": gpus, "data_parallel_size": None}
        if batch is not None:
            _batch(batch, out, hardware, gpus_per_node, cluster_name, stack, models_dir, calibration, overrides,
                   as_json)
            return
        sources = [x for x in (config, megatron_args, megatron_log) if x is not None]
        if len(sources) != 1:
            fail("give exactly one of CONFIG, --megatron-args, --megatron-log (or --batch FILE.csv)")
        from tracekit.core.config import TrainingConfig
        from tracekit.core.errors import InputError
        from tracekit.core.settings import setting_name


        if trace_out is not None and trace_out.exists() and not trace_out.is_dir():
            raise InputError(trace_out, "exists and is not a directory (--trace-out takes a folder for the traces)")
        from extractors.jobs.megatron import (
            ARGS_BEGIN,
            config_from_argv,
            config_from_file,
            config_from_log,
            job_settings,
            parse_arguments_block,
            parse_megatron_argv,
        )
        from predictor import DEFAULT_STACK as DEFAULT, get_stack, stack_of_arguments

        from .job_file import job_mapping, job_text

        native = None  # a torchtitan TOML or a Composer YAML (extractors.jobs.files)
        mapping = None  # a YAML/JSON job's document
        if config is not None:  # a trace, a table, a binary file, bad YAML: refused in one line before any parser
            job = job_text(config, "predict")
            if config.suffix.lower() in (".yaml", ".yml", ".json"):
                mapping = job_mapping(config, job)  # a syntax error is one line saying where, whatever its kind
            native = _job(config, gpus, hardware, gpus_per_node, cluster_name)
            if native is None and not ARGS_BEGIN.search(job):
                job_mapping(config, job, or_log=config.suffix.lower() not in (".yaml", ".yml", ".json"))
        if native is not None:  # its world size is the launch's (--gpus): the reader resolves the split with it
            overrides = {k: v for k, v in overrides.items() if k not in ("world_size", "data_parallel_size")}

        log, text = (megatron_log if megatron_log is not None else
                     config if config is not None and native is None
                     and config.suffix.lower() not in (".yaml", ".yml", ".json") else None), None
        if log is not None:
            try:
                text = log.read_text(errors="replace")
            except OSError as exc:
                raise InputError(log, f"cannot read ({exc.strerror or exc})") from exc
        # the text of a Megatron log: a --megatron-log, or a CONFIG that is one
        log_text = text if text is not None and (megatron_log is not None or ARGS_BEGIN.search(text)) else None
        shown = stack_of_arguments(parse_arguments_block(log_text, str(log))) \
            if log_text is not None and ARGS_BEGIN.search(log_text) else None
        if native is not None:
            shown = get_stack(native.stack)
        profile = get_stack(stack) if stack else (shown or get_stack(DEFAULT))
        unknown: list[str] | None = [] if allow_unknown else None
        given: set[str] | None = None  # what a command line or YAML/JSON job states (a log or a native job: all)
        if native is not None:
            cfg = TrainingConfig.from_mapping(native.settings, profile.config)
        elif log_text is not None:  # the text already read
            cfg = config_from_log(log_text, str(log), profile.config)
        elif config is not None:
            cfg = config_from_file(config, profile.config, unknown)
            given = set(job_settings(mapping)) if mapping is not None else None
        else:
            assert megatron_args is not None  # the one source left (exactly one was given)
            cfg = config_from_argv(megatron_args, profile.config, unknown)
            given = set(parse_megatron_argv(megatron_args))
        if overrides:
            merged = {k: v for k, v in cfg.to_dict().items() if v is not None}
            merged.update(overrides)
            cfg = TrainingConfig.from_mapping(merged)
        cluster, note = cluster_of(hardware, gpus_per_node, cluster_name)
        if cluster is None:
            fail("name the GPU with --hardware ID (e.g. A100-SXM4-80GB) or --cluster NAME|FILE")
        from extractors.jobs import launched_cluster
        from predictor import ModelSet, load_calibration, predict_iteration as predict

        cluster, placed = launched_cluster(profile.name, cluster, cfg.world_size)  # Bridge's Slurm segments

        cal = load_calibration(calibration) if calibration else profile.calibration(cluster.hardware)
        models = ModelSet.load(models_dir)
        with working("predicting", quiet=as_json):
            prediction = predict(cfg, cluster, models, cal)
        say_assumed(note, quiet=as_json)  # once the answer is sure: an error stays one line
        added = (native.notes if native is not None else []) + list(unknown or []) + ([placed] if placed else [])
        if given is not None and "micro_batch_size" not in {setting_name(k) for k in [*given, *overrides]}:
            added.append(f"micro_batch_size not given (Megatron requires --micro-batch-size): {cfg.micro_batch_size} "
                         "taken; `tracekit search ... --vary micro_batch_size` ranks the others")
        if shown is not None and not stack:
            added.insert(0, f"stack {shown.name}: the {'job file' if native else 'log'}'s "
                            f"{'kind' if native else 'arguments block'} shows it")
        prediction.warnings[:0] = added
        written = []
        if trace_out is not None:
            from predictor import default_ranks, write_traces

            with progress(quiet=as_json) as bar:
                task = bar.add_task("writing predicted traces", total=len(default_ranks(prediction.graph)))
                written = write_traces(prediction, trace_out, compress=trace_gzip,
                                       progress=lambda _: bar.advance(task))
    if as_json:
        doc = prediction.to_dict()
        doc["warnings"] = ([note] if note else []) + doc["warnings"]
        if written:
            doc["trace_files"] = [str(p) for p in written]
        print_json(doc)
        return
    _print_prediction(prediction, len(added))
    if written:
        console.print(f"predicted traces: {', '.join(str(p) for p in written)}")


def _job(config: Path, gpus: Optional[int], hardware: Optional[str], gpus_per_node: Optional[int],
         cluster_name: Optional[str]):
    """A torchtitan TOML or Composer YAML job (extractors.jobs.files), read with the launch's GPUs and the node
    size of the cluster it runs on; None for a Megatron configuration."""
    from extractors.jobs.files import read_job

    where = cluster_of(hardware, gpus_per_node, cluster_name)[0]
    return read_job(config, gpus, where.domain_size if where is not None else gpus_per_node)


def _batch(path, out, hardware, gpus_per_node, cluster_name, stack, models_dir, calibration, overrides,
           as_json) -> None:
    from extractors.jobs import parse_row, read_rows
    from extractors.jobs.columns import absent_defaults, required_columns
    from predictor import ModelSet, load_calibration, output_row, predict_rows, write_rows
    from tracekit.core.hardware import normalize_hardware

    if out is None:
        fail("--batch needs --csv-out FILE.csv")
    cluster = cluster_of(hardware, gpus_per_node, cluster_name)[0] if cluster_name else None
    header, cells = read_rows(path)
    required_columns(path, header, hardware_given=bool(hardware or cluster_name))
    absent = absent_defaults(header)
    cal = load_calibration(calibration) if calibration else None
    models = ModelSet.load(models_dir)
    hw = normalize_hardware(hardware) if hardware else None
    rows = [parse_row(c, i + 2, hw, gpus_per_node, overrides, stack, cluster) for i, c in enumerate(cells)]
    if absent:
        say_assumed(f"{path}: {absent}", quiet=as_json)  # once for the file; each row's prediction_notes too
        for r in rows:
            r.notes.insert(0, absent)
    with progress(quiet=as_json) as bar:
        task = bar.add_task("predicting", total=len(rows))
        results = predict_rows(rows, models, cal, on_chunk=lambda n: bar.advance(task, n))
    output, failures, used, stacks, clusters = [], [], set(), set(), set()
    for r, result in zip(rows, results):
        if isinstance(result, Exception):
            output.append(output_row(r, error=str(result)))
            failures.append((r.line, str(result)))
        else:
            output.append(output_row(r, result))
            used.add(result.hardware_used)
            clusters.add(result.cluster.name)
            stacks.add(r.complete()[2].name)
    write_rows(out, header, output)
    from tracekit.core.megatron_arguments import unmodelled_flags

    unmodelled: dict[str, int] = {}  # flag → rows that set it (each row's warnings column names its own)
    for r in rows:
        for flag in unmodelled_flags(r.config.extra) if r.config is not None else ():
            unmodelled[flag] = unmodelled.get(flag, 0) + 1
    summary = {"input": str(path), "output": str(out), "rows": len(rows), "predicted": len(rows) - len(failures),
               "failed": [{"line": line, "error": msg} for line, msg in failures], "hardware_used": sorted(used),
               "clusters": sorted(clusters), "stacks": sorted(stacks),
               "calibration": cal.name if cal else "stack profiles", "unmodelled_flags": unmodelled,
               "assumed": absent}
    if as_json:
        print_json(summary)
    else:
        console.print(f"{summary['predicted']}/{len(rows)} rows predicted → {out} "
                      f"(hardware models: {', '.join(sorted(used)) or 'none'}; clusters: "
                      f"{', '.join(sorted(clusters)) or 'none'}; stacks: {', '.join(sorted(stacks)) or 'none'}"
                      f"{'; calibration: ' + cal.name if cal else ''})")
        if unmodelled:
            err_console.print("warning: flags that change the iteration time but are not modelled, set by rows "
                              "(see each row's warnings): " + ", ".join(f"{flag} ({n})" for flag, n in
                                                                        unmodelled.items()), markup=False,
                              soft_wrap=True)
        for line, msg in failures:
            err_console.print(f"error: {path}: line {line}: {msg}", markup=False, soft_wrap=True)
    if failures:
        raise typer.Exit(EXIT_PARTIAL if len(failures) < len(rows) else 2)


def _print_prediction(p, skip: int = 0) -> None:
    """The answer for people. A configuration that does not fit says so first: the memory warning leads the
    prediction's own warnings (`predictor.predict`), which follow the `skip` warnings the command put in front."""
    from rich.table import Table

    from predictor.report.provenance import sentence

    c = p.config
    warnings = list(p.warnings)
    if p.fits_in_memory is False and len(warnings) > skip:
        console.print(f"[bold red]does not fit:[/bold red] {warnings.pop(skip)}; the time below assumes it did",
                      soft_wrap=True)
    console.print(f"[bold]{c.num_layers} layers × h{c.hidden_size}, seq {c.seq_length}, global batch "
                  f"{c.global_batch_size} (micro {c.micro_batch_size}, {c.num_microbatches} micro-batches) on "
                  f"{c.world_size} × {p.cluster.hardware} ({p.cluster.gpus_per_node}/node): tp {c.tp} pp {c.pp} "
                  f"dp {c.dp} cp {c.cp}{' vp ' + str(c.vp) if c.vp > 1 else ''}[/bold]")
    if p.hardware_used != p.cluster.hardware:
        console.print(f"operator models: {p.hardware_used}")
    line = sentence(p.estimates)  # what the answer rests on, in the tables' names: one line, above it
    console.print(line, markup=False, soft_wrap=True)
    warnings = [w for w in warnings if w != line]
    table = Table(title=f"iteration time {seconds(p.iteration_time_s)} (busiest stage {p.critical_stage})")
    table.add_column("part")
    table.add_column("time", justify="right")
    table.add_column("share", justify="right")
    for key, value in p.breakdown.items():
        table.add_row(key.replace("_", " "), seconds(value), percent(value / p.iteration_time_s))
    console.print(table)
    if p.framework_us:
        console.print("framework time per compute operator (sampled on this CPU, in other): " + ", ".join(
            f"{pass_} {us:.0f} µs" for pass_, us in sorted(p.framework_us.items(), reverse=True)))
    if p.fsdp_unit_us:
        console.print("torch FSDP2's hooks per unit and micro-batch (sampled on this CPU, in other): " + ", ".join(
            f"{pass_} {us:.0f} µs" for pass_, us in sorted(p.fsdp_unit_us.items(), reverse=True)))
    mfu = "n/a" if p.mfu is None else percent(p.mfu)
    console.print(f"{p.tflops_per_gpu:.1f} TFLOP/s per GPU, MFU {mfu}, {p.tokens_per_s:,.0f} tokens/s")
    mem = p.memory_gb_per_gpu
    console.print("memory per GPU: " + ", ".join(f"{k.replace('_', ' ')} {v:.1f} GB" for k, v in mem.items()))
    top = Table(title="top operators (busiest stage, per iteration)")
    for col in ("operator", "pass", "primitive", "time", "share"):
        top.add_column(col, justify="right" if col in ("time", "share") else "left")
    for op in p.top_operators[:8]:
        top.add_row(op["name"], op["pass"], op["primitive"], seconds(op["time_s"]), percent(op["share"]))
    console.print(top)
    for w in warnings:
        err_console.print(f"[yellow]warning:[/yellow] {w}")
