"""Typed errors raised by library code; only the CLI turns them into exit codes."""
from __future__ import annotations


class TracekitError(Exception):
    """Base class for every error tracekit reports to a user as one line."""


class InputError(TracekitError):
    """An input file or directory cannot be used; names the path and the reason."""

    def __init__(self, path: object, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class ConfigError(TracekitError):
    """A training configuration is invalid or cannot be split as asked."""


class StoreError(TracekitError):
    """The sample store is unreadable or could not be updated."""


class ModelError(TracekitError):
    """Regressor models are missing, unreadable or do not cover a request."""


class PlausibilityError(ModelError):
    """A prediction no hardware could run (e.g. model FLOP/s above the GPU's dense peak): a bug in the model, named
    with the parts of the estimate behind it."""


def did_you_mean(word: str, choices, cutoff: float = 0.6) -> str:
    """` (did you mean 'x'?)` for the closest of `choices` to a mistyped `word` (case aside: `nvsl` finds `NVLS`),
    or '' when none is close."""
    import difflib

    folded = {str(c).lower(): c for c in reversed(list(choices))}
    near = difflib.get_close_matches(str(word).lower(), list(folded), n=1, cutoff=cutoff)
    return f" (did you mean {folded[near[0]]!r}?)" if near else ""
