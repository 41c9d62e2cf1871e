"""One module or folder per layer kind, as Megatron-core builds it: `attention/` (MHA/GQA, MLA, sliding windows,
CP), `mlp/` (dense MLP, its activation, the unfused bias-dropout-add), `moe/` (router, dispatch, experts, shared
experts and their host calls), `embedding/` (the embedding, the output layer and loss, MTP's ends), `norm_rope`
(norms and rotary embeddings as the stack's kernels), and what PyTorch-native trainers change in a layer's ops
(`compile_fusion`: torch.compile's fused kernels; `pytorch_native`: torchtitan's per-op recompute).
Rule: a layer kind answers with its operator rows (a list of `predictor.ir.ops.Pair`) built on `predictor.ir`; it
knows neither costs nor schedules, and imports nothing of the predictor but `ir` and other layer kinds."""
