"""The operator graph's types: operator rows and their uses (`ops`: specs, `OpUse`, `Pair`, `OpBuilder`), where each
parallel group's ranks sit (`placement`), and the graph of one configuration (`graph`: segments per pipeline chunk,
the per-iteration ops). Rule: types and the helpers that make rows; nothing here knows a layer kind, a cost or a
schedule, and it imports nothing of the predictor but itself."""
