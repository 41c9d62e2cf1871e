"""Memory per GPU against what the frameworks keep and what real runs measured.

The measured figures are Megatron-LM CI runs (../shared/corpus/e2e/megatron_ci_golden.csv: PyTorch's allocator
counters on the last rank); the schedule facts are Megatron-core's `get_pp_rank_microbatches`, written out here by
hand; the byte counts are what PyTorch's dropout and the cross-entropy implementations keep."""
from __future__ import annotations

import csv
import dataclasses

import pytest
import yaml

from extractors.jobs.composer import read_composer
from extractors.jobs.rows import parse_row
from predictor.memory.stages import _in_flight, stage_memory
from tests.conftest import CORPUS
from tests.test_job_files import JOBS
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import InputError

GB = 1e9


def _rows(name: str) -> list[dict[str, str]]:
    with open(CORPUS / "e2e" / name, newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_7b_ci_run_is_predicted_within_ten_percent_of_its_measured_memory():
    """gpt3_7b_tp1_pp4_memory_speed: 32 layers of hidden 4096, pp 4 interleaved over 8 chunks, 4 micro-batches, on
    DGX A100, H100 and GB200. Its last rank measured ~24.5 GB between steps and ~60.5 GB at the peak."""
    rows = [(i, r) for i, r in enumerate(_rows("megatron_ci_golden.csv"))
            if r["row_ref"].startswith("gpt3_7b_tp1_pp4_memory_speed/")]
    assert len(rows) == 3
    for i, cells in rows:
        c = parse_row(cells, i + 2, None, None).config
        last = stage_memory(c)[-1]
        between = last["weights"] + last["gradients"] + last["optimizer_state"]
        assert between == pytest.approx(float(cells["mem_allocated_bytes"]) / GB, rel=0.10)
        assert last["total"] == pytest.approx(float(cells["mem_max_allocated_bytes"]) / GB, rel=0.10)


def test_a_stage_holds_the_micro_batches_its_warm_up_runs_ahead():
    """Megatron-core: 1F1B warms up pp − stage − 1 forwards; the interleaved schedule (pp − stage − 1)·2 +
    (vp − 1)·pp chunk forwards, all of the m·vp when that reaches them; one more is in flight at the first backward."""
    base = dict(num_layers=32, hidden_size=1024, num_attention_heads=16, seq_length=1024, micro_batch_size=1,
                pipeline_model_parallel_size=4, global_batch_size=4, data_parallel_size=1)
    one_f_one_b = TrainingConfig(**base)
    assert [_in_flight(one_f_one_b, s) for s in range(4)] == [4, 3, 2, 1]
    interleaved = TrainingConfig(**base, virtual_pipeline_model_parallel_size=8)  # 4 micro-batches × 8 chunks
    # first stage: 6 + 28 = 34 ≥ 32: every chunk forward runs before a backward; last stage: 28 + 1 of 32
    assert _in_flight(interleaved, 0) == pytest.approx(32 / 8)
    assert _in_flight(interleaved, 3) == pytest.approx(29 / 8)
    longer = dataclasses.replace(interleaved, global_batch_size=16)
    assert _in_flight(longer, 0) == pytest.approx(35 / 8)  # 34 + 1 of 128
    assert _in_flight(longer, 3) == pytest.approx(29 / 8)


def test_dropout_with_p_zero_keeps_no_masks():
    """torch's dropout returns its input when p = 0: no 1-byte masks after attention and MLP (2·h a token), and
    unfused attention keeps only its softmax output (2 bytes a score, not Korthikanti's 5)."""
    s, b, h, a, L = 1024, 1, 1024, 16, 4
    c = TrainingConfig(num_layers=L, hidden_size=h, num_attention_heads=a, seq_length=s, micro_batch_size=b,
                       attention="unfused")
    off = dataclasses.replace(c, hidden_dropout=0.0, attention_dropout=0.0)
    saved = stage_memory(c)[-1]["activations"] - stage_memory(off)[-1]["activations"]
    assert saved * GB == pytest.approx(L * s * b * (2 * h + 3 * a * s))


def test_the_loss_holds_what_its_cross_entropy_implementation_keeps():
    """Per logit: Megatron's (6 bytes: bf16 logits and their fp32 copy), Transformer Engine's in place (2)."""
    s, b, V = 1024, 2, 50304
    c = TrainingConfig(num_layers=2, hidden_size=512, num_attention_heads=8, seq_length=s, micro_batch_size=b)
    te = TrainingConfig.from_mapping({**c.to_dict(), "cross_entropy_loss_fusion": True,
                                      "cross_entropy_fusion_impl": "te"})
    native = TrainingConfig.from_mapping({**c.to_dict(), "cross_entropy_loss_fusion": True,
                                          "cross_entropy_fusion_impl": "native"})
    gap = stage_memory(c)[-1]["activations"] - stage_memory(te)[-1]["activations"]
    assert gap * GB == pytest.approx(s * b * V * 4)
    assert stage_memory(native)[-1]["activations"] == stage_memory(c)[-1]["activations"]


def test_llm_foundry_loss_fn_is_read_and_a_misspelt_one_refused(tmp_path):
    data = yaml.safe_load((JOBS / "mpt-7b.yaml").read_text())
    memory = {}
    for loss in ("fused_crossentropy", "torch_crossentropy"):
        data["model"]["loss_fn"] = loss
        path = tmp_path / f"{loss}.yaml"
        path.write_text(yaml.safe_dump(data))
        c = TrainingConfig.from_mapping(read_composer(path, world_size=8).settings).validate()
        memory[loss] = stage_memory(c)[-1]["activations"]
    assert memory["torch_crossentropy"] > memory["fused_crossentropy"]
    data["model"]["loss_fn"] = "fused_crossentropi"
    path = tmp_path / "misspelt.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match="did you mean 'fused_crossentropy'"):
        read_composer(path, world_size=8)


def test_a_bridge_rows_model_provider_sets_its_cross_entropy():
    """Every Megatron-Bridge provider derives from GPTModelProvider, which fuses the cross entropy
    (`cross_entropy_loss_fusion = True`: extractors.jobs.bridge.providers), and every performance launcher names
    Transformer Engine's implementation (extractors.jobs.bridge.perf_launch)."""
    rows = _rows("megatron_bridge_perf.csv")
    seen = set()
    for i, cells in enumerate(rows):
        c = parse_row(cells, i + 2, None, None).config
        if c is None:
            continue
        assert c.extra.get("cross_entropy_fusion_impl") == "te", (i + 2, cells["model_name"])
        family = cells["model_name"][:5].upper()
        assert c.extra.get("cross_entropy_loss_fusion") is True, (i + 2, cells["model_name"])
        assert c.hidden_dropout == 0.0 and c.attention_dropout == 0.0  # every Bridge provider here sets none
        seen.add(family)
    assert {"LLAMA", "DEEPS", "QWEN3", "GPT O"} <= seen


def test_fine_grained_offloading_keeps_the_named_modules_saved_tensors_on_the_host():
    """`--fine-grained-activation-offloading --offload-modules core_attn`: what core attention saves (q, k, v and,
    unfused, its 2-byte softmax output) leaves the GPU for every layer but the one in transit."""
    s, b, h, a, L = 1024, 1, 1024, 16, 6
    d = h // a
    base = dict(num_layers=L, hidden_size=h, num_attention_heads=a, seq_length=s, micro_batch_size=b,
                attention="unfused", hidden_dropout=0.0, attention_dropout=0.0)
    kept = TrainingConfig.from_mapping(base)
    off = TrainingConfig.from_mapping({**base, "fine_grained_activation_offloading": True,
                                       "offload_modules": ["core_attn"]})
    per_layer = s * b * (2 * 3 * a * d + 2 * a * s)  # q, k, v and the scores, 2 bytes each
    gap = stage_memory(kept)[-1]["activations"] - stage_memory(off)[-1]["activations"]
    assert gap * GB == pytest.approx((L - 1) * per_layer)
    unflagged = TrainingConfig.from_mapping({**base, "offload_modules": ["core_attn"]})  # the modules alone do not
    assert stage_memory(unflagged)[-1]["activations"] == stage_memory(kept)[-1]["activations"]
