"""The operator graph of one configuration assembled from its layers and parallelism (`graph.build_graph`): which
layers each pipeline chunk holds, each kind of layer's ops built once and repeated, recompute, the per-iteration
ops. Rule: assembly only; what each layer or parallel scheme runs is theirs."""
