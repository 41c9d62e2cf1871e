"""Micro-benchmarks of operator primitives on the local device (`tracekit sample`), stored as operator samples.

`sample(device, primitives, budget_s, ranks, store) -> SampleRun` is the library entry point (imports torch).
"""
