"""`python -m tracekit ...`: the same command as the `tracekit` script (useful where only an interpreter is on PATH)."""
from tracekit.cli import main

main()
