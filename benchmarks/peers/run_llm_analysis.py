"""Peer runner: llm-analysis 0.2.2 (github.com/cli99/llm-analysis, Apache-2.0) on end-to-end training rows.

Run with the peer's own interpreter, benchmarks/.peers/llm-analysis/bin/python (see setup.sh); never imported by
tracekit. stdin: a JSON list of row dicts (keys in client.py); stdout: a JSON list of
{"id", "iteration_time_s", "error", "notes"} in the same order. Logging goes to stderr. One bad row yields an
"error" for that row only.

Mapping (everything else is the package's default, in particular flops_efficiency = hbm_memory_efficiency = 1.0,
which are NOT tuned on any measured row; benchmarks/peers/README.md has the whole table):
  ModelConfig(num_layers, n_head=num_attention_heads, num_key_value_heads=num_query_groups (GQA; MLA rows: n_head),
              hidden_dim=hidden_size, vocab_size, max_seq_len=seq_length, ffn_embed_dim=ffn_hidden_size (MoE rows:
              the expert's moe_ffn_hidden_size), expansion_ratio=ffn/hidden where that is not a whole number,
              moe_num_experts=num_experts, moe_top_k=moe_router_topk)
  GPUConfig: the package's built-in config of the row's GPU where it ships one (a100-sxm-80gb, h100-sxm-80gb, ...),
             else one built from tracekit's datasheet figures the row carries (gpu_* keys: B200, GB200), with
             intra_node_bandwidth_in_GB_per_sec / inter_node_... set from the row (intra_node_gbs / inter_node_gbs)
  DtypeConfig: w16a16e16 for fp16/bf16, w8a8e16 for the fp8 recipes (fp8, fp8-cs, fp8-block, mxfp8: GEMMs at the
             8-bit peak), w4a4e16 for nvfp4/mxfp4 (the 4-bit peak)
  ParallelismConfig(tp_size=tp, pp_size=pp, dp_size=dp*cp (context parallelism folded into data parallelism: the
             package's latency is per-GPU FLOPs, which CP splits as DP does), ep_size=expert_model_parallel_size,
             sp_size=tp if the row says sequence_parallel else 1)
  LLMAnalysis.training(batch_size_per_gpu=micro_batch_size, global_batch_size, seq_len=seq_length,
             activation_recomputation=NONE|SELECTIVE|FULL, ds_zero=NONE, flash_attn=False)
  -> summary["latency_per_iter"] (seconds).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys

from protocol import positive_int as _int, serve

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # transformers is imported by llm_analysis.config; never fetch
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

DEFAULT_GPU = "A100-SXM4-80GB"  # rows that name no GPU (the protocol's first version)
#: tracekit hardware id -> the package's built-in GPU config (llm_analysis/gpu_configs/*.json, 0.2.2); its A100 and
#: H100 SXM figures are the datasheets' (312 / 989 dense fp16 TFLOP/s; H100's peak_i8 1979 is its dense fp8 peak)
BUILTIN_GPUS = {"A100-SXM4-80GB": "a100-sxm-80gb", "A100-SXM4-40GB": "a100-sxm-40gb",
                "A100-PCIE-80GB": "a100-pcie-80gb", "A100-PCIE-40GB": "a100-pcie-40gb",
                "H100-80GB-HBM3": "h100-sxm-80gb", "H100-PCIE-80GB": "h100-pcie-80gb",
                "V100-SXM2-16GB": "v100-sxm-16gb", "V100-SXM2-32GB": "v100-sxm-32gb"}
INTRA_NODE_LATENCY_S = 8e-6  # the package's intra_node_min_message_latency of every built-in NVIDIA config
#: precision recipe (tracekit.core.precision) -> (DtypeConfig, the datasheet peak the package's GEMM peak stands for)
DTYPES = {"fp16": ("w16a16e16", "fp16"), "bf16": ("w16a16e16", "fp16"),
          "fp8": ("w8a8e16", "fp8"), "fp8-cs": ("w8a8e16", "fp8"), "fp8-block": ("w8a8e16", "fp8"),
          "mxfp8": ("w8a8e16", "fp8"), "nvfp4": ("w4a4e16", "fp4"), "mxfp4": ("w4a4e16", "fp4")}
PEAK_FIELD = {"fp16": "peak_fp16_TFLOPS", "fp8": "peak_i8_TFLOPS", "fp4": "peak_i4_TFLOPS"}
REQUIRED = ("id", "num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
            "global_batch_size", "micro_batch_size", "tp", "pp", "dp")

# What the package's training latency is, read from llm_analysis/analysis.py (0.2.2), said once per row.
MODEL_NOTE = ("llm-analysis 0.2.2 training(): latency_per_iter = (fwd + 2*fwd + recompute FLOPs per micro-batch) / "
              "(tp*pp * GEMM peak of the dtype config * flops_efficiency 1.0 default) * grad-accum steps; no "
              "communication, pipeline bubble, optimizer step or memory-bound op time enters it (intra/inter-node "
              "bandwidth are set on the GPU config but 0.2.2 uses them only in its forward-latency breakdown); MLP "
              "FLOPs are 16*b*s*h^2 (assume ffn = 4h, no gate, no experts); vocab used unpadded")


def _given(row: dict, key: str) -> bool:
    return row.get(key) not in (None, "")


def _true(row: dict, key: str) -> bool:
    return row.get(key) in (True, "true", "True", 1, "1")


def gpu_config(row: dict, C) -> tuple[object, str]:
    """(GPUConfig, note): the package's built-in config of the row's GPU, else one from the row's datasheet figures,
    with the row's link bandwidths."""
    gpu = str(row.get("gpu") or DEFAULT_GPU)
    repl = {}
    if _given(row, "intra_node_gbs"):
        repl["intra_node_bandwidth_in_GB_per_sec"] = float(row["intra_node_gbs"])
    if _given(row, "inter_node_gbs"):
        repl["inter_node_bandwidth_in_GB_per_sec"] = float(row["inter_node_gbs"])
    if gpu in BUILTIN_GPUS:
        cfg = dataclasses.replace(C.get_gpu_config_by_name(BUILTIN_GPUS[gpu]), **repl)
        note = f"gpu={gpu} -> built-in {BUILTIN_GPUS[gpu]}" + ("" if _given(row, "gpu") else " (row names no GPU)")
        return cfg, note
    missing = [k for k in ("gpu_memory_gb", "gpu_mem_bw_gbs", "gpu_peak_tflops_fp16") if not _given(row, k)]
    if missing:
        raise ValueError(f"GPU {gpu}: llm-analysis 0.2.2 ships no config for it and the row carries no datasheet "
                         f"figures ({', '.join(missing)})")
    fp8 = float(row.get("gpu_peak_tflops_fp8") or 0) or None  # None: the package's default (2x fp16)
    fp4 = float(row.get("gpu_peak_tflops_fp4") or 0) or None
    cfg = C.GPUConfig(name=f"datasheet-{gpu}", mem_per_GPU_in_GB=float(row["gpu_memory_gb"]),
                      hbm_bandwidth_in_GB_per_sec=float(row["gpu_mem_bw_gbs"]),
                      intra_node_bandwidth_in_GB_per_sec=repl.get("intra_node_bandwidth_in_GB_per_sec", 0.0),
                      intra_node_min_message_latency=INTRA_NODE_LATENCY_S,
                      peak_fp16_TFLOPS=float(row["gpu_peak_tflops_fp16"]), peak_i8_TFLOPS=fp8, peak_i4_TFLOPS=fp4)
    if "inter_node_bandwidth_in_GB_per_sec" in repl:
        cfg = dataclasses.replace(cfg, inter_node_bandwidth_in_GB_per_sec=repl["inter_node_bandwidth_in_GB_per_sec"])
    note = (f"gpu={gpu}: no built-in config in llm-analysis 0.2.2; GPUConfig built from tracekit's datasheet "
            f"(fp16 {cfg.peak_fp16_TFLOPS:g}, 8-bit {cfg.peak_i8_TFLOPS:g}, 4-bit {cfg.peak_i4_TFLOPS:g} TFLOP/s "
            f"dense, {cfg.hbm_bandwidth_in_GB_per_sec:g} GB/s HBM, {cfg.mem_per_GPU_in_GB:g} GB)")
    return cfg, note


def dtype_config(row: dict, gpu, C) -> tuple[object, str]:
    precision = str(row.get("precision") or "fp16").lower()
    if precision not in DTYPES:
        raise ValueError(f"precision {precision!r}: llm-analysis 0.2.2 models 16-, 8- and 4-bit GEMMs only "
                         "(weight/activation bits 16, 8 or 4)")
    name, peak = DTYPES[precision]
    if peak != "fp16":
        if not _given(row, f"gpu_peak_tflops_{peak}"):
            raise ValueError(f"precision {precision}: the row gives no datasheet {peak} peak (gpu_peak_tflops_{peak}) "
                             f"to stand for the package's {PEAK_FIELD[peak]}")
        sheet = float(row[f"gpu_peak_tflops_{peak}"])
        if sheet <= 0:
            raise ValueError(f"precision {precision}: {row.get('gpu') or DEFAULT_GPU} has no {peak} tensor cores "
                             f"(datasheet), so no peak for the package's {name}")
        if abs(getattr(gpu, PEAK_FIELD[peak]) - sheet) > 0.01 * sheet:
            raise ValueError(f"precision {precision}: the GPU config's {PEAK_FIELD[peak]} "
                             f"{getattr(gpu, PEAK_FIELD[peak]):g} is not the datasheet's dense {peak} peak {sheet:g}")
    note = (f"precision {precision} -> {name} (every FLOP at {PEAK_FIELD[peak]} = {getattr(gpu, PEAK_FIELD[peak]):g} "
            "TFLOP/s" + (": the package's 8-/4-bit peak stands for the fp8/fp4 tensor cores; the recipe's 16-bit "
                         "parts and scaling are not expressible)" if peak != "fp16" else ")"))
    return C.get_dtype_config_by_name(name), note


def predict_row(row: dict, la) -> tuple[float, str]:
    A, C = la
    missing = [k for k in REQUIRED if k not in row]
    if missing:
        raise ValueError(f"missing keys: {', '.join(missing)}")
    L, h, H, s, V = (_int(row, k) for k in ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                                             "vocab_size"))
    ffn = _int(row, "ffn_hidden_size") if _given(row, "ffn_hidden_size") else 4 * h
    gbs, mbs, tp, pp, dp = (_int(row, k) for k in ("global_batch_size", "micro_batch_size", "tp", "pp", "dp"))
    cp = _int(row, "cp") if _given(row, "cp") else 1
    notes = [MODEL_NOTE]
    n = row.get("num_gpus")
    if _given(row, "num_gpus") and int(float(n)) != tp * pp * cp * dp:
        raise ValueError(f"num_gpus={n} != tp*pp*cp*dp={tp * pp * cp * dp}")
    if gbs % (mbs * dp):
        raise ValueError(f"global_batch_size {gbs} is not a multiple of micro_batch_size*dp = {mbs * dp}")
    if cp > 1:
        if gbs % (mbs * dp * cp):
            raise ValueError(f"context parallelism cp={cp} not expressible: folding it into data parallelism needs "
                             f"global_batch_size {gbs} to be a multiple of micro_batch_size*dp*cp = {mbs * dp * cp}")
        notes.append(f"cp={cp} folded into dp ({dp} -> {dp * cp}): same FLOPs per GPU in its compute-only latency; "
                     "CP's attention exchange not expressible")
    recompute = str(row.get("recompute") or "none").lower()
    rc = {"none": A.ActivationRecomputation.NONE, "selective": A.ActivationRecomputation.SELECTIVE,
          "full": A.ActivationRecomputation.FULL}.get(recompute)
    if rc is None:
        raise ValueError(f"recompute {recompute!r} is not none|selective|full")

    kv = _int(row, "num_query_groups") if _given(row, "num_query_groups") else H
    if _true(row, "multi_latent_attention"):
        kv = H
        notes.append("multi-latent attention not expressible: standard attention of hidden_dim with n_head heads")
    if H % kv:
        raise ValueError(f"num_attention_heads {H} not a multiple of num_query_groups {kv} (llm-analysis asserts it)")
    if kv != H:
        notes.append(f"GQA: num_key_value_heads={kv} (its attention FLOPs count K/V projections of h*kv/heads)")
    if _given(row, "kv_channels") and int(float(row["kv_channels"])) * H != h:
        notes.append(f"kv_channels {row['kv_channels']} * heads {H} != hidden {h}: its attention FLOPs use hidden")

    moe_kw = {}
    experts = _int(row, "num_experts") if _given(row, "num_experts") else 1
    ep = 1
    if experts > 1:
        topk = _int(row, "moe_router_topk")
        ffn = _int(row, "moe_ffn_hidden_size") if _given(row, "moe_ffn_hidden_size") else ffn
        ep = _int(row, "expert_model_parallel_size") if _given(row, "expert_model_parallel_size") else 1
        moe_kw = {"moe_num_experts": experts, "moe_top_k": topk}
        extra = []
        shared = int(float(row.get("moe_shared_expert_intermediate_size") or 0))
        if shared:
            extra.append(f"shared expert of {shared}")
        moe_layers = int(float(row.get("moe_layers") or L))
        if moe_layers != L:
            extra.append(f"{L - moe_layers} dense layers (all {L} taken as MoE)")
        etp = int(float(row.get("expert_tensor_parallel_size") or tp))
        if etp != tp:
            extra.append(f"expert TP {etp} != TP {tp}")
        notes.append(f"MoE: {experts} experts top-{topk} of ffn {ffn}, ep_size={ep} (0.2.2 uses them for parameter "
                     "and memory counts only: its latency's MLP FLOPs stay 16*b*s*h^2 per layer, no router, "
                     "dispatch or all-to-all)" + ("; not expressible: " + ", ".join(extra) if extra else ""))
    expansion = {}
    if ffn % h:
        expansion = {"expansion_ratio": ffn / h}  # its assert is for deriving the ratio only; the ratio is given
    if ffn != 4 * h:
        notes.append(f"ffn={ffn} != 4h: its MLP FLOPs still use 4h")
    if _true(row, "swiglu"):
        notes.append("gated (SwiGLU) MLP not expressible: its MLP FLOPs are a plain 2-GEMM MLP of 4h")
    gpn = row.get("gpus_per_node")
    if _given(row, "gpus_per_node") and tp > int(float(gpn)):
        notes.append(f"tp={tp} > gpus_per_node={gpn} (its CLI would refuse this)")

    model = C.ModelConfig(name=f"row-{row['id']}", num_layers=L, n_head=H, num_key_value_heads=kv, hidden_dim=h,
                          vocab_size=V, max_seq_len=s, ffn_embed_dim=ffn, **expansion, **moe_kw)
    gpu, gpu_note = gpu_config(row, C)
    dtype, dtype_note = dtype_config(row, gpu, C)
    notes += [gpu_note, dtype_note]
    sp = tp if _true(row, "sequence_parallel") else 1
    par = C.ParallelismConfig(tp_size=tp, pp_size=pp, dp_size=dp * cp, ep_size=ep, sp_size=sp)
    analysis = A.LLMAnalysis(model, gpu, dtype, par)  # package-default efficiencies (1.0)
    with contextlib.redirect_stdout(sys.stderr):
        summary = analysis.training(batch_size_per_gpu=mbs, global_batch_size=gbs, seq_len=s,
                                    activation_recomputation=rc, ds_zero=A.DSZeRO.NONE, flash_attn=False)
    t = float(summary["latency_per_iter"])
    notes.append(f"intra={gpu.intra_node_bandwidth_in_GB_per_sec:g} inter={gpu.inter_node_bandwidth_in_GB_per_sec:g} "
                 f"GB/s; recompute={rc.name}; grad_accum={summary['gradient_accumulation_steps']}; "
                 f"flops_efficiency={summary['flops_efficiency']:g}")
    if summary.get("memory_left_per_gpu", 0) < 0:
        notes.append(f"llm-analysis's memory model says this config does not fit in {gpu.mem_per_GPU_in_GB:g} GB")
    if pp > 1 and L % pp:
        notes.append(f"num_layers {L} not divisible by pp {pp} (it floors layers per stage for memory only)")
    return t, "; ".join(notes)


def main() -> int:
    la, import_error = None, None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            from llm_analysis import (
                analysis as A,  # noqa: N812
                config as C,  # noqa: N812
            )
            from llm_analysis.logger import logger as la_logger
        la_logger.setLevel(logging.WARNING if os.environ.get("PEER_VERBOSE") else logging.ERROR)
        la = (A, C)
    except Exception as e:  # noqa: BLE001
        import_error = f"llm-analysis does not import in {sys.executable}: {type(e).__name__}: {e}"
    return serve("llm-analysis", lambda row: predict_row(row, la), import_error)


if __name__ == "__main__":
    sys.exit(main())
