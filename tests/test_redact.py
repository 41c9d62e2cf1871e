"""Credentials never reach what tracekit writes: a table of command-line words, environment assignments and log
lines, with the ones that must stay as typed (`--tokenizer-type`, `--num-tokens`)."""
from __future__ import annotations

import pytest

from tracekit.core.redact import redact, redact_argv, redact_text

WANDB = "0123456789abcdef0123456789abcdef01234567"

# (command line, what it must become)
ARGV_CASES = [
    (["WANDB_API_KEY=" + WANDB], ["WANDB_API_KEY=<redacted>"]),
    (["AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG"], ["AWS_SECRET_ACCESS_KEY=<redacted>"]),
    (["AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE"], ["AWS_ACCESS_KEY_ID=<redacted>"]),
    (["HF_TOKEN=abc"], ["HF_TOKEN=<redacted>"]),
    (["DB_PASSWD=x"], ["DB_PASSWD=<redacted>"]),
    (["--hf-token", "hf_x"], ["--hf-token", "<redacted>"]),
    (["--password", "p"], ["--password", "<redacted>"]),
    (["--password=p"], ["--password=<redacted>"]),
    (["--api-key=abc"], ["--api-key=<redacted>"]),
    (["--wandb-key", "k1"], ["--wandb-key", "<redacted>"]),
    (["--auth", "u:p"], ["--auth", "<redacted>"]),
    (["--note", "hf_abcdefghijklmnop"], ["--note", "<redacted>"]),
    (["--note", "ghp_abcdefghijklmnop"], ["--note", "<redacted>"]),
    (["--data", "https://me:s3cret@host/x"], ["--data", "https://me:<redacted>@host/x"]),
    (["-H", "Authorization: Bearer abcdefghijkl"], ["-H", "Authorization: Bearer <redacted>"]),
    (["bash", "-c", "HF_TOKEN=abc python train.py --password p --num-layers 2"],
     ["bash", "-c", "'HF_TOKEN=<redacted>' python train.py --password '<redacted>' --num-layers 2"]),
    # must NOT be redacted
    (["--tokenizer-type", "GPT2BPETokenizer"], ["--tokenizer-type", "GPT2BPETokenizer"]),
    (["--num-tokens", "1024"], ["--num-tokens", "1024"]),
    (["--tokenizer-model", "tok.model"], ["--tokenizer-model", "tok.model"]),
    (["--key-size", "64"], ["--key-size", "64"]),
    (["CUDA_VISIBLE_DEVICES=0,1", "--lr", "1e-4"], ["CUDA_VISIBLE_DEVICES=0,1", "--lr", "1e-4"]),
    (["--use-flash-attn", "--num-layers", "24"], ["--use-flash-attn", "--num-layers", "24"]),
    (["--max-position-embeddings", "4096"], ["--max-position-embeddings", "4096"]),
    # Megatron settings with a token in the middle of their names: what they count or route, not a credential
    (["--calculate-per-token-loss", "pretrain_gpt.py"], ["--calculate-per-token-loss", "pretrain_gpt.py"]),
    (["--moe-token-dispatcher-type", "alltoall"], ["--moe-token-dispatcher-type", "alltoall"]),
    (["--moe-token-drop-policy=probs"], ["--moe-token-drop-policy=probs"]),
    (["ACCESS_TOKEN=abc"], ["ACCESS_TOKEN=<redacted>"]),
]


@pytest.mark.parametrize("argv, expected", ARGV_CASES)
def test_command_lines(argv, expected):
    assert redact_argv(argv) == expected


@pytest.mark.parametrize("line, secret, kept", [
    ("export WANDB_API_KEY=" + WANDB, WANDB, "export WANDB_API_KEY="),
    ("  hf_token ........................ hf_abcdefghijk", "hf_abcdefghijk", "hf_token"),
    ("  password: hunter2", "hunter2", "password:"),
    ("launching python train.py --hf-token hfx1 --num-layers 2", "hfx1", "--num-layers 2"),
    ("GET https://user:pa55@example.org/data", "pa55", "https://user:"),
    ("  tokenizer_type .................. GPT2BPETokenizer", None, "GPT2BPETokenizer"),
    ("iteration 10/ 100 | consumed tokens: 40960 | lm loss: 1.2E+01", None, "40960"),
    ("  moe_token_dispatcher_type ....... alltoall", None, "alltoall"),
    ("  calculate_per_token_loss ........ True", None, "True"),
])
def test_log_lines(line, secret, kept):
    clean = redact_text(line)
    assert kept in clean
    if secret:
        assert secret not in clean and "<redacted>" in clean
    else:
        assert clean == line


def test_structures_keep_tokenizer_settings_and_drop_environments():
    doc = redact({"metadata": {"env": {"HF_TOKEN": "x"}}, "tokenizer_type": "GPT2BPETokenizer", "num_tokens": 5,
                  "hf_token": "abc", "nested": [{"api_key": "k"}, "token hf_abcdefghijklmn"]})
    assert doc == {"tokenizer_type": "GPT2BPETokenizer", "num_tokens": 5, "hf_token": "<redacted>",
                   "nested": [{"api_key": "<redacted>"}, "token <redacted>"]}


def test_a_capture_keeps_no_credential_in_its_log_or_manifest(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    tracekit = str(Path(sys.executable).parent / "tracekit")
    script = "import os; print('key', os.environ['WANDB_API_KEY']); print('HF_TOKEN=hf_abcdefghijklmnop')"
    done = subprocess.run([tracekit, "capture", "--out", str(tmp_path / "cap"), "--steps", "2-5", "--", "env",
                           f"WANDB_API_KEY={WANDB}", sys.executable, "-c", script], capture_output=True, text=True)
    assert "key " + WANDB in done.stdout  # the user's own terminal sees the program's output unchanged
    kept = (tmp_path / "cap" / "train.log").read_text() + (tmp_path / "cap" / "manifest.json").read_text()
    assert WANDB not in kept and "hf_abcdefghijklmnop" not in kept
    assert json.loads((tmp_path / "cap" / "manifest.json").read_text())["command"][1] == "WANDB_API_KEY=<redacted>"


def test_a_switch_named_like_a_credential_keeps_its_value():
    """A capture's manifest keeps its configuration's settings: a true/false value holds no credential, and a token
    inside a setting's name is what it counts (calculate_per_token_loss) or routes (moe_token_dispatcher_type)."""
    doc = redact({"calculate_per_token_loss": True, "moe_token_dispatcher_type": "alltoall", "rl_skip_bos_token": False,
                  "use_auth": False, "access_token": "abc", "wandb_api_key": None})
    assert doc == {"calculate_per_token_loss": True, "moe_token_dispatcher_type": "alltoall",
                   "rl_skip_bos_token": False, "use_auth": False, "access_token": "<redacted>", "wandb_api_key": None}
