"""Megatron-LM's deprecated and legacy arguments, read as Megatron reads them (the pinned snapshot's
`megatron/training/arguments.py` `validate_args` and `argument_utils.py`), so a launch line of an older recipe is
either predicted as Megatron runs it or refused where Megatron stops:

- **Refused** (Megatron asserts or exits, with these words): `--batch-size`, `--warmup`, `--model-parallel-size` (any
  value) and `--checkpoint-activations`, in what a person typed. In the record of a run that happened (a log's
  arguments block, a table row, a captured launch: an older Megatron ran them) they mean what they meant there:
  `batch_size` the micro-batch, `model_parallel_size` the tensor-parallel size, `checkpoint_activations` full
  recompute of every layer (`checkpoint_num_layers` at a time, uniform), `warmup` the learning-rate schedule's (no
  effect on the time).
- **Translated**: `--use-rotary-position-embeddings` makes the position embedding RoPE, whatever
  `--position-embedding-type` says. `--no-position-embedding` is refused unless the embedding is RoPE (which has no
  learned table; then it changes nothing).
- **Renamed or removed since Megatron-LM 2021–2022** (not flags of the pinned snapshot, whose argparse stops on them):
  in the record of a run they mean what they meant there, typed they are refused naming today's flags.
  `--activations-checkpoint-method uniform|block` (with `--activations-checkpoint-num-layers N`, default 1) is full
  recompute, today's `--recompute-granularity full --recompute-method` (`--recompute-num-layers`). `--DDP-impl local`
  is Megatron's own DDP (its gradients reduced after the last micro-batch's backward: `overlap_grad_reduce` off),
  `--DDP-impl torch` PyTorch's DistributedDataParallel, whose `no_sync` Megatron held over every micro-batch but the
  last: that backward reduces the gradients in PyTorch's 25 MB buckets as it fills them, which is
  `overlap_grad_reduce` with buckets of 25 MB of gradients (2-byte ones under fp16/bf16, Megatron's Float16Module),
  and the reducer's copies into and out of them (`torch_ddp_reducer`, tracekit.core.runtime).
  A setting the record states itself (`overlap_grad_reduce`, `ddp_bucket_size`, the recompute ones) is kept.
- **The linears' backward overlap under sequence parallelism**: Megatron-LM 2022–2023's `validate_args` set
  `async_tensor_model_parallel_allreduce` false under sequence parallelism, whose linears overlapped their backward
  collectives anyway; a run's record stating it false with sequence parallelism is read as that overlap
  (tracekit.core.runtime).
- **The vocabulary as given**: `--padded-vocab-size V` is the model's vocabulary, not padded again (Megatron builds
  the model with `should_pad_vocab=False`); its vocabulary-parallel embedding splits it evenly over tp, so V must
  divide by tp. A log prints the padded size of its vocabulary: where V is what the stated vocabulary pads to, the
  vocabulary stays as stated.
"""
from __future__ import annotations

from typing import Any

from tracekit.core.errors import ConfigError
from tracekit.core.megatron_defaults import VOCAB_MULTIPLE, VOCAB_SIZE, padded_vocab_size
from tracekit.core.sharding import TORCH_DDP_BUCKET_BYTES

#: Setting (argparse destination) → Megatron's words when it stops on it.
REFUSED = {
    "batch_size": "--batch-size argument is no longer valid, use --micro-batch-size instead",
    "warmup": "--warmup argument is no longer valid, use --lr-warmup-fraction instead",
    "model_parallel_size": "--model-parallel-size is no longer valid, use --tensor-model-parallel-size instead",
    "checkpoint_activations": "--checkpoint-activations is no longer valid, use --recompute-activations, or, for "
                              "more control, --recompute-granularity and --recompute-method.",
}
#: Megatron-LM 2021–2022's settings the pinned snapshot no longer has (module docstring) → what it calls them, for
#: the refusal of one typed.
RENAMED = {
    "activations_checkpoint_method": "--activations-checkpoint-method is Megatron-LM 2021–2022's flag, not the pinned "
                                     "Megatron's: there it is --recompute-granularity full --recompute-method",
    "activations_checkpoint_num_layers": "--activations-checkpoint-num-layers is Megatron-LM 2021–2022's flag, not "
                                         "the pinned Megatron's: there it is --recompute-num-layers",
    "ddp_impl": "--DDP-impl is Megatron-LM's flag of 2020–2023, not the pinned Megatron's: --DDP-impl torch is "
                "--overlap-grad-reduce --ddp-bucket-size 13107200 (PyTorch DDP's 25 MB buckets of 2-byte gradients) "
                "--torch-ddp-reducer (its copies into them and back), --DDP-impl local is without those",
}
#: The spellings of `--no-position-embedding` a mapping can hold: its argparse destination (False when given), the
#: flag's dest form (True) and the `--no-x` form a command line parses to (`position_embedding` False).
NO_POSITION = (("add_position_embedding", False), ("no_position_embedding", True), ("position_embedding", False))
#: The switches and the whole numbers among them, checked as such before they reach `apply`
#: (tracekit.core.choices.FLAGS and NUMBERS).
SWITCHES = ("checkpoint_activations", "use_rotary_position_embeddings", *(name for name, _ in NO_POSITION))
WHOLE_NUMBERS = ("batch_size", "warmup", "model_parallel_size", "padded_vocab_size",
                 "activations_checkpoint_num_layers")
#: Every setting this module reads (tracekit.core.settings.READ).
SETTINGS = (*REFUSED, *RENAMED, "use_rotary_position_embeddings", "padded_vocab_size",
            *(name for name, _ in NO_POSITION))
#: What the refused settings meant in the Megatron versions that ran them: setting → TrainingConfig's field.
RECORDED = {"batch_size": "micro_batch_size", "model_parallel_size": "tensor_model_parallel_size"}


def _stated(name: str, value: Any) -> bool:
    """Whether a refused setting is set (a switch to true, a number at all): a log prints them unset."""
    return value is True if name in SWITCHES else value is not None


def refuse(settings: dict[str, Any]) -> None:
    """ConfigError in Megatron's words for the first refused setting `settings` set (what a person typed: a command
    line, a job file, `--set`)."""
    for name, words in REFUSED.items():
        if _stated(name, settings.get(name)):
            raise ConfigError(f"{words} (Megatron stops on it)")
    for name, words in RENAMED.items():
        if settings.get(name) is not None:
            raise ConfigError(f"{words} (its argparse stops on it; the record of a run of that Megatron, a log or a "
                              "table row's launch line, is read as it ran)")


def apply(values: dict[str, Any], extra: dict[str, Any], record: bool = False,
          stated: frozenset[str] = frozenset()) -> None:
    """Read the legacy settings out of `extra` (switches and numbers already checked) into `values` (TrainingConfig's
    fields) as Megatron does; ConfigError where Megatron stops, the refused settings only if not `record` (the
    settings of a run that happened: module docstring). Runs once every stated setting and the stack's defaults are
    in; `stated`: the settings the input states itself (what a renamed flag would set is kept there, not a
    stack's default)."""
    if not record:
        refuse(extra)
    _renamed(values, extra, stated)
    if record and values.get("async_tensor_model_parallel_allreduce") is False and values.get("sequence_parallel") \
            and "async_tensor_model_parallel_allreduce" in stated:
        del values["async_tensor_model_parallel_allreduce"]  # Megatron's own value under SP (module docstring)
    for name in REFUSED:
        value = extra.pop(name, None)
        if not _stated(name, value):
            continue
        if name in RECORDED:
            values.setdefault(RECORDED[name], value)
        elif name == "checkpoint_activations":
            values.setdefault("recompute_granularity", "full")
            values.setdefault("recompute_method", "uniform")
            values.setdefault("recompute_num_layers", extra.pop("checkpoint_num_layers", 1))
    if extra.pop("use_rotary_position_embeddings", None) is True:
        values["position_embedding_type"] = "rope"
    dropped = [name for name, when in NO_POSITION if extra.pop(name, None) is when]
    embedding = values.get("position_embedding_type", "learned_absolute")
    if dropped and embedding != "rope":
        raise ConfigError("--no-position-embedding is deprecated, use --position-embedding-type (Megatron stops on "
                          f"it unless the position embedding is rope; here it is {embedding})")
    padded = extra.pop("padded_vocab_size", None)
    if padded is None:
        return
    vocab, tp = int(padded), int(float(values.get("tensor_model_parallel_size", 1)))
    if vocab < 1 or vocab % tp:
        raise ConfigError(f"padded_vocab_size {padded} is not a positive multiple of tp {tp}: Megatron's "
                          "vocabulary-parallel embedding splits the vocabulary evenly over tp")
    given = (int(float(values.get("vocab_size", VOCAB_SIZE))),
             int(float(values.get("make_vocab_size_divisible_by", VOCAB_MULTIPLE))))
    if vocab != padded_vocab_size(*given, tp):  # a log prints the padding of its vocabulary: that is no new size
        values["vocab_size"], values["make_vocab_size_divisible_by"] = vocab, 1


def _renamed(values: dict[str, Any], extra: dict[str, Any], stated: frozenset[str]) -> None:
    """Megatron-LM 2021–2022's renamed and removed flags, as that Megatron ran them (module docstring)."""
    method = extra.pop("activations_checkpoint_method", None)
    layers = extra.pop("activations_checkpoint_num_layers", None)
    if method is not None:
        for name, value in (("recompute_granularity", "full"), ("recompute_method", method),
                            ("recompute_num_layers", 1 if layers is None else layers)):
            if name not in stated:
                values[name] = value
    impl = extra.pop("ddp_impl", None)
    if impl is None:
        return
    if "overlap_grad_reduce" not in stated:
        values["overlap_grad_reduce"] = impl == "torch"
    if impl == "torch" and "torch_ddp_reducer" not in stated:
        values["torch_ddp_reducer"] = True
    if impl == "torch" and "ddp_bucket_size" not in stated:
        base = str(values.get("precision") or values.get("_base_precision") or "fp32").lower()
        extra["ddp_bucket_size"] = TORCH_DDP_BUCKET_BYTES // (4 if base in ("fp32", "float32") else 2)
