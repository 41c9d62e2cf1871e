"""What a prediction is reported as: its tables (`tables`), what it rests on (`provenance`), whether some run could
achieve it (`plausibility`), a batch of predictions as a table (`batch_csv`), and the predicted timeline as Kineto
traces (`trace_out`; a GPU's events `trace_writer`, a CPU's `cpu_trace_writer`, each hardware's names
`kernel_names`). Rule: built from a prediction's graph, estimates and timeline (`predictor.predict` calls it);
computes no estimate of its own and never imports `predictor.predict`."""
