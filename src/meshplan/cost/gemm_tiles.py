"""Tile quantization of a linear layer's three GEMMs along the MMA's M dimension.

A GEMM kernel computes its output in whole tiles: an output dimension that is not a multiple of
the tile edge runs its last tile partly empty at the full tile's time (NVIDIA, 'Matrix
Multiplication Background User's Guide', section 'Tile Quantization'). On Blackwell the tensor
core's MMA covers M = 128 rows per SM and a CTA pair runs one MMA of M = 256 (tcgen05.mma with
cta_group::2: 'two adjacent CTAs jointly execute a single MMA, doubling the tile size', CUTLASS
'tcgen05 MMA Programming Guide'); its N edge is any multiple of 16 up to 256, so only M quantizes.

Which GEMM dimension the MMA's M takes: Transformer Engine calls cuBLAS column-major with the
weight as the first operand, so for a linear layer with weight (n out x k in) and T tokens:

* forward  Y  = X W^T : output n x T, M = n (the weight's output features);
* dgrad    dX = dY W  : output k x T, M = k;
* wgrad    dW = dY^T X: output k x n, M = k.

Each pass's time grows by tile / fill, fill = d / (ceil(d / tile) x tile); the forward is a third
of the linear layer's GEMM time and the two backward GEMMs the other two thirds (cost/layer.py
charges the backward as 2x the forward), so the layer's GEMM time is scaled by
(1 / fill(n) + 2 / fill(k)) / 3. The token dimension is left to the efficiency curve's small-
dimension falloff (cost/gemm.py: tokens per expert are an average, not a tile count).
"""

from __future__ import annotations

import numpy as np

FORWARD_SHARE = 1.0 / 3.0
"""The forward GEMM's share of a linear layer's GEMM time (backward = 2x forward, cost/layer.py)."""


def tile_fill(dim, tile: float):
    """Useful share of the output tiles along a dimension of ``dim`` rows cut into tiles of
    ``tile`` rows: dim / (ceil(dim / tile) x tile); 1 where the tile is unknown (0)."""
    d = np.asarray(dim, dtype=float)
    if tile <= 0:
        return np.ones_like(d)
    return d / (np.ceil(d / tile) * tile)


def linear_tile_factor(tile: float, n, k):
    """A linear layer's GEMM time over its unquantized time (module docstring): weight n x k."""
    if tile <= 0:
        return 1.0
    return FORWARD_SHARE / tile_fill(n, tile) + (1.0 - FORWARD_SHARE) / tile_fill(k, tile)
