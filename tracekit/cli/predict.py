"""`tracekit predict`: iteration time of a Megatron configuration on a cluster, with its breakdown."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .app import app
from .output import EXIT_PARTIAL, console, err_console, fail, print_json, progress, user_errors

HELP = """Predict one training iteration of a Megatron GPT configuration: operator graph per pipeline stage →
operator estimates from the trained models → pipeline schedule simulation.

Prints the iteration time, where it goes (compute, exposed communication, pipeline bubble, optimizer, other),
TFLOP/s per GPU, MFU, tokens/s, memory per GPU and the operators that used a fallback estimate.

Examples:

  tracekit predict job.yaml --hardware A100-SXM4-80GB --gpus-per-node 4

  tracekit predict --megatron-args "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096
  --micro-batch-size 4 --global-batch-size 64 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4
  --fp16" --hardware A100-SXM4-80GB --gpus-per-node 4 --json

  tracekit predict --batch runs.csv --out predicted.csv --hardware A100-SXM4-40GB --set attention=unfused --calibration vtrain-a100
"""


def _parse_sets(values: list[str]) -> dict[str, str]:
    out = {}
    for item in values:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            fail(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _cluster(hardware: Optional[str], gpus_per_node: Optional[int], cluster_file: Optional[Path]):
    from tracekit.core.errors import InputError
    from tracekit.core.hardware import Cluster, normalize_hardware

    if cluster_file is not None:
        import yaml

        try:
            data = yaml.safe_load(cluster_file.read_text())
        except OSError as exc:
            raise InputError(cluster_file, f"cannot read ({exc.strerror or exc})") from exc
        except yaml.YAMLError as exc:
            raise InputError(cluster_file, f"not valid YAML/JSON ({exc})") from exc
        if not isinstance(data, dict) or "hardware" not in data:
            raise InputError(cluster_file, "a cluster file is a mapping with at least `hardware` (and gpus_per_node)")
        allowed = {"hardware", "gpus_per_node", "nodes", "intra_node_gbs", "inter_node_gbs"}
        unknown = set(data) - allowed
        if unknown:
            raise InputError(cluster_file, f"unknown key(s) {sorted(unknown)} (allowed: {sorted(allowed)})")
        data["hardware"] = normalize_hardware(str(data["hardware"]))
        if hardware:
            data["hardware"] = normalize_hardware(hardware)
        if gpus_per_node:
            data["gpus_per_node"] = gpus_per_node
        return Cluster(**data)
    if hardware is None:
        return None
    return Cluster(normalize_hardware(hardware), gpus_per_node or 8)


@app.command("predict", help=HELP)
def predict_command(
    config: Optional[Path] = typer.Argument(None, help="Configuration: YAML/JSON of Megatron argument names, or a "
                                                       "Megatron log (its arguments block)."),
    megatron_args: Optional[str] = typer.Option(None, "--megatron-args", help="Megatron command-line arguments."),
    megatron_log: Optional[Path] = typer.Option(None, "--megatron-log", help="Megatron log with its arguments block."),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="GPU hardware id, e.g. A100-SXM4-80GB."),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", min=1, help="GPUs per node (default 8)."),
    cluster_file: Optional[Path] = typer.Option(None, "--cluster", help="Cluster YAML/JSON: hardware, gpus_per_node"
                                                                        ", intra_node_gbs, inter_node_gbs."),
    models_dir: Optional[Path] = typer.Option(None, "--models", help="Model directory (default: bundled models)."),
    calibration: Optional[str] = typer.Option(None, "--calibration", help="Calibration name (shipped: see docs) or "
                                                                          "JSON file; default none."),
    sets: list[str] = typer.Option([], "--set", help="KEY=VALUE Megatron setting that overrides the input (every "
                                                     "row with --batch; repeatable), e.g. --set attention=unfused."),
    batch: Optional[Path] = typer.Option(None, "--batch", help="CSV of configurations (e2e CSV column layout)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output CSV for --batch."),
    trace_out: Optional[Path] = typer.Option(None, "--trace-out", help="Write the predicted timeline as Kineto "
                                                                       "traces (rank-{r}.json) into this folder."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    overrides = _parse_sets(sets)
    with user_errors():
        if batch is not None:
            _batch(batch, out, hardware, gpus_per_node, cluster_file, models_dir, calibration, overrides, as_json)
            return
        sources = [x for x in (config, megatron_args, megatron_log) if x is not None]
        if len(sources) != 1:
            fail("give exactly one of CONFIG, --megatron-args, --megatron-log (or --batch FILE.csv)")
        from tracekit.core.config import TrainingConfig
        from tracekit.core.errors import InputError

        if trace_out is not None and trace_out.exists() and not trace_out.is_dir():
            raise InputError(trace_out, "exists and is not a directory (--trace-out takes a folder for the traces)")
        if config is not None:
            cfg = TrainingConfig.from_file(config)
        elif megatron_args is not None:
            cfg = TrainingConfig.from_megatron_args(megatron_args)
        else:
            try:
                text = megatron_log.read_text(errors="replace")
            except OSError as exc:
                raise InputError(megatron_log, f"cannot read ({exc.strerror or exc})") from exc
            cfg = TrainingConfig.from_megatron_log(text, str(megatron_log))
        if overrides:
            merged = {k: v for k, v in cfg.to_dict().items() if v is not None}
            merged.update(overrides)
            cfg = TrainingConfig.from_mapping(merged)
        cluster = _cluster(hardware, gpus_per_node, cluster_file)
        if cluster is None:
            fail("name the GPU with --hardware ID (e.g. A100-SXM4-80GB) or --cluster FILE")
        from predictor.calibration import load_calibration
        from predictor.models import ModelSet
        from predictor.predict import predict

        cal = load_calibration(calibration)
        models = ModelSet.load(models_dir)
        prediction = predict(cfg, cluster, models, cal)
        written = []
        if trace_out is not None:
            from predictor.trace_out import write_traces

            written = write_traces(prediction, trace_out)
    if as_json:
        doc = prediction.to_dict()
        if written:
            doc["trace_files"] = [str(p) for p in written]
        print_json(doc)
        return
    _print_prediction(prediction)
    if written:
        console.print(f"predicted traces: {', '.join(str(p) for p in written)}")


def _batch(path, out, hardware, gpus_per_node, cluster_file, models_dir, calibration, overrides, as_json) -> None:
    from predictor import batch as B
    from predictor.calibration import load_calibration
    from predictor.models import ModelSet
    from predictor.predict import predict_many

    if out is None:
        fail("--batch needs --out FILE.csv")
    cluster = _cluster(hardware, gpus_per_node, cluster_file)
    header, cells = B.read_rows(path)
    cal = load_calibration(calibration)
    models = ModelSet.load(models_dir)
    rows = [B.parse_row(c, i + 2, cluster.hardware if cluster else None,
                        cluster.gpus_per_node if cluster else gpus_per_node, overrides) for i, c in enumerate(cells)]
    good = [r for r in rows if r.error is None]
    with progress(quiet=as_json) as bar:
        task = bar.add_task("predicting", total=len(rows))
        results = predict_many([r.config for r in good], [r.cluster for r in good], models, cal)
        bar.update(task, completed=len(rows))
    by_line = dict(zip((r.line for r in good), results))
    output, failures, used = [], [], set()
    for r in rows:
        result = by_line.get(r.line)
        if r.error is not None or isinstance(result, Exception):
            message = r.error or str(result)
            output.append(B.output_row(r.cells, error=message))
            failures.append((r.line, message))
        else:
            output.append(B.output_row(r.cells, result))
            used.add(result.hardware_used)
    B.write_rows(out, header, output)
    summary = {"input": str(path), "output": str(out), "rows": len(rows), "predicted": len(rows) - len(failures),
               "failed": [{"line": line, "error": msg} for line, msg in failures], "hardware_used": sorted(used),
               "calibration": cal.name}
    if as_json:
        print_json(summary)
    else:
        console.print(f"{summary['predicted']}/{len(rows)} rows predicted → {out} "
                      f"(hardware models: {', '.join(sorted(used)) or 'none'}; calibration: {cal.name})")
        for line, msg in failures:
            err_console.print(f"error: {path}: line {line}: {msg}", markup=False, soft_wrap=True)
    if failures:
        raise typer.Exit(EXIT_PARTIAL if len(failures) < len(rows) else 2)


def _print_prediction(p) -> None:
    from rich.table import Table

    c = p.config
    console.print(f"[bold]{c.num_layers} layers × h{c.hidden_size}, seq {c.seq_length}, global batch "
                  f"{c.global_batch_size} (micro {c.micro_batch_size}, {c.num_microbatches} micro-batches) on "
                  f"{c.world_size} × {p.cluster.hardware} ({p.cluster.gpus_per_node}/node): tp {c.tp} pp {c.pp} "
                  f"dp {c.dp} cp {c.cp}{' vp ' + str(c.vp) if c.vp > 1 else ''}[/bold]")
    if p.hardware_used != p.cluster.hardware:
        console.print(f"operator models: {p.hardware_used}")
    table = Table(title=f"iteration time {p.iteration_time_s:.4g} s (busiest stage {p.critical_stage})")
    table.add_column("part")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for key, value in p.breakdown.items():
        table.add_row(key.replace("_", " "), f"{value:.4g}", f"{100 * value / p.iteration_time_s:.1f}%")
    console.print(table)
    if p.framework_us:
        console.print("framework time per compute operator (sampled on this CPU, in other): " + ", ".join(
            f"{pass_} {us:.0f} µs" for pass_, us in sorted(p.framework_us.items(), reverse=True)))
    mfu = "n/a" if p.mfu is None else f"{100 * p.mfu:.1f}%"
    console.print(f"{p.tflops_per_gpu:.1f} TFLOP/s per GPU, MFU {mfu}, {p.tokens_per_s:,.0f} tokens/s")
    mem = p.memory_gb_per_gpu
    console.print("memory per GPU: " + ", ".join(f"{k.replace('_', ' ')} {v:.1f} GB" for k, v in mem.items()))
    top = Table(title="top operators (busiest stage, per iteration)")
    for col in ("operator", "pass", "primitive", "seconds", "share"):
        top.add_column(col, justify="right" if col in ("seconds", "share") else "left")
    for op in p.top_operators[:8]:
        top.add_row(op["name"], op["pass"], op["primitive"], f"{op['time_s']:.4g}", f"{100 * op['share']:.1f}%")
    console.print(top)
    if p.fallbacks:
        console.print("fallbacks: " + ", ".join(
            f"{f['variant']} {f['pass']} ({f['path']}{', out of range' if f['out_of_range'] else ''})"
            for f in p.fallbacks[:8]) + (" ..." if len(p.fallbacks) > 8 else ""))
    for w in p.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")
