"""Operator graph of a training iteration, regressors, schedule simulation, diff."""
