"""Every enumerated setting is checked against its choices (Megatron's), with a suggestion naming the key; every switch
is true or false and every number a number, or the input is refused in one line naming the key."""
from __future__ import annotations

import dataclasses
import re
import tarfile

import pytest
from typer.testing import CliRunner

from extractors.jobs.megatron import config_from_log
from predictor.architecture.params import chunk_params
from predictor.assembly.graph import build_graph
from tests.conftest import ROOT
from tracekit.cli import app
from tracekit.core import choices
from tracekit.core.config import TrainingConfig
from tracekit.core.errors import ConfigError
from tracekit.core.settings import SECTIONS

BASE = {"num_layers": 2, "hidden_size": 1024, "num_attention_heads": 16, "seq_length": 1024, "num_experts": 8}
HW = "A100-SXM4-80GB"


def near_miss(word: str) -> str:
    """A typo of `word`: its last character doubled (`rope` → `ropee`); a digit's, a letter after it (`00` is 0)."""
    return word + "x" if word.isdigit() else word + word[-1]


@pytest.mark.parametrize("key", sorted(choices.ENUMERATED))
def test_each_enumerated_setting_refuses_a_near_miss_naming_the_key_and_the_choice(key):
    spec = choices.ENUMERATED[key]
    for value in spec.values:
        typo = near_miss(value)
        with pytest.raises(ConfigError) as refused:
            TrainingConfig.from_mapping({**BASE, key: [typo] if spec.words else typo})
        message = str(refused.value)
        assert message.startswith(f"{key}: {typo!r} is not ") and f"did you mean {value!r}?" in message
        TrainingConfig.from_mapping({**BASE, key: [value] if spec.words else value})  # the choice itself is read
    for value in spec.unmodelled:  # Megatron's, not modelled: refused as such, never run as another value
        with pytest.raises(ConfigError, match=f"^{key}: {value!r} is not modelled"):
            TrainingConfig.from_mapping({**BASE, key: value})


@pytest.mark.parametrize("key", sorted(set(choices.FLAGS) | {"sequence_parallel", "swiglu", "qk_layernorm",
                                                              "moe_grouped_gemm", "deterministic_mode",
                                                              "first_last_layers_bf16"}))
def test_each_switch_is_true_or_false(key):
    with pytest.raises(ConfigError, match=rf"^{key}: 'ture' is not true or false \(did you mean 'true'\?\)"):
        TrainingConfig.from_mapping({**BASE, key: "ture"})


def _number_fields() -> list[str]:
    kinds = [TrainingConfig] + [kind for kind, _ in SECTIONS.values()]
    return sorted({f.name for kind in kinds for f in dataclasses.fields(kind)  # a derived field is no setting
                   if re.match(r"(int|float)\b", str(f.type)) and not f.metadata.get("derived")})


@pytest.mark.parametrize("key", sorted(set(_number_fields()) | set(choices.NUMBERS)))
def test_each_number_names_its_key(key):
    with pytest.raises(ConfigError, match=rf"^{key}: '4x' is not a number$"):
        TrainingConfig.from_mapping({**BASE, key: "4x"})


def test_what_the_issue_saw_is_refused_in_one_line_naming_the_file_and_key(tmp_path):
    job = tmp_path / "job.yaml"
    head = "num_layers: 4\nhidden_size: 1024\nnum_attention_heads: 16\nseq_length: 1024\n"
    for line, expected in (("attention: flsh", "attention: 'flsh' is not one of flash, unfused (did you mean "
                                               "'flash'?)"),
                           ("attention: eager", "attention: 'eager' is not one of flash, unfused"),
                           ("normalization: RMSNom", "normalization: 'RMSNom' is not one of LayerNorm, RMSNorm (did "
                                                     "you mean 'RMSNorm'?)"),
                           ("transformer_impl: locl", "(did you mean 'local'?)"),
                           ("position_embedding_type: ropee", "(did you mean 'rope'?)"),
                           ("micro_batch_size: 4x", "micro_batch_size: '4x' is not a number")):
        job.write_text(head + line + "\n")
        res = CliRunner().invoke(app, ["predict", str(job), "--hardware", HW])
        assert res.exit_code == 2, (line, res.output)
        assert len(res.stderr.strip().splitlines()) == 1 and "job.yaml" in res.stderr and expected in res.stderr
    job.write_text(head)
    res = CliRunner().invoke(app, ["predict", str(job), "--hardware", HW, "--set", "normalization=rmsnrom"])
    assert res.exit_code == 2 and "normalization: 'rmsnrom' is not one of" in res.stderr


def test_megatron_spellings_are_read_as_their_choice():
    assert TrainingConfig.from_mapping({**BASE, "attention_backend": "AttnBackend.local"}).attention == "unfused"
    assert TrainingConfig.from_mapping({**BASE, "attention_backend": "fused"}).attention == "flash"
    assert TrainingConfig.from_mapping({**BASE, "normalization": "rmsnorm"}).normalization == "RMSNorm"
    assert TrainingConfig.from_mapping({**BASE, "params_dtype": "torch.bfloat16"}).precision == "bf16"
    with pytest.raises(ConfigError, match="params_dtype: 'torch.bfloat61' is not one of fp32, fp16, bf16"):
        TrainingConfig.from_mapping({**BASE, "params_dtype": "torch.bfloat61"})
    with pytest.raises(ConfigError, match=r"nccl_algo: 'nvsl' is not an NCCL algorithm .*did you mean 'NVLS'"):
        TrainingConfig.from_mapping({**BASE, "nccl_algo": "^nvsl"})


def test_a_megatron_log_block_states_its_low_precision_by_argparse_destination():
    """A log prints --fp8-format as `fp8` and every run's --fp4-recipe default (nvfp4): neither is a recipe of its
    own; `fp8 hybrid` is fp8."""
    def log(*lines: str) -> str:
        body = [f"  {k} {'.' * (40 - len(k))} {v}" for k, v in (("num_layers", 2), ("hidden_size", 1024),
                                                                  ("num_attention_heads", 16), ("seq_length", 1024),
                                                                  ("bf16", True), ("fp4_recipe", "nvfp4"),
                                                                  ("fp8_recipe", "delayed"))]
        return "\n".join(["---------- arguments ----------", *body, *lines, "---------- end of arguments ----------"])

    assert config_from_log(log()).precision == "bf16"
    assert config_from_log(log(f"  fp8 {'.' * 37} hybrid")).precision == "fp8"
    assert config_from_log(log(f"  fp4 {'.' * 37} e2m1")).precision == "nvfp4"


def test_position_embeddings_as_megatron_builds_them():
    """learned_absolute: a seq × hidden table; rope and yarn (RoPE on rescaled frequencies): rotary kernels on q and k,
    no table; none: neither."""
    def model(kind: str) -> TrainingConfig:
        return TrainingConfig(num_layers=2, hidden_size=1024, num_attention_heads=16, seq_length=2048,
                              position_embedding_type=kind)

    params = {kind: sum(chunk_params(model(kind), 0, 0)) for kind in ("learned_absolute", "rope", "yarn", "none")}
    assert params["learned_absolute"] - params["none"] == 2048 * 1024
    assert params["rope"] == params["yarn"] == params["none"]

    def names(kind: str) -> set[str]:
        graph = build_graph(model(kind), HW)
        return {op.name for segment in graph.segments for op in segment.fwd}

    assert {n for n in names("rope") if "rotary" in n} and names("rope") == names("yarn")
    assert not {n for n in names("none") if "rotary" in n or "position_embeddings" in n}
    assert "embedding.position_embeddings" in names("learned_absolute")


# -- the choices are Megatron's: read from the vendored snapshot's parser and configurations ---------------------
VENDORED = sorted((ROOT.parent / "shared" / "vendor").glob("megatron-lm-*.tar.gz"))
#: tracekit's setting → where Megatron states its values: ("argparse", flag) or (source file, field of a Literal)
MEGATRON = {
    "position_embedding_type": ("argparse", "--position-embedding-type"),
    "optimizer": ("argparse", "--optimizer"),
    "muon_tp_mode": ("argparse", "--muon-tp-mode"),
    "moe_router_load_balancing_type": ("argparse", "--moe-router-load-balancing-type"),
    "data_parallel_sharding_strategy": ("argparse", "--data-parallel-sharding-strategy"),
    "outer_dp_sharding_strategy": ("argparse", "--outer-dp-sharding-strategy"),
    "normalization": ("transformer_config.py", "normalization"),
    "recompute_method": ("transformer_config.py", "recompute_method"),
    "moe_token_dispatcher_type": ("transformer_config.py", "moe_token_dispatcher_type"),
    "moe_flex_dispatcher_backend": ("transformer_config.py", "moe_flex_dispatcher_backend"),
    "moe_router_score_function": ("transformer_config.py", "moe_router_score_function"),
    "moe_router_dtype": ("transformer_config.py", "moe_router_dtype"),
    "transformer_impl": ("transformer_config.py", "transformer_impl"),
    "fp8_format": ("transformer_config.py", "fp8"),
    "fp8_recipe": ("transformer_config.py", "fp8_recipe"),
    "fp4_format": ("transformer_config.py", "fp4"),
    "fp4_recipe": ("transformer_config.py", "fp4_recipe"),
    "cross_entropy_fusion_impl": ("model_parallel_config.py", "cross_entropy_fusion_impl"),
}


@pytest.fixture(scope="module")
def megatron_sources() -> dict[str, str]:
    wanted = ("megatron/training/arguments.py", "megatron/core/transformer/transformer_config.py",
              "megatron/core/model_parallel_config.py", "megatron/core/transformer/enums.py")
    out = {}
    with tarfile.open(VENDORED[-1]) as tar:
        for member in tar.getmembers():
            for path in wanted:
                if member.name.endswith(path):
                    handle = tar.extractfile(member)
                    assert handle is not None
                    out[path.rsplit("/", 1)[-1]] = handle.read().decode()
    assert len(out) == len(wanted)
    return out


def _quoted(text: str) -> list[str]:
    return re.findall(r"['\"]([^'\"]+)['\"]", text)


def megatron_values(sources: dict[str, str], where: tuple[str, str]) -> list[str]:
    source, name = where
    if source == "argparse":
        match = re.search(re.escape(f"'{name}'") + r"[^)]*?choices=\[([^\]]*)\]", sources["arguments.py"], re.S)
    else:
        match = re.search(rf"^\s+{name}: (?:Optional\[)?Literal\[([^\]]*)\]", sources[source], re.M)
    assert match, where
    return _quoted(match.group(1))


@pytest.mark.skipif(not VENDORED, reason="the vendored Megatron-LM snapshot is not beside the checkout")
def test_every_value_megatron_accepts_is_a_choice_or_refused_as_not_modelled(megatron_sources):
    def read(key: str, value: str) -> None:
        try:
            TrainingConfig.from_mapping({**BASE, key: value})
        except ConfigError as exc:  # Megatron's value, not modelled: said so, never taken for a typo
            assert f"{key}: {value!r} is not modelled" in str(exc)

    for key, where in MEGATRON.items():
        values = megatron_values(megatron_sources, where)
        assert values, key
        spec = choices.ENUMERATED[key]
        assert set(values) <= set(spec.values) | set(spec.unmodelled), (key, values)
        for value in values:
            read(key, value)
    backends = re.search(r"class AttnBackend\(enum.Enum\):(.*?)\n\n", megatron_sources["enums.py"], re.S)
    assert backends
    for value in re.findall(r"^\s+(\w+) = \d+", backends.group(1), re.M):
        assert TrainingConfig.from_mapping({**BASE, "attention_backend": f"AttnBackend.{value}"}).attention in (
            "flash", "unfused")
    allowed = re.search(r"allowed_modules = \{(.*?)\}", megatron_sources["transformer_config.py"], re.S)
    assert allowed
    modules = choices.ENUMERATED["recompute_modules"]
    assert set(_quoted(allowed.group(1))) == set(modules.values) - {"per_op"} | set(modules.unmodelled)
    offload = re.search(r"offload_modules: .*?choices: (.*?)\n\s+\"attn_norm\":", megatron_sources[
        "transformer_config.py"], re.S)
    assert offload
    spec = choices.ENUMERATED["offload_modules"]
    assert set(_quoted(offload.group(1))) == set(spec.values) | set(spec.unmodelled)


def test_the_inputs_page_quotes_what_predict_prints(tmp_path, monkeypatch):
    """docs/inputs.md's two refusals, as the commands print them (the page's job.yaml states `normalization: RMSNom`;
    the second command's is a valid one)."""
    page = (ROOT / "docs" / "inputs.md").read_text()
    quoted = re.findall(r"^(error: .*)$", page.split("tracekit.core.choices` holds")[1].split("```\n\n")[0], re.M)
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "job.yaml"
    head = "num_layers: 4\nhidden_size: 1024\nnum_attention_heads: 16\nseq_length: 1024\n"
    printed = []
    for text, extra in ((head + "normalization: RMSNom\n", ()), (head, ("--set", "micro_batch_size=4x"))):
        job.write_text(text)
        res = CliRunner().invoke(app, ["predict", "job.yaml", "--hardware", HW, *extra])
        assert res.exit_code == 2
        printed.append(res.stderr.strip())
    assert quoted == printed
