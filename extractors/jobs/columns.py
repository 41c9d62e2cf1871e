"""Which columns a `predict --batch` file must have, and what its absent columns stand for.

A file is checked once, before its rows (`extractors.jobs.rows.parse_row` reads each row against these rules):

- the model (`num_layers`, `hidden_size`, `num_attention_heads`, `seq_length`): `extractors.jobs.table.read_rows`
  refuses a file without them;
- `hardware_gpu`, unless the command names the hardware (`--hardware`) or the cluster (`--cluster`): without it a
  row has no hardware to predict on;
- `tp` and `pp` where the file states `num_gpus` and `dp`: each row's tp·pp·dp·cp must then be its num_gpus, so a
  parallel size cannot be left to Megatron's default of 1 (a row's `megatron_args` may state them instead).

Any other configuration column the file lacks takes its default in every row; `absent_defaults` says which, once.
"""
from __future__ import annotations

from pathlib import Path

from tracekit.core.errors import InputError

#: What a configuration column the file does not have stands for (Megatron's defaults; tracekit's for precision).
ABSENT = {
    "tp": "1", "pp": "1", "cp": "1", "dp": "num_gpus / (tp·pp·cp), else 1",
    "num_gpus": "tp·pp·dp·cp", "micro_batch_size": "the fastest of 1, 2, 4, 8, 16 that fits",
    "global_batch_size": "micro_batch_size·dp",
    "ffn_hidden_size": "4·hidden_size", "num_query_groups": "num_attention_heads (no GQA)",
    "vocab_size": "50257", "sequence_parallel": "off", "virtual_pipeline_stages": "none (no interleaving)",
    "activation_recompute": "none", "precision": "the stack's (bf16)",
}


def required_columns(path: str | Path, header: list[str], hardware_given: bool) -> None:
    """InputError naming the columns `header` lacks that every row needs (the rules above)."""
    missing: list[str] = []
    if "hardware_gpu" not in header and not hardware_given:
        missing.append("hardware_gpu (the GPU each row ran on; or pass --hardware)")
    if {"num_gpus", "dp"} <= set(header) and "megatron_args" not in header:
        parallel = [c for c in ("tp", "pp") if c not in header]
        if parallel:
            missing.append(f"{', '.join(parallel)} (the file states num_gpus and dp: tp·pp·dp·cp must equal "
                           "num_gpus in each row)")
    if missing:
        count = sum(len(m.split(" (")[0].split(", ")) for m in missing)
        raise InputError(path, f"missing column{'s' if count > 1 else ''} {'; '.join(missing)}")


def absent_defaults(header: list[str]) -> str | None:
    """One line naming the configuration columns `header` lacks and the default each row takes for them; None when
    it has them all."""
    absent = [c for c in ABSENT if c not in header]
    if not absent:
        return None
    return "columns not in the file, taken in every row as: " + ", ".join(f"{c} = {ABSENT[c]}" for c in absent)
