"""A sliding-window (band) mask as a fused attention kernel runs it.

A decoder's sliding-window layer (GPT-OSS: window 128 on alternate layers; Beltagy et al. 2020
Sec. 3.1) lets query i see the keys (i - w, i]: w key products per query, the work
cost/mixers.py counts. A tiled kernel (FlashAttention-2, Dao 2023 Algorithm 1; cuDNN's
``diagonal_band_left_bound``) skips the key tiles outside the band, but a query tile of B rows
meets every key tile the band crosses between its first row's left edge and its last row's
diagonal: w + B keys, of which the two edge tiles are partly masked, as a causal kernel's
diagonal tile is. Both kernels run the same kind of tiles, so the band runs at the causal
kernel's rate over the whole sequence (Calibration.attention_half_seq_causal at S keys), on
w + B keys per query instead of the causal kernel's S / 2.

Check against cuDNN's published backward times (cudnn-frontend PR #505, sm120, B1 S4096 H16 D64):
causal 558.2 us, window 511 171.0 us, window 1023 276.6 us, ratios 0.306 and 0.496; the rule's
(511 + 128) / 2048 = 0.312 and (1023 + 128) / 2048 = 0.562 (tests/planner/test_band_mask.py).
"""

from __future__ import annotations

ATTENTION_KEY_TILE = 128
"""Keys per tile of a fused attention kernel at head dims up to 128 (FlashAttention-2/-3 and
cuDNN's SDPA kernels: 128-row blocks; FlashAttention-3, Shah et al. 2024, Sec. 4)."""


def band_kernel_keys(window: float, seq_len: float) -> float:
    """Keys per query a tiled kernel computes for a band of ``window`` keys (module docstring):
    w + one tile, at most the sequence."""
    return min(window + ATTENTION_KEY_TILE, seq_len)
