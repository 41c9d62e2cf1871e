"""torchtitan job files (`train_configs/*.toml`, torchtitan's JobConfig) as TrainingConfig settings.

What a torchtitan job states, read as torchtitan runs it:

- `[model] name, flavor`: the architecture of a model torchtitan ships (llama3: 8B, 70B, 405B, debugmodel): RMSNorm,
  SwiGLU, RoPE, no biases, untied output, no dropout; ffn = multiple_of·⌈multiplier·⌊8·dim/3⌋ / multiple_of⌉.
  `converters = ["float8"]` (torchao float8 training; `[float8] recipe_name` tensorwise or rowwise) and `["mx"]`
  (mxfp8) set the precision recipe.
- `[training] local_batch_size` (per data-parallel rank; `batch_size` in older versions), `global_batch_size` (−1:
  local · dp; more is gradient accumulation), `seq_len`, `mixed_precision_param` (bfloat16 | float32),
  `mixed_precision_reduce` (float32), `compile` (older versions; `[compile] enable` in newer).
- `[parallelism]`: `data_parallel_shard_degree` (FSDP2 `fully_shard`; −1: the ranks left),
  `data_parallel_replicate_degree` (with shard > 1: HSDP, each replica shards over the shard degree; alone:
  PyTorch's DDP, `replicate` with 100 MB buckets, which torchtitan refuses beside TP or PP),
  `tensor_parallel_degree` (with sequence parallelism and the loss parallel, as torchtitan applies it),
  `enable_async_tensor_parallel` (needs compile), `pipeline_parallel_degree`, `pipeline_parallel_schedule` (1F1B,
  GPipe, Interleaved1F1B in Megatron's orders; LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV in
  PyTorch's, predictor.schedule.zero_bubble), `pipeline_parallel_microbatch_size`, `context_parallel_degree`,
  `fsdp_reshard_after_forward` (default: reshard unless pipelined).
- `[activation_checkpoint] mode` (none | selective | full), `selective_ac_option` ("op": per-op).

Every key of torchtitan's JobConfig is known; the sections and keys that do not change an iteration's time (job,
metrics, checkpoint, optimizer hyper-parameters, ...) are accepted and not used. A key torchtitan does not have is
refused with a suggestion; a setting that changes the time and is not modelled (CPU offload, explicit split points,
a CSV schedule) is refused naming it. The world size is the launch's (`--gpus`): a job's shard degree −1
takes the ranks the other degrees leave.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracekit.core.errors import ConfigError, InputError, did_you_mean
from tracekit.core.megatron_arguments import list_words
from tracekit.core.pipeline_layout import SPLIT_BACKWARD, V_SHAPED, ZERO_BUBBLE

from .torchtitan_runs import split_layers

#: torchtitan's JobConfig, section → keys (2025 layout, with older spellings). Keys tracekit reads are in READ.
SCHEMA: dict[str, tuple[str, ...]] = {
    "job": ("config_file", "dump_folder", "description", "use_for_integration_test", "print_args"),
    "profiling": ("enable_profiling", "save_traces_folder", "profile_freq", "enable_memory_snapshot",
                  "save_memory_snapshot_folder"),
    "metrics": ("log_freq", "enable_tensorboard", "disable_color_printing", "save_tb_folder", "save_for_all_ranks",
                "enable_wandb", "rank_0_only", "enable_color_printing"),
    "model": ("name", "flavor", "tokenizer_path", "hf_assets_path", "converters", "print_after_conversion",
              "norm_type"),
    "optimizer": ("name", "lr", "beta1", "beta2", "eps", "weight_decay", "implementation", "early_step_in_backward"),
    "lr_scheduler": ("warmup_steps", "decay_ratio", "decay_type", "lr_min"),
    "training": ("dataset", "dataset_path", "local_batch_size", "batch_size", "global_batch_size", "seq_len",
                 "max_norm", "steps", "enable_cpu_offload", "mixed_precision_param", "mixed_precision_reduce",
                 "compile", "gc_freq", "gc_debug", "seed", "deterministic", "warmup_steps"),
    "parallelism": ("data_parallel_replicate_degree", "enable_compiled_autograd", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward", "tensor_parallel_degree", "disable_loss_parallel",
                    "enable_async_tensor_parallel", "pipeline_parallel_degree", "pipeline_parallel_split_points",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
                    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size", "context_parallel_degree",
                    "context_parallel_rotate_method", "expert_parallel_degree"),
    "checkpoint": ("enable_checkpoint", "folder", "initial_load_path", "initial_load_model_only", "interval",
                   "interval_type", "last_save_model_only", "model_weights_only", "export_dtype",
                   "create_seed_checkpoint", "async_mode", "keep_latest_k", "load_step", "exclude_from_loading",
                   "enable_first_step_checkpoint", "last_save_in_hf"),
    "activation_checkpoint": ("mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns"),
    "float8": ("enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
               "force_recompute_fp8_weight_in_bwd", "recipe_name", "filter_fqns", "emulate", "moe_fqns_prototype"),
    "mx": ("mxfp8_dim1_cast_kernel_choice", "recipe_name", "filter_fqns"),
    "compile": ("enable", "components", "backend"),
    "comm": ("init_timeout_seconds", "train_timeout_seconds", "trace_buf_size", "save_traces_folder"),
    "memory_estimation": ("enabled", "disable_fake_mode"),
    "fault_tolerance": ("enable", "process_group", "process_group_timeout_ms", "replica_id", "group_size",
                        "min_replica_size", "semi_sync_method", "sync_steps", "should_quantize",
                        "fragment_sync_delay", "fragment_update_alpha"),
    "experimental": ("custom_import", "custom_args_module"),
    "validation": ("enabled", "dataset", "dataset_path", "local_batch_size", "seq_len", "freq", "steps"),
}

#: torchtitan's llama3 flavors (torchtitan/models/llama3): dim, layers, heads, kv heads, ffn multiplier, multiple_of.
LLAMA3 = {
    "debugmodel": (256, 6, 16, 16, None, 256, 2048),
    "8B": (4096, 32, 32, 8, 1.3, 1024, 128256),
    "70B": (8192, 80, 64, 8, 1.3, 4096, 128256),
    "405B": (16384, 126, 128, 8, 1.2, 4096, 128256),
}
MODELS = {"llama3": LLAMA3}
#: What tracekit says of torch.compile (predictor.layers.compile_fusion).
COMPILE_NOTE = ("torch.compile: each block's norms, residual adds, RoPE, activation and dropout chains timed as "
                "Inductor's fused kernels (bytes moved, one launch each); GEMMs and attention as eager; the loss and "
                "compiled-autograd effects not modelled")
#: Schedules in Megatron's orders: one stage per rank (1F1B; GPipe has 1F1B's bubble) or several (interleaved); and
#: PyTorch's own (tracekit.core.pipeline_layout.ZERO_BUBBLE): stages per rank by default (two; the V's exactly two).
SCHEDULES = {"1f1b": 1, "gpipe": 1, "interleaved1f1b": 2, **{name.lower(): 2 for name in ZERO_BUBBLE}}


@dataclass
class Job:
    """A job file read as TrainingConfig settings (Megatron's names) and what was assumed reading it."""

    settings: dict[str, Any]
    stack: str
    notes: list[str] = field(default_factory=list)


def ffn_hidden_dim(dim: int, multiple_of: int, multiplier: float | None) -> int:
    """torchtitan's (and Meta's llama) FFN width: ⅔ of 4·dim, × the multiplier, rounded up to multiple_of."""
    hidden = int(2 * 4 * dim / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def load_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef,import-not-found]
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise InputError(path, f"cannot read ({exc.strerror or exc})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InputError(path, f"not valid TOML ({exc})") from exc
    return data


def check_keys(data: dict[str, Any]) -> None:
    """ConfigError for the first section or key torchtitan's JobConfig does not have, with a suggestion."""
    for section, body in data.items():
        if section not in SCHEMA:
            raise ConfigError(f"unknown section [{section}]{did_you_mean(section, SCHEMA)}: not part of "
                              "torchtitan's job configuration")
        if not isinstance(body, dict):
            raise ConfigError(f"[{section}] must be a table of settings, not {type(body).__name__}")
        for key in body:
            if key not in SCHEMA[section]:
                raise ConfigError(f"unknown setting {section}.{key}{did_you_mean(key, SCHEMA[section])}: not part "
                                  f"of torchtitan's [{section}]")


def read_torchtitan(path: str | Path, world_size: int | None = None) -> Job:
    """A torchtitan TOML job → settings; InputError naming the file for anything that cannot be read or used.
    `world_size`: the launch's GPUs (needed when the shard degree is −1, as torchtitan's defaults have it)."""
    path = Path(path)
    data = load_toml(path)
    try:
        check_keys(data)
        return _settings(data, world_size)
    except ConfigError as exc:
        raise InputError(path, str(exc)) from exc


def _settings(data: dict[str, Any], world_size: int | None) -> Job:
    def get(section: str, key: str, default: Any = None) -> Any:
        return data.get(section, {}).get(key, default)

    notes: list[str] = []
    out: dict[str, Any] = {}
    # -- the model ---------------------------------------------------------------------------------------------
    name, flavor = str(get("model", "name", "llama3")), str(get("model", "flavor", "debugmodel"))
    if name not in MODELS:
        raise ConfigError(f"model.name {name!r}{did_you_mean(name, MODELS)}: tracekit knows torchtitan's "
                          f"{', '.join(MODELS)}")
    flavors = MODELS[name]
    if flavor not in flavors:
        same_but_case = [f for f in flavors if f.lower() == flavor.lower()]
        hint = f" (did you mean {same_but_case[0]!r}?)" if same_but_case else did_you_mean(flavor, flavors)
        raise ConfigError(f"model.flavor {flavor!r}{hint}: {name} flavors are {', '.join(flavors)}")
    dim, layers, heads, kv_heads, multiplier, multiple_of, vocab = flavors[flavor]
    out.update(num_layers=layers, hidden_size=dim, num_attention_heads=heads, num_query_groups=kv_heads,
               ffn_hidden_size=ffn_hidden_dim(dim, multiple_of, multiplier), vocab_size=vocab,
               make_vocab_size_divisible_by=1, normalization="RMSNorm", swiglu=True, position_embedding_type="rope",
               add_bias_linear=False, untie_embeddings_and_output_weights=True, hidden_dropout=0.0,
               attention_dropout=0.0, attention="flash")
    # -- precision -----------------------------------------------------------------------------------------------
    param = str(get("training", "mixed_precision_param", "bfloat16"))
    if param not in ("bfloat16", "float32"):
        raise ConfigError(f"training.mixed_precision_param must be bfloat16 or float32, not {param!r}")
    out["precision"] = "bf16" if param == "bfloat16" else "fp32"
    reduce = str(get("training", "mixed_precision_reduce", "float32"))
    if reduce not in ("float32", "bfloat16"):
        raise ConfigError(f"training.mixed_precision_reduce must be float32 or bfloat16, not {reduce!r}")
    out["accumulate_allreduce_grads_in_fp32"] = reduce == "float32"
    converters = get("model", "converters", []) or []
    if isinstance(converters, str):
        converters = [c.strip() for c in converters.split(",") if c.strip()]
    for converter in converters:
        if converter not in ("float8", "mx"):
            raise ConfigError(f"model.converters {converter!r}{did_you_mean(str(converter), ('float8', 'mx'))}: "
                              "torchtitan's converters are float8 and mx")
        if param != "bfloat16":
            raise ConfigError(f"model.converters {converter}: low-precision GEMMs train from bf16, not {param}")
        out["precision"] = _float8_recipe(data, notes) if converter == "float8" else "mxfp8"
        if converter == "float8" and data.get("float8", {}).get("enable_fsdp_float8_all_gather"):
            out["fp8_param_gather"] = True  # FSDP gathers the linear weights in float8
    if get("training", "enable_cpu_offload", False):
        raise ConfigError("training.enable_cpu_offload: FSDP's CPU offload is not modelled (parameters and "
                          "optimizer state over PCIe)")
    # -- batch -----------------------------------------------------------------------------------------------------
    seq = int(get("training", "seq_len", 2048))
    local = get("training", "local_batch_size", get("training", "batch_size", 8))
    out["seq_length"] = seq
    # -- parallelism ------------------------------------------------------------------------------------------------
    tp = int(get("parallelism", "tensor_parallel_degree", 1))
    pp = int(get("parallelism", "pipeline_parallel_degree", 1))
    cp = int(get("parallelism", "context_parallel_degree", 1))
    replicate = int(get("parallelism", "data_parallel_replicate_degree", 1))
    shard = int(get("parallelism", "data_parallel_shard_degree", -1))
    if int(get("parallelism", "expert_parallel_degree", 1)) > 1:
        raise ConfigError("parallelism.expert_parallel_degree > 1: the llama models have no experts")
    for key, value in (("tensor_parallel_degree", tp), ("pipeline_parallel_degree", pp),
                       ("context_parallel_degree", cp), ("data_parallel_replicate_degree", replicate)):
        if value < 1:
            raise ConfigError(f"parallelism.{key} must be ≥ 1, got {value}")
    if shard == -1:
        if world_size is None:
            raise ConfigError("parallelism.data_parallel_shard_degree -1 takes the GPUs the other degrees leave: "
                              "give the job's GPUs (--gpus)")
        if world_size % (replicate * tp * pp * cp):
            raise ConfigError(f"{world_size} GPUs are not divisible by replicate·tp·pp·cp = "
                              f"{replicate * tp * pp * cp}")
        shard = world_size // (replicate * tp * pp * cp)
    elif shard < 1:
        raise ConfigError(f"parallelism.data_parallel_shard_degree must be ≥ 1 or −1, got {shard}")
    world = replicate * shard * tp * pp * cp
    if world_size is not None and world_size != world:
        raise ConfigError(f"the degrees make replicate·shard·tp·pp·cp = {replicate}·{shard}·{tp}·{pp}·{cp} = "
                          f"{world} GPUs, but the job has {world_size}")
    dp = replicate * shard
    out.update(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp,
               data_parallel_size=dp, world_size=world, sequence_parallel=tp > 1)
    if get("parallelism", "disable_loss_parallel", False) and tp > 1:
        notes.append("parallelism.disable_loss_parallel: the loss is modelled vocabulary-parallel all the same")
    if replicate > 1 and shard == 1 and cp == 1:  # torchtitan's apply_ddp: `replicate` over a 1-D mesh only
        if tp > 1 or pp > 1:
            raise ConfigError(f"parallelism.data_parallel_replicate_degree {replicate} without sharding is "
                              f"torchtitan's DDP, which refuses tensor_parallel_degree {tp} / "
                              f"pipeline_parallel_degree {pp}: \"DDP has not supported > 1D parallelism\"")
        out["sharded_data_parallel"] = "torch-ddp"
    if shard > 1 or cp > 1:  # torchtitan applies fully_shard over dp_shard × cp
        out["sharded_data_parallel"] = "torch-fsdp2"
        out["data_parallel_sharding_strategy"] = "optim_grads_params"
        out["num_distributed_optimizer_instances"] = replicate
        policy = str(get("parallelism", "fsdp_reshard_after_forward", "default"))
        if policy not in ("default", "always", "never"):
            raise ConfigError(f"parallelism.fsdp_reshard_after_forward must be default, always or never, not "
                              f"{policy!r}")
        out["torch_fsdp2_reshard_after_forward"] = policy == "always" or (policy == "default" and pp == 1)
    if cp > 1:
        notes.append("context parallel: FSDP shards over dp_shard × cp in torchtitan; modelled over dp_shard, the "
                     "ring attention as ring P2P exchanges")
    compile_on = bool(get("compile", "enable", get("training", "compile", False)))
    components = list_words(get("compile", "components", ["model", "loss"])) or ()
    unknown = [c for c in components if c not in ("model", "loss")]
    if unknown:
        raise ConfigError(f"compile.components {unknown[0]!r}{did_you_mean(str(unknown[0]), ('model', 'loss'))}: "
                          "torchtitan compiles the model and the loss")
    if compile_on and "model" in components:  # per transformer block (torchtitan's apply_compile)
        out["torch_compile"] = True
        notes.append(COMPILE_NOTE)
    elif compile_on:
        notes.append("torch.compile of the loss only: not modelled (the blocks run eager)")
    if get("parallelism", "enable_async_tensor_parallel", False) and tp > 1:
        if not compile_on:
            raise ConfigError("parallelism.enable_async_tensor_parallel needs torch.compile ([compile] enable), as "
                              "torchtitan requires")
        out["tp_comm_overlap"] = True
    # batch: with PP a rank's local batch is cut into pipeline micro-batches
    global_batch = int(get("training", "global_batch_size", -1))
    local = int(local)
    if pp > 1:
        micro = int(get("parallelism", "pipeline_parallel_microbatch_size", 1))
        if local % micro:
            raise ConfigError(f"training.local_batch_size {local} is not divisible by "
                              f"parallelism.pipeline_parallel_microbatch_size {micro}")
        _schedule(data, pp, layers, out, notes)
    else:
        micro = local
    out["micro_batch_size"] = micro
    out["global_batch_size"] = global_batch if global_batch > 0 else local * dp
    if out["global_batch_size"] % (local * dp):
        raise ConfigError(f"training.global_batch_size {global_batch} is not a multiple of local_batch_size·dp = "
                          f"{local}·{dp} (gradient accumulation steps must be whole)")
    # -- activation checkpointing ---------------------------------------------------------------------------------
    mode = str(get("activation_checkpoint", "mode", "selective"))
    if mode not in ("none", "selective", "full"):
        raise ConfigError(f"activation_checkpoint.mode must be none, selective or full, not {mode!r}")
    if mode == "selective":
        option = str(get("activation_checkpoint", "selective_ac_option", "2"))
        if option != "op" and not option.isdigit():
            raise ConfigError(f"activation_checkpoint.selective_ac_option must be 'op' or a layer interval, not "
                              f"{option!r}")
        if option == "op":
            out.update(recompute_granularity="selective", recompute_modules=("per_op",))
        else:  # full checkpointing of every n-th layer: as many layers of each chunk replayed in full
            every = int(option)
            if every < 1:
                raise ConfigError("activation_checkpoint.selective_ac_option must be ≥ 1")
            per_chunk = layers // (pp * int(out.get("virtual_pipeline_model_parallel_size") or 1))
            out.update(recompute_granularity="full", recompute_method="block",
                       recompute_num_layers=max(1, -(-per_chunk // every)))
    else:
        out["recompute_granularity"] = mode
    return Job(out, "torchtitan", notes)


def _float8_recipe(data: dict[str, Any], notes: list[str]) -> str:
    """torchao's float8 recipe as tracekit's: tensorwise is per-tensor current scaling; the rowwise recipes (a scale
    per row) are timed as fp8 with fine-grained scales (fp8-block: a scale per 128 elements)."""
    recipe = data.get("float8", {}).get("recipe_name") or "tensorwise"
    names = {"tensorwise": "fp8-cs", "rowwise": "fp8-block", "rowwise_with_gw_hp": "fp8-block"}
    if recipe in ("rowwise", "rowwise_with_gw_hp"):
        notes.append(f"float8 {recipe}: timed as fp8 with fine-grained scales (the fp8-block recipe: a scale per 128 "
                     "elements, torchao's a scale per row)")
    if recipe not in names:
        raise ConfigError(f"float8.recipe_name {recipe!r}{did_you_mean(str(recipe), names)}: torchao's recipes are "
                          f"{', '.join(names)}")
    if data.get("float8", {}).get("emulate"):
        raise ConfigError("float8.emulate: emulated float8 (no fp8 tensor cores) is not modelled")
    return names[recipe]


def _schedule(data: dict[str, Any], pp: int, layers: int, out: dict[str, Any], notes: list[str]) -> None:
    """torchtitan's pipeline schedule and stage split as Megatron's settings."""
    par = data.get("parallelism", {})
    schedule = str(par.get("pipeline_parallel_schedule", "1F1B"))
    if par.get("pipeline_parallel_split_points") or par.get("pipeline_parallel_schedule_csv"):
        raise ConfigError("parallelism.pipeline_parallel_split_points / schedule_csv: explicit splits are not read; "
                          "give pipeline_parallel_layers_per_stage or leave the split to torchtitan")
    key = schedule.lower().removeprefix("schedule")
    names = ["1F1B", "GPipe", "Interleaved1F1B", *ZERO_BUBBLE]
    if key not in SCHEDULES:
        raise ConfigError(f"parallelism.pipeline_parallel_schedule {schedule!r}{did_you_mean(schedule, names)}: "
                          f"torchtitan's schedules are {', '.join(names)}")
    pytorch = next((name for name in ZERO_BUBBLE if name.lower() == key), None)
    if pytorch in SPLIT_BACKWARD and out.get("torch_compile"):
        raise ConfigError(f"parallelism.pipeline_parallel_schedule {pytorch} with torch.compile: PyTorch refuses it "
                          "(its input/weight backward split does not run compiled stages)")
    if pytorch:
        out["torch_pipeline_schedule"] = pytorch
        if pytorch == "DualPipeV":
            notes.append("pipeline schedule DualPipeV: its overlapped forward/backward pairs timed one after the "
                         "other, as PyTorch runs them without a custom overlap function")
    if key == "gpipe":
        notes.append("pipeline schedule GPipe: simulated as 1F1B (the same bubble; GPipe holds every micro-batch's "
                     "activations)")
    per_rank = SCHEDULES[key]
    per_stage = par.get("pipeline_parallel_layers_per_stage")
    # torchtitan counts the embedding and the output layer as one layer each when it splits the model
    units = layers + 2
    stages = math.ceil(units / int(per_stage)) if per_stage else pp * per_rank
    if stages % pp:
        raise ConfigError(f"{stages} pipeline stages do not divide over pipeline_parallel_degree {pp}")
    sizes = split_layers(layers, stages)
    out["pipeline_model_parallel_layout"] = "|".join(
        ("E" if s == 0 else "") + (f"t*{n}" if n else "") + ("L" if s == stages - 1 else "")
        for s, n in enumerate(sizes))
    if stages // pp > 1:
        out["virtual_pipeline_model_parallel_size"] = stages // pp
    elif key == "interleaved1f1b":
        raise ConfigError("Interleaved1F1B needs more than one stage per rank: pipeline_parallel_layers_per_stage "
                          "leaves one")
    if pytorch in V_SHAPED and stages != 2 * pp:
        raise ConfigError(f"{pytorch} places exactly two stages per rank (a V): pipeline_parallel_layers_per_stage "
                          f"leaves {stages} stages over {pp} ranks")
