"""Megatron's uneven pipeline split, shared by the decoder's layout (`decoder_first/last_pipeline_num_layers`:
tracekit.core.pipeline_layout) and a hybrid pattern's without `|` (`num_layers_in_first/last_pipeline_stage`:
tracekit.core.hybrid_pattern): the first and/or last stage hold the layers they are given and the stages between
them split the rest evenly. Each caller refuses what Megatron refuses there, in Megatron's words for that path."""
from __future__ import annotations


def uneven_stage_counts(n: int, pp: int, first: int | None, last: int | None) -> tuple[list[int], int, int]:
    """(layers per stage, the layers left for the middle stages, the middle stages) of `n` layers over `pp` stages.
    The middle stages hold the quotient; a negative rest, a rest they do not divide, or counts that do not add up to
    `n` (no middle stage to take the rest) are the caller's to refuse."""
    rest = n - (first or 0) - (last or 0)
    middle = pp - (first is not None) - (last is not None)
    counts = [rest // middle if middle > 0 and rest >= 0 else 0] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts, rest, middle
