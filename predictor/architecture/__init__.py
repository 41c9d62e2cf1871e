"""What the model is, from its layers: the parameters one GPU holds per layer and per pipeline chunk (`params`),
the tensors they are registered as (`tensors`) and the model FLOPs of an iteration with the throughput figures derived
from them (`flops`). Rule: functions of the configuration alone (no operator graph, no cost); used by parallel,
memory, schedule, search and report."""
