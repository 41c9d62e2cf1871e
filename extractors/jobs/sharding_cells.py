"""What a published table's sharding cells say (`zero_or_fsdp`, a yes/no `fsdp` column, the `framework` whose FSDP a
bare `fsdp` is) as the settings of `tracekit.core.sharding`, and FSDP1's HYBRID_SHARD once the node is known."""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError
from tracekit.core.sharding import STRATEGIES, ShardingSettings


def with_shard_inside(c: TrainingConfig, domain: int) -> TrainingConfig:
    """`c` with its data-parallel ranks sharding inside each node (NVLink domain of `domain` GPUs) and the nodes
    replicating: FSDP1's HYBRID_SHARD (validated)."""
    shard = max(1, min(c.dp * c.cp, domain // c.tp))
    settings = dataclasses.replace(c.sharding or ShardingSettings(),
                                   num_distributed_optimizer_instances=max(1, c.dp * c.cp // shard))
    return dataclasses.replace(c, sharding=settings).validate()


def settings_from_text(text: str, fsdp: str = "", framework: str = "") -> tuple[dict[str, Any], list[str], bool]:
    """Settings a published table's sharding cells state: `zero_or_fsdp` (`FSDP FULL_SHARD (mixed-precision mode
    PURE)`, `fsdp (Megatron-FSDP; ...)`, `fsdp (megatron-fsdp, optim_grads_params)`, `zero1`, `ZeRO-3`,
    `distributed_optimizer`, `HYBRID_SHARD`, `none`) and a yes/no `fsdp` column; `framework` tells whose FSDP a
    bare `fsdp` is (Megatron's, else PyTorch's FSDP1). ({settings}, notes on what was assumed, whether the shards
    stay inside a node: HYBRID_SHARD, whose replica count the caller sets once it knows the node)."""
    raw = (text or "").strip()
    low = raw.lower()
    out: dict[str, Any] = {}
    notes: list[str] = []
    fsdp_on = str(fsdp or "").strip().lower() in ("yes", "true", "1")
    head = re.split(r"[\s(;,]", low, maxsplit=1)[0] if low else ""
    if head in ("", "none", "no", "ddp", "n/a", "-") and not fsdp_on:
        return out, notes, False
    zero = re.match(r"^(?:deepspeed\s+)?zero[-_ ]?([0-3])$", head) or \
        re.search(r"\bzero[-_ ]?stage[-_ ]?([0-3])\b", low)
    if head in ("distributed_optimizer", "distributed", "zero") or (zero and zero.group(1) == "1"):
        out["use_distributed_optimizer"] = True
        return out, notes, False
    if zero:
        stage = int(zero.group(1))
        if stage == 0:
            return out, notes, False
        out.update(sharded_data_parallel="deepspeed", data_parallel_sharding_strategy=STRATEGIES[stage])
        return out, notes, False
    megatron = "megatron" in low or (not raw and "megatron" in (framework or "").lower())
    torch_fsdp = any(w in low for w in ("full_shard", "shard_grad_op", "hybrid_shard", "no_shard", "fsdp", "hsdp"))
    if not (torch_fsdp or fsdp_on):
        raise ConfigError(f"zero_or_fsdp {raw!r}: not a sharding tracekit reads (none, zero1–3, "
                          "distributed_optimizer, FSDP FULL_SHARD/SHARD_GRAD_OP/HYBRID_SHARD/NO_SHARD, fsdp)")
    if megatron:
        strategy = next((s for s in STRATEGIES if re.search(rf"\b{s}\b", low)), None)
        out.update(sharded_data_parallel="megatron-fsdp", data_parallel_sharding_strategy=strategy
                   or "optim_grads_params")
        if strategy is None:
            notes.append("Megatron-FSDP strategy not stated: optim_grads_params assumed (Megatron-Bridge's default)")
        return out, notes, False
    out["sharded_data_parallel"] = "torch-fsdp2" if re.search(r"fsdp2|fully_shard", low) else "torch-fsdp1"
    if "shard_grad_op" in low or "hybrid_shard_zero2" in low:
        out.update(data_parallel_sharding_strategy="optim_grads_params", torch_fsdp2_reshard_after_forward=False)
    elif "no_shard" in low:
        out["data_parallel_sharding_strategy"] = "no_shard"
    else:
        out["data_parallel_sharding_strategy"] = "optim_grads_params"
    inside_node = "hybrid_shard" in low or "hsdp" in low
    mode = re.search(r"mixed[- _]precision(?: mode)?\s*[:=]?\s*(pure|default|full)", low)
    if mode and mode.group(1) == "full":
        raise ConfigError(f"zero_or_fsdp {raw!r}: FULL mixed precision (fp32 parameter gathers) is not modelled")
    if mode:
        out["accumulate_allreduce_grads_in_fp32"] = mode.group(1) == "default"
    return out, notes, inside_node
