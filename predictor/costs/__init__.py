"""What an operator costs: `features` (model inputs: shape and physics features), `learned/` (regressors trained on
samples: their keys, training, the model set that answers rows, derived answers), `physics/` (roofline, transfer to
GPUs without models, collectives' algorithms, low-precision GEMM bounds, the kernel paths unaligned shapes force,
bandwidth floors), and `estimates` (each distinct operator row of a graph answered, with calibration scales).
Rule: answers rows by primitive, pass, variant and shape; may read a layer kind's facts (bytes a kernel moves), never
builds graphs or schedules."""
