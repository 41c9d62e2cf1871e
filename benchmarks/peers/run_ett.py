"""Peer runner: estimate-train-time @ 1ac4d5e44116 (github.com/DebarghaG/estimate-train-time, MIT), the released
tool of arXiv 2509.22832, on end-to-end training rows, with the corpus's Perlmutter (A100-SXM4-80GB) samples.

Run with the peer's own interpreter, benchmarks/.peers/ett/bin/python (see setup.sh); never imported by tracekit.
stdin: a JSON list of row dicts (keys in client.py); stdout: a JSON list of
{"id", "iteration_time_s", "error", "notes"} in the same order. Progress goes to stderr (the tool's own prints
too, with PEER_VERBOSE=1). One bad row yields an "error" for that row only.

Each row is predicted exactly as the tool's `one_batch_predict(config)` does (estimator/prediction.py): its
`pp_partitions(encoders, pp)` then `get_operator_statistics(...)`, called here with one shared `Predictor` so the
regressors fitted on the first row (written beside the samples in benchmarks/.peers/ett-data/) are reused in
memory. The config it gets:
  gpu_name "NVIDIAA100-SXM4-80GB", operator/nccl_data_folder = ett-data/Perlmutter/{operator,nccl}
  training_config = [pp, tp, dp, micro_batch_size, heads, seq_length, hidden_size,
                     global_batch_size / (micro_batch_size * dp), gpus_per_node]
  encoders = num_layers, comm_bucket = 1260000000 (the tool's documented default), fwd_syncs = bwd_syncs = 2
  encoder_function_list = layernorm, linear1, baddbmm, ScaledUpperTriangMaskedSoftmax, bmm, linear2, layernorm,
                          res_add, linear3, gelu, linear4, res_add   (Megatron's unfused attention with its fused
                          causal masked softmax, GeLU MLP, LayerNorm) for rows whose stack runs unfused attention
                          (or name none); rows with flash/fused attention (`attention` = flash: Megatron-core with
                          Transformer Engine) get the tool's flash_atten in place of baddbmm/softmax/bmm, rotary rows
                          its RoPE after linear1, RMSNorm rows its RMSlayernorm (operators())
  function_list = those + embedding, linear_final, parallel_cross_entropy_128; layernorm_name = the norm op
Rows it cannot express at all (any GPU but A100, MoE, context parallelism, MLA, precision other than fp16/bf16)
get an error before any regressor runs (Runner._expressible).
"""
from __future__ import annotations

import contextlib
import io
import math
import os
import re
import sys
from pathlib import Path

from protocol import positive_int as _int, serve

GPU = "NVIDIAA100-SXM4-80GB"
COMM_BUCKET = 1260000000  # docs/configuration.md default; the rows' DDP all-reduces the whole buffer at once
ENCODER_OPS = ["layernorm", "linear1", "baddbmm", "ScaledUpperTriangMaskedSoftmax", "bmm", "linear2",
               "layernorm", "res_add", "linear3", "gelu", "linear4", "res_add"]
FUNCTION_LIST = ["embedding", "layernorm", "linear1", "baddbmm", "ScaledUpperTriangMaskedSoftmax", "bmm",
                 "linear2", "linear3", "gelu", "linear4", "linear_final", "parallel_cross_entropy_128", "res_add"]
TOOL_VOCAB = 50257  # hard-coded in the tool's embedding / linear_final / cross-entropy shapes and parameter counts
REQUIRED = ("id", "num_layers", "hidden_size", "num_attention_heads", "seq_length", "global_batch_size",
            "micro_batch_size", "tp", "pp", "dp")

STATIC_NOTE = ("estimate-train-time @1ac4d5e44116 on Perlmutter A100-SXM4-80GB samples (4 GPUs/node); "
               "not expressible (nearest option used): attention & hidden dropout, learned position "
               "embedding add, bias-GeLU and bias-dropout-add fusions (plain gelu/res_add), interconnect bandwidth "
               "(NCCL regressors are Perlmutter's), GPU memory variant; the tool always models full recompute "
               "(each layer's backward = bwd ops + its forward again) and, for dp>1, a ZeRO-1-style parameter "
               "all-gather + Adam step; schedule = (m-1+pp)*(max stage fwd + max stage bwd)")


def operators(row: dict) -> tuple[list[str], list[str], str]:
    """(function_list, encoder_function_list, layernorm_name) of the row's stack, from the tool's sampled ops:
    Megatron's unfused attention (the first rows' stacks, and rows that name none), or flash attention
    (`flash_atten`, as its example configurations use it) where the row's stack runs fused/flash kernels; `RoPE`
    after linear1 for rotary rows; `RMSlayernorm` for RMSNorm rows."""
    attention = str(row.get("attention") or "unfused")
    rope = str(row.get("position_embedding_type") or "learned_absolute") == "rope"
    norm = "RMSlayernorm" if str(row.get("normalization") or "LayerNorm") == "RMSNorm" else "layernorm"
    if attention == "unfused" and not rope and norm == "layernorm":
        return FUNCTION_LIST, ENCODER_OPS, "layernorm"
    attn = ["flash_atten"] if attention == "flash" else ["baddbmm", "ScaledUpperTriangMaskedSoftmax", "bmm"]
    encoder = [norm, "linear1", *(["RoPE"] if rope else []), *attn, "linear2", norm, "res_add", "linear3", "gelu",
               "linear4", "res_add"]
    return list(dict.fromkeys(["embedding", *encoder, "linear_final", "parallel_cross_entropy_128"])), encoder, norm


def log(msg: str) -> None:
    print(f"[estimate-train-time] {msg}", file=sys.stderr, flush=True)


def peers_dir() -> Path:
    env = os.environ.get("TRACEKIT_PEERS_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[1] / ".peers"


def data_dir() -> Path:
    env = os.environ.get("TRACEKIT_ETT_DATA")
    return Path(env) if env else peers_dir() / "ett-data" / "Perlmutter"


class Runner:
    def __init__(self, data: Path):
        import numpy as np
        import pandas as pd
        from estimate_train_time.estimator import (
            encoder_config_to_layer_input as e2l,
            layer_input_to_predictor_input as l2p,
            prediction,
        )
        from estimate_train_time.estimator.predictor import Predictor

        self.np, self.pd, self.e2l, self.l2p, self.prediction = np, pd, e2l, l2p, prediction
        self.data = data.resolve()
        self.op_dir = str(data / "operator")
        self.nccl_dir = str(data / "nccl")
        for d in (self.op_dir, self.nccl_dir):
            if not os.path.isfile(os.path.join(d, GPU + ".csv")):
                raise FileNotFoundError(f"{d}/{GPU}.csv not found: run `bash benchmarks/peers/setup.sh`")
        self.predictor = Predictor()  # shared: fitted regressors stay in memory across rows
        self._ranges: dict[str, tuple] = {}

    # ---- honesty checks: where the row lies outside what the tool sampled (tree regressors do not extrapolate)
    def _sample_range(self, op: str):
        if op not in self._ranges:
            data = self.pd.read_csv(os.path.join(self.op_dir, f"{GPU}_{op}_fp16.csv")).to_numpy()
            x = data[:, 0:-1] if op.endswith("optimizer") else data[:, 0:-2]
            x = self.np.apply_along_axis(getattr(self.l2p, op), 1, x)  # the tool's own feature map
            self._ranges[op] = (x.min(axis=0), x.max(axis=0))
        return self._ranges[op]

    def _outside(self, op: str, features) -> str | None:
        lo, hi = self._sample_range(op)
        for j, v in enumerate(features):
            if v < lo[j] or v > hi[j]:
                return f"{op} x{j}={float(v):g} not in [{float(lo[j]):g},{float(hi[j]):g}]"
        return None

    @staticmethod
    def _expressible(row: dict) -> None:
        """ValueError naming what of the row the tool has no operator, sample or setting for (nearest-option
        mismatches are notes instead, in `predict`)."""
        gpu = str(row.get("gpu") or "")
        if gpu and "A100" not in gpu.upper():
            raise ValueError(f"GPU {gpu} not expressible: the tool's samples are Perlmutter's A100-SXM4-80GB only "
                             "(it predicts from sampled kernel and NCCL timings of that GPU)")
        precision = str(row.get("precision") or "fp16").lower()
        if precision not in ("fp16", "bf16"):
            raise ValueError(f"precision {precision} not expressible: the tool's operator samples are fp16")
        if int(float(row.get("num_experts") or 1)) > 1:
            raise ValueError("MoE not expressible: the tool's operators are a dense GPT layer's (no router, expert "
                             "GEMMs or token dispatch)")
        if int(float(row.get("cp") or 1)) > 1:
            raise ValueError(f"context parallelism cp={row['cp']} not expressible: the tool's training_config has "
                             "pp, tp, dp only")
        if row.get("multi_latent_attention") in (True, "true", "True", 1):
            raise ValueError("multi-latent attention not expressible: the tool's attention ops are MHA's")

    def predict(self, row: dict) -> tuple[float, str]:
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise ValueError(f"missing keys: {', '.join(missing)}")
        L, dim, H, seq = (_int(row, k) for k in ("num_layers", "hidden_size", "num_attention_heads", "seq_length"))
        gbs, mbs, tp, pp, dp = (_int(row, k) for k in ("global_batch_size", "micro_batch_size", "tp", "pp", "dp"))
        gpn = _int(row, "gpus_per_node") if row.get("gpus_per_node") not in (None, "") else 8
        self._expressible(row)
        n = row.get("num_gpus")
        if n not in (None, "") and int(float(n)) != tp * pp * dp:
            raise ValueError(f"num_gpus={n} != tp*pp*dp={tp * pp * dp}")
        if gbs % (mbs * dp):
            raise ValueError(f"global_batch_size {gbs} is not a multiple of micro_batch_size*dp = {mbs * dp}")
        if H % tp or dim % H:
            raise ValueError(f"heads {H} not divisible by tp {tp} or hidden {dim} by heads")
        m = gbs // (mbs * dp)
        tc = [pp, tp, dp, mbs, H, seq, dim, m, gpn]
        functions, encoder_ops, norm = operators(row)
        notes = [STATIC_NOTE, f"training_config={tc} encoders={L} comm_bucket={COMM_BUCKET}",
                 "ops per layer " + "/".join(encoder_ops)]

        recompute = str(row.get("recompute") or "none").lower()
        if recompute != "full":
            notes.append(f"row recompute={recompute} not expressible: tool models full recompute regardless")
        precision = str(row.get("precision") or "fp16").lower()
        if precision != "fp16":
            notes.append(f"precision {precision} not expressible: tool's samples are fp16")
        gpu = str(row.get("gpu") or "")
        if gpu and gpu != "A100-SXM4-80GB":
            notes.append(f"GPU {gpu} run as the samples' A100-SXM4-80GB (same die)")
        kv = row.get("num_query_groups")
        if kv not in (None, "") and int(float(kv)) != H:
            notes.append(f"GQA ({int(float(kv))} query groups) not expressible: linear1 is the MHA QKV (3h)")
        if row.get("swiglu") in (True, "true", "True", 1):
            notes.append("SwiGLU not expressible: plain gelu MLP")
        V = row.get("vocab_size")
        if V not in (None, "") and int(float(V)) != TOOL_VOCAB:
            notes.append(f"vocab {int(float(V))} not expressible: tool fixes {TOOL_VOCAB} (padded to 128*tp)")
        ffn = row.get("ffn_hidden_size")
        if ffn not in (None, "") and int(float(ffn)) != 4 * dim:
            notes.append(f"ffn {int(float(ffn))} not expressible: tool fixes 4*hidden={4 * dim}")
        if row.get("sequence_parallel") in (True, "true", "True", 1):
            notes.append("sequence parallelism not expressible")

        P = self.prediction
        parts = P.pp_partitions(L, pp)
        notes.append(f"tool's stage split (GPT-NeoX pipe spec, L+5 slots) head/middle/tail encoders={parts}"
                     + (" (non-positive stage: pp too large for the tool's split)" if min(parts) <= 0 else ""))
        if dp == 1:
            notes.append("dp=1: the tool adds no optimizer step and no gradient all-reduce")
        ec = (tp, mbs, H, seq, dim)
        head_params = P.get_embedding_parameters(ec) + parts[0] * P.get_encoder_parameters(ec)
        if dp > 1 and head_params > COMM_BUCKET:
            notes.append(f"first stage's {head_params} gradients all-reduced in "
                         f"{math.ceil(head_params / COMM_BUCKET)} buckets of {COMM_BUCKET}")

        out_of_range = []
        for op in dict.fromkeys(functions):
            feats = getattr(self.l2p, op)(getattr(self.e2l, op)(ec))
            msg = self._outside(op, feats)
            if msg:
                out_of_range.append(msg)
        if dp > 1:
            for op, k in (("firstStage_optimizer", 0), ("middleStage_optimizer", 1), ("lastStage_optimizer", 2)):
                msg = self._outside(op, [tp, dim, parts[k]])
                if msg:
                    out_of_range.append(msg)
        if out_of_range:
            notes.append("outside the sampled feature ranges (tree regressors hold the edge value): "
                         + "; ".join(out_of_range))

        for attempt in (0, 1):
            buf = io.StringIO()
            try:
                with contextlib.redirect_stdout(buf):
                    us = P.get_operator_statistics(self.predictor, GPU, self.op_dir, self.nccl_dir, tc, COMM_BUCKET,
                                                   parts, functions, encoder_ops, norm, 2, 2)
                break
            except Exception:
                # A regressor file left half-written by an interrupted earlier fit (the tool writes them without an
                # atomic rename) fails to load; drop that one file from the scratch copy and let the tool re-fit it.
                bad = re.findall(r"^Loading (\S+\.(?:pkl|json))$", buf.getvalue(), re.M)
                path = Path(bad[-1]).resolve() if bad else None
                if attempt or path is None or self.data not in path.parents or not path.is_file():
                    raise
                log(f"{path.name} does not load (interrupted fit?); removing it so the tool re-fits it")
                path.unlink()
                notes.append(f"re-fitted {path.name} (unreadable)")
        printed = buf.getvalue()
        if os.environ.get("PEER_VERBOSE"):
            sys.stderr.write(printed)
        generic = sorted({name for name in re.findall(r"^Function:(\S+)", printed, re.M)
                          if re.match(r"(allreduce|allgather|p2p)", name)
                          and not os.path.isfile(os.path.join(self.nccl_dir, f"{GPU}_{name}.csv"))})
        if generic:
            notes.append("NCCL topologies (op_nodes_gpusPerNode) not sampled on Perlmutter, predicted by the "
                         "tool's generic (size, nodes, gpus/node) regressor: " + ", ".join(generic))
        t = float(us) / 1e6
        if not math.isfinite(t):
            raise ValueError(f"tool returned {us!r} us")
        return t, "; ".join(notes)


def main() -> int:
    data = data_dir()
    fatal = None
    runner = None
    lock = None
    try:
        import fcntl

        if not data.is_dir():
            raise FileNotFoundError(f"{data} missing: run `bash benchmarks/peers/setup.sh`")
        lock = open(data.parent / ".lock", "w")  # the tool writes its fitted regressors beside the samples
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.redirect_stdout(sys.stderr):
            runner = Runner(data)
    except Exception as e:  # noqa: BLE001
        fatal = f"estimate-train-time unavailable ({sys.executable}, data {data}): {type(e).__name__}: {e}"
    try:
        return serve("estimate-train-time", lambda row: runner.predict(row), fatal)
    finally:
        if lock is not None:
            lock.close()


if __name__ == "__main__":
    sys.exit(main())
