"""A sliding-window (band) mask as a fused attention kernel runs it.

A decoder's sliding-window layer (GPT-OSS: window 128 on alternate layers; Beltagy et al. 2020
Sec. 3.1) lets query i see keys (i - w, i]: each query row does w key products, the work
cost/mixers.py charges (2 T w N (d_qk + d_v)). A tiled kernel (FlashAttention-2, Dao 2023
Algorithm 1; cuDNN's ``diagonal_band_left_bound``) skips the tiles outside the band, but every
tile it keeps is cut by the mask: a query tile of B rows meets the w/B + 1 key tiles the band
crosses, all of them partially masked, as a causal kernel's diagonal tile is. So the kernel
runs like a causal kernel, not like a dense one over w keys, and its per-tile fixed work (load
Q, rescale, write O) is amortised over as few key tiles as a causal kernel of length 2 w has on
average ((2w/B + 1) / 2 = w/B + 1/2 per query tile), which does the same mean w key products
per query. The band is therefore costed on the causal efficiency curve at 2 w keys
(Calibration.attention_half_seq_causal), its FLOPs unchanged.
"""

from __future__ import annotations

BAND_CAUSAL_KEYS_PER_WINDOW = 2.0
"""Keys of the causal kernel with the same mean keys per query as a band of width w: 2 w
(a causal row i sees i + 1 keys, mean L / 2 over L rows; module docstring)."""


def band_equivalent_causal_keys(window: float, seq_len: float) -> float:
    """KV length of the causal kernel a band of ``window`` keys runs like (module docstring);
    the whole sequence once 2 w reaches it."""
    return min(BAND_CAUSAL_KEYS_PER_WINDOW * window, seq_len)
