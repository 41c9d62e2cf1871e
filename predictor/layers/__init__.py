"""One module or folder per layer kind, as Megatron-core builds it: `attention/` (MHA/GQA, MLA, sliding windows,
CP), `mlp/` (dense MLP, its activation, the unfused bias-dropout-add), `moe/` (router, dispatch, experts, shared
experts and their host calls), `embedding/` (the embedding, the output layer and loss, MTP's ends), `norm_rope`
(norms and rotary embeddings as the stack's kernels), the hybrid models' mixers (`ssm/`: Mamba2 and Gated DeltaNet;
`dsa`: DeepSeek sparse attention; `mla`: multi-latent attention as a hybrid pattern's `+`; `kernel_work`: the work of
the kernels these add, for the roofline), and what PyTorch-native trainers change in a layer's ops (`compile_fusion`:
torch.compile's fused kernels; `pytorch_native`: torchtitan's per-op recompute).

Every layer kind answers the same questions (`block.Block`: its operator rows, parameters, FLOPs per token,
activation bytes, matrices, parameter tensors, offloadable groups); `decoder` gives each decoder layer its blocks.
Rule: a layer kind answers with its operator rows (a list of `predictor.ir.ops.Pair`) built on `predictor.ir` and
with pure functions of its settings and shapes; it knows neither costs nor schedules, and imports nothing of the
predictor but `ir` and other layer kinds.
"""
