"""Capture one transformer block's forward and backward under `torch.compile` on this CPU with torch's profiler: the
fixture `tests/data/compile/<name>.json.gz` that tests/test_compile_fusion.py checks predictor.layers.compile_fusion
against.

Two blocks, shaped as the trainers tracekit models build them and compiled per block as torchtitan's
`apply_compile` does (`torch.compile(block, fullgraph=True)`):
- `llama`: torchtitan's Llama 3 block (RMSNorm, rotary embeddings on q and k with the tables passed in, grouped-query
  SDPA, SwiGLU, no biases, no dropout);
- `gpt`: a GPT-2/MPT-style block (LayerNorm, learned positions outside the block, SDPA, GeLU MLP, biases, hidden
  dropout 0.1 before each residual add).

Inductor emits C++ kernels on a CPU; `cpp.enable_kernel_profile` gives each a profiler range named
`graph_<n>_cpp_fused_<ops>_<index>`. The trace is saved as the profiler writes it (Chrome JSON), gzip-compressed.

    PYTHONPATH=. python tools/capture_compiled_block.py [llama|gpt ...]      (≈1 min per block the first time)
"""
from __future__ import annotations

import gzip
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "compile"
#: Shapes of both blocks: hidden, heads, kv heads, ffn, batch, sequence.
HIDDEN, HEADS, BATCH, SEQ = 64, 4, 2, 32


class LlamaBlock(nn.Module):
    def __init__(self, kv_heads: int = 2, ffn: int = 128) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.d = HEADS, kv_heads, HIDDEN // HEADS
        self.attention_norm, self.ffn_norm = nn.RMSNorm(HIDDEN, eps=1e-5), nn.RMSNorm(HIDDEN, eps=1e-5)
        self.wq = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.wk = nn.Linear(HIDDEN, kv_heads * self.d, bias=False)
        self.wv = nn.Linear(HIDDEN, kv_heads * self.d, bias=False)
        self.wo = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.w1 = nn.Linear(HIDDEN, ffn, bias=False)
        self.w3 = nn.Linear(HIDDEN, ffn, bias=False)
        self.w2 = nn.Linear(ffn, HIDDEN, bias=False)

    @staticmethod
    def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-second, first), dim=-1) * sin

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        y = self.attention_norm(x)
        q, k, v = self.wq(y), self.wk(y), self.wv(y)  # torchtitan's order: the three projections, then RoPE
        q = self.rotary(q.view(b, s, self.heads, self.d), cos, sin)
        k = self.rotary(k.view(b, s, self.kv_heads, self.d), cos, sin)
        v = v.view(b, s, self.kv_heads, self.d)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           enable_gqa=True)
        h = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
        z = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(z)) * self.w3(z))


class GPTBlock(nn.Module):
    def __init__(self, ffn: int = 4 * HIDDEN, dropout: float = 0.1) -> None:
        super().__init__()
        self.d, self.dropout = HIDDEN // HEADS, dropout
        self.ln_1, self.ln_2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.fc1 = nn.Linear(HIDDEN, ffn)
        self.fc2 = nn.Linear(ffn, HIDDEN)

    def forward(self, x: torch.Tensor, *_: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln_1(x)).view(b, s, 3, HEADS, self.d).unbind(2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        h = x + F.dropout(self.proj(o.transpose(1, 2).reshape(b, s, -1)), self.dropout, self.training)
        return h + F.dropout(self.fc2(F.gelu(self.fc1(self.ln_2(h)))), self.dropout, self.training)


BLOCKS = {"llama": LlamaBlock, "gpt": GPTBlock}


def capture(name: str, out: Path = OUT) -> Path:
    """Compile block `name`, run it twice, profile a third forward + backward; the gzip'd trace's path."""
    import torch._inductor.config as inductor_config
    from torch.profiler import ProfilerActivity, profile

    inductor_config.cpp.enable_kernel_profile = True
    torch.manual_seed(0)
    block = torch.compile(BLOCKS[name](), fullgraph=True)
    x = torch.randn(BATCH, SEQ, HIDDEN, requires_grad=True)
    angles = torch.randn(SEQ, 1, HIDDEN // HEADS // 2)  # the rotary tables, an input of the block as in torchtitan
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    for _ in range(2):
        block(x, cos, sin).sum().backward()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        block(x, cos, sin).sum().backward()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}_block_cpu_compiled.json.gz"
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return path


if __name__ == "__main__":
    for arg in sys.argv[1:] or list(BLOCKS):
        print(capture(arg))
