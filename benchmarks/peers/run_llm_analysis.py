"""Peer runner: llm-analysis 0.2.2 (github.com/cli99/llm-analysis, Apache-2.0) on end-to-end training rows.

Run with the peer's own interpreter, benchmarks/.peers/llm-analysis/bin/python (see setup.sh); never imported by
tracekit. stdin: a JSON list of row dicts (keys in client.py); stdout: a JSON list of
{"id", "iteration_time_s", "error", "notes"} in the same order. Logging goes to stderr. One bad row yields an
"error" for that row only.

Mapping (everything else is the package's default, in particular flops_efficiency = hbm_memory_efficiency = 1.0,
which are NOT tuned on any measured row):
  ModelConfig(num_layers, n_head=num_attention_heads, hidden_dim=hidden_size, vocab_size, max_seq_len=seq_length,
              ffn_embed_dim=ffn_hidden_size)
  GPUConfig: the package's built-in "a100-sxm-80gb" with intra_node_bandwidth_in_GB_per_sec / inter_node_... set
             from the row (intra_node_gbs / inter_node_gbs)
  DtypeConfig "w16a16e16" for fp16/bf16; ParallelismConfig(tp_size=tp, pp_size=pp, dp_size=dp, sp_size=tp if the
             row says sequence_parallel else 1)
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

GPU_CONFIG = "a100-sxm-80gb"
DTYPE_CONFIG = "w16a16e16"
REQUIRED = ("id", "num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
            "global_batch_size", "micro_batch_size", "tp", "pp", "dp")

# What the package's training latency is, read from llm_analysis/analysis.py (0.2.2), said once per row.
MODEL_NOTE = ("llm-analysis 0.2.2 training(): latency_per_iter = (fwd + 2*fwd + recompute FLOPs per micro-batch) / "
              "(tp*pp * 312 TFLOP/s * flops_efficiency 1.0 default) * grad-accum steps; no communication, pipeline "
              "bubble, optimizer step or memory-bound op time enters it (intra/inter-node bandwidth are set on the "
              "GPU config but 0.2.2 uses them only in its forward-latency breakdown); MLP FLOPs are 16*b*s*h^2 "
              "(assume ffn = 4h); vocab used unpadded")


def predict_row(row: dict, la) -> tuple[float, str]:
    A, C = la
    missing = [k for k in REQUIRED if k not in row]
    if missing:
        raise ValueError(f"missing keys: {', '.join(missing)}")
    L, h, H, s, V = (_int(row, k) for k in ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                                             "vocab_size"))
    ffn = _int(row, "ffn_hidden_size") if row.get("ffn_hidden_size") not in (None, "") else 4 * h
    gbs, mbs, tp, pp, dp = (_int(row, k) for k in ("global_batch_size", "micro_batch_size", "tp", "pp", "dp"))
    notes = [MODEL_NOTE]
    n = row.get("num_gpus")
    if n not in (None, "") and int(float(n)) != tp * pp * dp:
        raise ValueError(f"num_gpus={n} != tp*pp*dp={tp * pp * dp}")
    if gbs % (mbs * dp):
        raise ValueError(f"global_batch_size {gbs} is not a multiple of micro_batch_size*dp = {mbs * dp}")
    precision = str(row.get("precision") or "fp16").lower()
    if precision not in ("fp16", "bf16"):
        raise ValueError(f"precision {precision!r}: llm-analysis models 16-bit (w16a16) training only here")
    if precision == "bf16":
        notes.append("bf16 run as w16a16e16 (same A100 tensor peak)")
    recompute = str(row.get("recompute") or "none").lower()
    rc = {"none": A.ActivationRecomputation.NONE, "selective": A.ActivationRecomputation.SELECTIVE,
          "full": A.ActivationRecomputation.FULL}.get(recompute)
    if rc is None:
        raise ValueError(f"recompute {recompute!r} is not none|selective|full")
    if ffn % h:
        raise ValueError(f"ffn_hidden_size {ffn} not a multiple of hidden_size {h} (llm-analysis asserts it)")
    if ffn != 4 * h:
        notes.append(f"ffn={ffn} != 4h: its MLP FLOPs still use 4h")
    gpn = row.get("gpus_per_node")
    if gpn not in (None, "") and tp > int(float(gpn)):
        notes.append(f"tp={tp} > gpus_per_node={gpn} (its CLI would refuse this)")

    model = C.ModelConfig(name=f"row-{row['id']}", num_layers=L, n_head=H, hidden_dim=h, vocab_size=V,
                          max_seq_len=s, ffn_embed_dim=ffn)
    gpu = C.get_gpu_config_by_name(GPU_CONFIG)
    repl = {}
    if row.get("intra_node_gbs") not in (None, ""):
        repl["intra_node_bandwidth_in_GB_per_sec"] = float(row["intra_node_gbs"])
    if row.get("inter_node_gbs") not in (None, ""):
        repl["inter_node_bandwidth_in_GB_per_sec"] = float(row["inter_node_gbs"])
    gpu = dataclasses.replace(gpu, **repl)
    dtype = C.get_dtype_config_by_name(DTYPE_CONFIG)
    sp = tp if row.get("sequence_parallel") in (True, "true", "True", 1) else 1
    par = C.ParallelismConfig(tp_size=tp, pp_size=pp, dp_size=dp, sp_size=sp)
    analysis = A.LLMAnalysis(model, gpu, dtype, par)  # package-default efficiencies (1.0)
    with contextlib.redirect_stdout(sys.stderr):
        summary = analysis.training(batch_size_per_gpu=mbs, global_batch_size=gbs, seq_len=s,
                                    activation_recomputation=rc, ds_zero=A.DSZeRO.NONE, flash_attn=False)
    t = float(summary["latency_per_iter"])
    notes.append(f"gpu={GPU_CONFIG} intra={gpu.intra_node_bandwidth_in_GB_per_sec:g} "
                 f"inter={gpu.inter_node_bandwidth_in_GB_per_sec:g} GB/s; recompute={rc.name}; "
                 f"grad_accum={summary['gradient_accumulation_steps']}; "
                 f"flops_efficiency={summary['flops_efficiency']:g}")
    if summary.get("memory_left_per_gpu", 0) < 0:
        notes.append("llm-analysis's memory model says this config does not fit in 80 GB")
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
