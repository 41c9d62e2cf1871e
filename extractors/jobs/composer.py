"""llm-foundry / Composer training YAMLs (`scripts/train/yamls/pretrain/mpt-*.yaml`) as TrainingConfig settings.

What such a YAML states, read as Composer runs it:

- `model` (`name: mpt_causal_lm`): `d_model`, `n_heads`, `n_layers`, `expansion_ratio` (or
  `ffn_config.ffn_hidden_size`), `max_seq_len`, `vocab_size`, `no_bias`, `norm_type` (layernorm variants | rmsnorm),
  `learned_pos_emb`, `tie_word_embeddings`, `resid_pdrop`/`emb_pdrop`, `attn_config` (`attn_impl` flash | triton |
  torch, `kv_n_heads` with grouped-query attention, `rope`, `alibi`, `attn_pdrop`), `ffn_config.ffn_type` (mptmlp:
  GeLU | mptglu: SwiGLU), `loss_fn` (fused_crossentropy: flash-attn's, the default | torch_crossentropy: what
  the loss holds in memory). Hugging Face models (`hf_causal_lm`) take their shapes from the Hub and are refused.
- `global_train_batch_size`, `device_train_microbatch_size` (a number; `auto` is refused: Composer picks it at run
  time), `precision` (amp_bf16 | amp_fp16 | amp_fp8 | fp32), `max_seq_len`.
- `fsdp_config`: `sharding_strategy` (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD: shard inside a node,
  _HYBRID_SHARD_ZERO2, NO_SHARD), `mixed_precision` (DEFAULT: gradients reduced in fp32; PURE: in bf16),
  `activation_checkpointing` (whole blocks), `data_parallel_shard_degree` / `data_parallel_replicate_degree` or
  `device_mesh: [replicate, shard]` (HSDP). No `fsdp_config`: PyTorch's DDP as Composer runs it
  (`ddp_sync_strategy` SINGLE_AUTO_SYNC, its default: `no_sync` for all but the last micro-batch, whose backward
  reduces the gradients in DDP's 25 MB buckets as they fill) — Megatron's bucketed, overlapped DDP at that bucket
  size (fp32 gradients: 6,553,600 elements).
- `compile_config` (torch.compile: the blocks as Inductor's fused kernels, predictor.layers.compile_fusion; FSDP's hooks
  cut the graph at each wrapped block, so the blocks compile one by one as torchtitan's do).

`${name}` / `${variables.name}` references are resolved as OmegaConf does for the plain cases. Every Composer and
llm-foundry training key is known; those that do not change an iteration's time (data, logging, checkpoints,
optimizer hyper-parameters, evaluation) are accepted and not used; an unknown key is refused with a suggestion;
settings that change the time and are not modelled (CPU offload, FULL mixed precision, backward prefetch other than
BACKWARD_PRE) are refused naming them. The world size is the launch's (`--gpus`).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from extractors.jobs.torchtitan import COMPILE_NOTE, Job
from tracekit.core.errors import ConfigError, InputError, did_you_mean
from tracekit.core.sharding import TORCH_DDP_BUCKET_BYTES
from tracekit.core.yaml_file import read_yaml

#: Top-level keys of llm-foundry's train config (and Composer's Trainer arguments it passes through).
TOP = ("model", "tokenizer", "optimizer", "scheduler", "train_loader", "eval_loader", "eval_loaders", "icl_tasks",
       "icl_tasks_str", "eval_gauntlet", "eval_gauntlet_str", "icl_subset_num_batches", "icl_seq_len",
       "fsdp_config", "tp_config", "parallelism_config", "max_duration", "save_interval", "save_folder",
       "save_num_checkpoints_to_keep", "save_filename", "save_latest_filename", "save_overwrite",
       "save_weights_only", "save_ignore_keys", "load_path", "load_weights_only", "load_strict_model_weights",
       "load_ignore_keys", "autoresume", "run_name", "dist_timeout", "seed", "global_seed",
       "global_train_batch_size", "device_train_batch_size", "device_train_microbatch_size",
       "device_train_grad_accum", "eval_interval", "eval_first", "eval_subset_num_batches", "device_eval_batch_size",
       "precision", "algorithms", "callbacks", "loggers", "progress_bar", "log_to_console", "console_log_interval",
       "python_log_level", "log_config", "hf_save_path", "spin_dataloaders", "compile_config", "metadata",
       "profiler", "code_paths", "variables", "max_seq_len", "data_local", "data_remote", "max_split_size_mb",
       "expandable_segments", "cuda_load_lazy", "eval_timeout", "timeout", "dataset",
       "accumulate_train_batch_on_tokens")
#: Keys under `model` for MPT (llm-foundry's MPTConfig) and the llm-foundry model wrapper.
MODEL = ("name", "d_model", "n_heads", "n_layers", "expansion_ratio", "max_seq_len", "vocab_size", "resid_pdrop",
         "emb_pdrop", "learned_pos_emb", "attn_config", "ffn_config", "init_device", "logit_scale", "no_bias",
         "embedding_fraction", "norm_type", "norm_eps", "use_cache", "init_config", "fc_type",
         "tie_word_embeddings", "use_pad_tok_in_ffn", "block_overrides", "final_logit_softcapping", "loss_fn",
         "z_loss", "verbose", "pretrained", "pretrained_model_name_or_path", "init_std", "use_train_metrics",
         "additional_train_metrics", "additional_eval_metrics", "shift_labels")
ATTN = ("attn_type", "attn_pdrop", "attn_impl", "qk_ln", "qk_gn", "fused_qkv", "clip_qkv", "softmax_scale",
        "attn_uses_sequence_id", "sliding_window_size", "alibi", "alibi_bias_max", "rope", "rope_theta", "rope_impl",
        "rope_dail_config", "rope_hf_config", "kv_n_heads", "kv_dim", "reuse_kv_layer_idx", "attn_logit_softcapping",
        "flex_attn_config", "prefix_lm")
FFN = ("ffn_type", "ffn_hidden_size", "ffn_act_fn", "fc_type", "bias")
FSDP = ("sharding_strategy", "mixed_precision", "activation_checkpointing", "activation_checkpointing_reentrant",
        "activation_cpu_offload", "auto_wrap", "te_checkpoint_wrapper", "te_shard_fp8_weight", "backward_prefetch",
        "backward_prefetch_limit", "cpu_offload", "data_parallel_shard_degree", "data_parallel_replicate_degree",
        "forward_prefetch", "forward_prefetch_limit", "ignored_modules", "keep_low_precision_grads",
        "limit_all_gathers", "load_monolith_rank0_only", "load_planner", "process_group", "save_planner",
        "sharded_ckpt_prefix_dir", "state_dict_type", "sync_module_states", "use_orig_params", "verbose",
        "device_mesh", "reshard_after_forward", "mixed_precision_dtype")
STRATEGY = {"FULL_SHARD": ("optim_grads_params", True), "SHARD_GRAD_OP": ("optim_grads_params", False),
            "HYBRID_SHARD": ("optim_grads_params", True), "_HYBRID_SHARD_ZERO2": ("optim_grads_params", False),
            "NO_SHARD": ("no_shard", True)}
PRECISION = {"amp_bf16": "amp_bf16", "amp_fp16": "amp_fp16", "amp_fp8": "amp_fp8", "fp32": "fp32"}
_REF = re.compile(r"\$\{([^}]+)\}")


#: llm-foundry's `model.loss_fn` → the cross-entropy implementation whose memory tracekit counts.
LOSS_FNS = {"fused_crossentropy": "flash_attn", "torch_crossentropy": "torch"}

def is_composer(data: Any) -> bool:
    """A mapping shaped like a Composer/llm-foundry training YAML (not a mapping of Megatron arguments)."""
    return isinstance(data, dict) and isinstance(data.get("model"), dict) and (
        "global_train_batch_size" in data or "device_train_microbatch_size" in data or "fsdp_config" in data
        or "name" in data["model"])


def resolve(data: Any, root: dict[str, Any], depth: int = 0) -> Any:
    """`${a.b}` references resolved against the document (a whole-value reference keeps the referred type)."""
    if depth > 20:
        raise ConfigError("reference cycle in ${...} interpolations")
    if isinstance(data, dict):
        return {k: resolve(v, root, depth) for k, v in data.items()}
    if isinstance(data, list):
        return [resolve(v, root, depth) for v in data]
    if not isinstance(data, str) or "${" not in data:
        return data

    def lookup(name: str) -> Any:
        node: Any = root
        for part in name.strip().split("."):
            if not isinstance(node, dict) or part not in node:
                raise ConfigError(f"${{{name}}} refers to nothing in the file")
            node = node[part]
        return resolve(node, root, depth + 1)

    whole = _REF.fullmatch(data.strip())
    if whole:
        return lookup(whole.group(1))
    return _REF.sub(lambda m: str(lookup(m.group(1))), data)


def _check(section: str, body: Any, known: tuple[str, ...]) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise ConfigError(f"{section} must be a mapping, not {type(body).__name__}")
    for key in body:
        if key not in known:
            where = f"{section}." if section else ""
            raise ConfigError(f"unknown setting {where}{key}{did_you_mean(str(key), known)}: not a "
                              f"{'Composer/llm-foundry training' if not section else section} key")
    return body


def read_composer(path: str | Path, world_size: int | None = None, gpus_per_node: int | None = None,
                  data: dict[str, Any] | None = None) -> Job:
    """A Composer/llm-foundry YAML → settings; InputError naming the file for anything that cannot be used.
    `world_size` is the launch's GPUs (required: the YAML does not say); `gpus_per_node` places HYBRID_SHARD's
    shard group (one node)."""
    path = Path(path)
    if data is None:
        data = read_yaml(path)
    if not isinstance(data, dict):
        raise InputError(path, "a Composer training YAML is a mapping")
    try:
        return _settings(resolve(data, data), world_size, gpus_per_node)
    except ConfigError as exc:
        raise InputError(path, str(exc)) from exc


def _settings(data: dict[str, Any], world_size: int | None, gpus_per_node: int | None) -> Job:
    _check("", data, TOP)
    notes: list[str] = []
    model = _check("model", data.get("model"), MODEL)
    name = str(model.get("name", ""))
    if name != "mpt_causal_lm":
        raise ConfigError(f"model.name {name!r}: tracekit reads llm-foundry's mpt_causal_lm; Hugging Face models "
                          "(hf_causal_lm) take their shapes from the Hub, which tracekit does not reach")
    attn = _check("model.attn_config", model.get("attn_config"), ATTN)
    ffn = _check("model.ffn_config", model.get("ffn_config"), FFN)
    for key in ("d_model", "n_heads", "n_layers"):
        if key not in model:
            raise ConfigError(f"model.{key} is missing (MPT has no default worth predicting with)")
    d_model, heads = int(model["d_model"]), int(model["n_heads"])
    out: dict[str, Any] = dict(num_layers=int(model["n_layers"]), hidden_size=d_model, num_attention_heads=heads,
                               vocab_size=int(model.get("vocab_size", 50368)), make_vocab_size_divisible_by=1)
    seq = model.get("max_seq_len", data.get("max_seq_len", 2048))
    out["seq_length"] = int(seq)
    ffn_type = str(ffn.get("ffn_type", "mptmlp"))
    if ffn_type not in ("mptmlp", "mptglu"):
        raise ConfigError(f"model.ffn_config.ffn_type {ffn_type!r}: tracekit models mptmlp and mptglu (dense FFNs)")
    out["swiglu"] = ffn_type == "mptglu"
    out["ffn_hidden_size"] = int(ffn.get("ffn_hidden_size") or float(model.get("expansion_ratio", 4)) * d_model)
    attn_type = str(attn.get("attn_type", "multihead_attention"))
    if attn_type == "grouped_query_attention":
        out["num_query_groups"] = int(attn.get("kv_n_heads", heads))
    elif attn_type == "multiquery_attention":
        out["num_query_groups"] = 1
    elif attn_type != "multihead_attention":
        raise ConfigError(f"model.attn_config.attn_type {attn_type!r}: not a dense attention tracekit models")
    impl = str(attn.get("attn_impl", "flash"))
    if impl not in ("flash", "triton", "torch"):
        raise ConfigError(f"model.attn_config.attn_impl {impl!r}{did_you_mean(impl, ('flash', 'triton', 'torch'))}")
    out["attention"] = "unfused" if impl == "torch" else "flash"
    if impl == "triton":
        notes.append("attn_impl triton: timed as a flash-attention kernel (the stack profile scales it)")
    if attn.get("rope"):
        out["position_embedding_type"] = "rope"
    elif model.get("learned_pos_emb", True):
        out["position_embedding_type"] = "learned_absolute"
    else:
        raise ConfigError("model.learned_pos_emb false without rope: position embeddings tracekit does not model")
    if attn.get("alibi"):
        notes.append("ALiBi: its bias is added inside the attention kernel (no operator of its own)")
    norm = str(model.get("norm_type", "low_precision_layernorm")).lower()
    out["normalization"] = "RMSNorm" if "rms" in norm else "LayerNorm"
    out["add_bias_linear"] = not model.get("no_bias", False)
    out["untie_embeddings_and_output_weights"] = not model.get("tie_word_embeddings", True)
    out["hidden_dropout"] = float(model.get("resid_pdrop", 0.0))
    out["attention_dropout"] = float(attn.get("attn_pdrop", 0.0))
    loss = str(model.get("loss_fn", "fused_crossentropy"))
    if loss not in LOSS_FNS:
        raise ConfigError(f"model.loss_fn {loss!r}{did_you_mean(loss, LOSS_FNS)}: llm-foundry's are "
                          f"{', '.join(LOSS_FNS)}")
    out["cross_entropy_loss_fusion"] = True  # what the loss keeps at its peak (predictor.memory.stages.LOSS_BYTES)
    out["cross_entropy_fusion_impl"] = LOSS_FNS[loss]
    # -- batch and precision -----------------------------------------------------------------------------------
    if "global_train_batch_size" not in data:
        raise ConfigError("global_train_batch_size is missing")
    micro = data.get("device_train_microbatch_size", data.get("device_train_batch_size"))
    if micro is None or str(micro) == "auto":
        raise ConfigError("device_train_microbatch_size: give a number (auto is chosen by Composer at run time)")
    out["global_batch_size"] = int(data["global_train_batch_size"])
    out["micro_batch_size"] = int(micro)
    precision = str(data.get("precision", "amp_bf16"))
    if precision not in PRECISION:
        raise ConfigError(f"precision {precision!r}{did_you_mean(precision, PRECISION)}: Composer's are "
                          f"{', '.join(PRECISION)}")
    out["precision"] = PRECISION[precision]
    if data.get("compile_config") is not None:  # FSDP's hooks break the graph at each wrapped block
        out["torch_compile"] = True
        notes.append(COMPILE_NOTE)
    if data.get("tp_config") or data.get("parallelism_config"):
        raise ConfigError("tp_config / parallelism_config: Composer's tensor parallelism is not read")
    # -- data parallelism -------------------------------------------------------------------------------------------
    if world_size is None:
        raise ConfigError("a Composer YAML does not state the GPUs it runs on: give them (--gpus)")
    out["world_size"] = world_size
    fsdp = _check("fsdp_config", data.get("fsdp_config"), FSDP)
    if "fsdp_config" in data:
        _fsdp(fsdp, world_size, gpus_per_node, out, notes)
    elif world_size > 1:  # PyTorch DDP, synchronising the last micro-batch only (module docstring)
        out["overlap_grad_reduce"] = True
        out["ddp_bucket_size"] = TORCH_DDP_BUCKET_BYTES // 4
        out["torch_ddp_reducer"] = True
        notes.append("no fsdp_config: PyTorch's DDP, the last micro-batch's backward reducing the gradients in "
                     "25 MB buckets")
    return Job(out, "composer", notes)


def _fsdp(fsdp: dict[str, Any], world: int, gpus_per_node: int | None, out: dict[str, Any], notes: list[str]) -> None:
    strategy = str(fsdp.get("sharding_strategy", "FULL_SHARD")).upper()
    if strategy not in STRATEGY:
        raise ConfigError(f"fsdp_config.sharding_strategy {strategy!r}{did_you_mean(strategy, STRATEGY)}")
    for key in ("cpu_offload", "activation_cpu_offload"):
        if fsdp.get(key):
            raise ConfigError(f"fsdp_config.{key}: offloading to the CPU is not modelled")
    prefetch = str(fsdp.get("backward_prefetch", "BACKWARD_PRE")).upper()
    if prefetch != "BACKWARD_PRE":
        raise ConfigError(f"fsdp_config.backward_prefetch {prefetch}: only FSDP's default BACKWARD_PRE (the next "
                          "unit's all-gather beside the current unit's backward) is modelled")
    mixed = str(fsdp.get("mixed_precision", "DEFAULT")).upper()
    if mixed not in ("DEFAULT", "PURE"):
        raise ConfigError(f"fsdp_config.mixed_precision {mixed}: DEFAULT (bf16 parameters, fp32 gradient "
                          "reduction) and PURE (bf16 both) are modelled")
    out["accumulate_allreduce_grads_in_fp32"] = mixed == "DEFAULT"
    if fsdp.get("activation_checkpointing"):
        out["recompute_granularity"] = "full"
    stage, reshard = STRATEGY[strategy]
    out["sharded_data_parallel"] = "torch-fsdp1"
    out["data_parallel_sharding_strategy"] = stage
    out["torch_fsdp2_reshard_after_forward"] = reshard
    if "reshard_after_forward" in fsdp:
        out["torch_fsdp2_reshard_after_forward"] = bool(fsdp["reshard_after_forward"])
    replicate = fsdp.get("data_parallel_replicate_degree")
    shard = fsdp.get("data_parallel_shard_degree")
    mesh = fsdp.get("device_mesh")
    if mesh is not None:
        if not isinstance(mesh, list) or not 1 <= len(mesh) <= 2:
            raise ConfigError("fsdp_config.device_mesh is [shard] or [replicate, shard]")
        replicate, shard = (mesh[0], mesh[1]) if len(mesh) == 2 else (1, mesh[0])
    if strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2") and replicate is None and shard is None:
        if gpus_per_node is None:
            raise ConfigError(f"{strategy} shards inside a node: give the GPUs per node (--gpus-per-node)")
        shard = min(gpus_per_node, world)
        notes.append(f"{strategy}: each node's {shard} GPUs shard, the nodes replicate")
    if shard is not None or replicate is not None:
        shard = int(shard) if shard not in (None, -1) else world // int(replicate or 1)
        replicate = int(replicate) if replicate not in (None, -1) else world // shard
        if replicate * shard != world:
            raise ConfigError(f"data-parallel replicate·shard = {replicate}·{shard} ≠ the job's {world} GPUs")
        if replicate > 1 and stage != "no_shard":
            out["num_distributed_optimizer_instances"] = replicate
