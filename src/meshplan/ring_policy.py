"""How meshplan's own ring attention (runtime/ring_attention.py) tiles its fp32 scores, as the
memory model of its stack reads it.

One fact read by two sides, as meshplan/fsdp_policy.py: the runtime's ring computes each hop's
block in query-row tiles of fp32 scores, (B, Nq/t, QUERY_CHUNK_ROWS, keys) per tile, and its
backward holds at most BACKWARD_LIVE_TILES of them at once (the probabilities P and dS, made in
place on dO V^T). The meshplan stack record carries both (Calibration.cp_ring_score_tile_rows,
cp_ring_backward_live_tiles; cost/cp_ring_memory.py charges them in one attention layer's backward).

Pure Python, no torch import.
"""

from __future__ import annotations

from typing import Any

QUERY_CHUNK_ROWS = 1024
"""Query rows per score tile: each hop's block is computed in tiles of (g, 1024, s) fp32 scores, so
the transient stays a few hundred MiB at s = 8K instead of several (g, s, s) matrices; the tiling
of FlashAttention (Dao et al. 2022, Sec. 3.1), over the query rows only."""
BACKWARD_LIVE_TILES = 2
"""fp32 score tiles live at once in the ring's backward: P (recomputed from the saved log-sum-exp,
in place on the scores) and dS (in place on dO V^T); P's is freed before the next tile's scores."""

RUNTIME_SOURCE = ("meshplan's ring attention tiles its fp32 scores by QUERY_CHUNK_ROWS query rows and holds "
                  "two tiles in its backward (meshplan/ring_policy.py, read by runtime/ring_attention.py)")
"""What the meshplan stack record's ring fields come from."""


def runtime_values() -> dict[str, Any]:
    """The Calibration fields of the meshplan stack that follow from the runtime's ring attention."""
    return {"cp_ring_score_tile_rows": float(QUERY_CHUNK_ROWS),
            "cp_ring_backward_live_tiles": float(BACKWARD_LIVE_TILES)}


__all__ = ["QUERY_CHUNK_ROWS", "BACKWARD_LIVE_TILES", "RUNTIME_SOURCE", "runtime_values"]
