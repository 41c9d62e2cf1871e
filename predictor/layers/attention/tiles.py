"""Keys a fused attention kernel reads per query under a sliding window: whole key tiles, not the window.

FlashAttention-2/3 and cuDNN's fused attention (Transformer Engine's `FusedAttention`, the kernel that runs GPT-OSS's
learnable-sink attention) walk the keys in tiles of `Bc` keys for each tile of `Br` queries. A tile that holds any
unmasked score is computed whole (the mask zeroes the rest after the matrix products); only the tiles entirely
outside the mask are skipped. Under a window of w keys (Megatron's `window_size` (w − 1, 0): query q reads keys
q − w + 1 … q), the query tile [q0, q0 + Br) needs keys [q0 − w + 1, q0 + Br − 1]: with w = Br = Bc = 128 that is
two key tiles, 256 keys per query computed for 128 the window reads (the first query tile, which has no keys before
it, one).

The operator models learned full-length kernels, causal and not (their samples hold no windowed kernel), so a
window layer's attention row is sized as the kernel runs it: a non-causal kernel over `window_keys` keys per query,
the mean over query tiles of the key tiles each touches × Bc. Causal full attention keeps its own rows (its diagonal
tiles are inside the samples that measured causal kernels).

Tile sizes: 128 × 128 (queries × keys), the forward tile of cuDNN's and FlashAttention-3's Hopper kernels and of the
Blackwell kernels for head dims up to 128 (FlashAttention-3's paper, section 3; cuDNN's SDPA documentation names
no other for these head dims).
"""
from __future__ import annotations

import numpy as np

#: Query rows and key columns of one tile of the fused attention kernel (module docstring).
QUERY_TILE = 128
KEY_TILE = 128


def window_keys(seq: int, window: int, query_tile: int = QUERY_TILE, key_tile: int = KEY_TILE) -> float:
    """Keys per query a fused kernel computes for a causal window of `window` keys over `seq` queries (and keys):
    the mean over query tiles of the key tiles touching the band [q − window + 1, q], × `key_tile`. At least
    min(window, seq) (the exact band, on average somewhat less near the start), at most the causal kernel's."""
    if seq <= 0 or window <= 0:
        return 0.0
    starts = np.arange(0, seq, query_tile, dtype=np.int64)
    last = np.minimum(starts + query_tile, seq) - 1  # the tile's last query
    first_key = np.maximum(starts - window + 1, 0)
    tiles = last // key_tile - first_key // key_tile + 1
    return float(tiles.mean() * key_tile)
