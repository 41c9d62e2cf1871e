"""`python -m tracekit.reference ...` (directly or as `torchrun ... -m tracekit.reference ...`)."""
from .train import main

if __name__ == "__main__":
    main()
