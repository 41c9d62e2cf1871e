"""Parallelism beyond a layer's own tensor and expert parallelism: data parallelism and the distributed optimizer
(`data_parallel`: gradient buckets, parameter gathers, the optimizer step, weight casts; `grad_buckets`: how Megatron
cuts the gradients into buckets), sharded data parallelism
(`fsdp`: FSDP/ZeRO/HSDP units, their collectives and memory), Muon's orthogonalisation (`muon`) and the
iteration's own collectives (`iteration_syncs`: the loss report, the logging barrier). Rule: each answers with ops
on `predictor.ir`; imports `ir`, `layers` and `architecture`, never costs or schedules."""
