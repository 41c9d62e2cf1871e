"""Side-by-side peer predictors (llm-analysis, estimate-train-time) run in their own virtualenvs; see README.md."""
