"""Operator graph of a training iteration, regressors, schedule simulation (comparison with real traces is
`tracekit.compare`)."""
