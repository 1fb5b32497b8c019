"""Fits from raw micro-benchmark samples (pure NumPy, no torch).

Two models, both in the scaling book's terms (a quantity over a rate):

* Collectives: the alpha-beta (Hockney) model ``t = alpha + f(n) * S / W`` where S is the
  message size in bytes, W the per-rank link ("bus") bandwidth and f(n) the fraction of S that
  each rank sends on a ring of n ranks (Thakur, Rabenseifner & Gropp 2005, Sec. 4; the "bus
  bandwidth" convention of nccl-tests): all-reduce 2(n-1)/n, all-gather and reduce-scatter
  (n-1)/n of the full buffer, all-to-all (n-1)/n of the per-rank buffer, send/recv 1.
* Matmuls: an achieved-FLOP/s curve that saturates with size, ``eff(d) = eff_max * d / (d + d_half)``
  where d is the smallest of the three matmul dimensions (small dims leave the tensor cores or the
  vector units underfed; d_half is the dimension at which half of eff_max is reached).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from meshplan.errors import MeshplanError


class CollectiveOp(str, enum.Enum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"
    # Through the runtime's tensor-parallel path: a DTensor redistribute of a (B, S, D) activation
    # between Shard(1) (sequence shards) and Replicate / Partial, what TP + SP does around each
    # attention and MLP block (the gather along dim 1 adds a chunk + cat to the collective).
    TP_ALL_GATHER = "tp_all_gather"
    TP_REDUCE_SCATTER = "tp_reduce_scatter"

    @property
    def raw(self) -> bool:
        """A plain torch.distributed collective (the link's own figures are fitted on these)."""
        return self not in (CollectiveOp.TP_ALL_GATHER, CollectiveOp.TP_REDUCE_SCATTER)


def bus_factor(op: CollectiveOp, group_size: int) -> float:
    """f(n): bytes each rank puts on its link per byte of message, on a ring of n ranks."""
    n = group_size
    if n < 2:
        raise MeshplanError(f"a collective needs at least 2 ranks, got {n}")
    if op is CollectiveOp.ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if op is CollectiveOp.SEND_RECV:
        return 1.0
    return (n - 1) / n


@dataclass(frozen=True, kw_only=True)
class AlphaBeta:
    """``t = latency_s + bus_bytes / bandwidth_bytes_per_s``, fitted on relative error."""

    latency_s: float
    bandwidth_bytes_per_s: float
    max_rel_error: float
    """Largest |fit - measured| / measured over the samples used."""

    def time_s(self, bus_bytes: float) -> float:
        return self.latency_s + bus_bytes / self.bandwidth_bytes_per_s


def fit_alpha_beta(bus_bytes: Sequence[float], times_s: Sequence[float]) -> AlphaBeta:
    """Least squares of t = a + b * x on relative error (rows scaled by 1/t), a >= 0, b > 0.

    Relative weighting keeps small (latency-bound) and large (bandwidth-bound) messages equally
    important; an unweighted fit would let the largest message decide everything.
    """
    x = np.asarray(bus_bytes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if x.shape != t.shape or x.size < 2:
        raise MeshplanError("an alpha-beta fit needs at least two (bytes, time) samples")
    if np.any(t <= 0) or np.any(x < 0):
        raise MeshplanError("collective samples need positive times and non-negative sizes")
    w = 1.0 / t
    design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    if a < 0:  # latency cannot be negative: refit the slope through the origin
        a = 0.0
        b = float(np.sum(x * w * w * t) / np.sum((x * w) ** 2))
    if b <= 0:  # flat or noisy timings: bandwidth from the largest message alone
        i = int(np.argmax(x))
        b = max(t[i] - a, 1e-12) / max(x[i], 1.0)
    pred = a + b * x
    return AlphaBeta(latency_s=float(a), bandwidth_bytes_per_s=float(1.0 / b),
                     max_rel_error=float(np.max(np.abs(pred - t) / t)))


@dataclass(frozen=True, kw_only=True)
class MatmulCurve:
    """Achieved matmul FLOP/s as a fraction of a peak: ``eff_max * d / (d + d_half)``."""

    eff_max: float
    d_half: float
    """Smallest-dimension size at which half of eff_max is reached."""
    max_rel_error: float

    def efficiency(self, m: int, n: int, k: int) -> float:
        d = min(m, n, k)
        return self.eff_max * d / (d + self.d_half)


def fit_matmul_curve(dims: Sequence[tuple[int, int, int]], flops_per_s: Sequence[float],
                     peak_flops: float) -> MatmulCurve:
    """Fit eff_max and d_half to measured matmuls (efficiency = achieved / peak_flops).

    1/eff = (1/eff_max) + (d_half/eff_max) * (1/d) is linear in 1/d: ordinary least squares on
    that line (relative error in eff is what matters), then clamp to a physical range.
    """
    if len(dims) < 2 or len(dims) != len(flops_per_s):
        raise MeshplanError("a matmul curve fit needs at least two shapes")
    if peak_flops <= 0:
        raise MeshplanError("matmul curve fit needs a positive peak")
    d = np.array([min(s) for s in dims], dtype=float)
    eff = np.asarray(flops_per_s, dtype=float) / peak_flops
    if np.any(eff <= 0) or np.any(d <= 0):
        raise MeshplanError("matmul samples need positive dimensions and throughput")
    design = np.stack([np.ones_like(d), 1.0 / d], axis=1)
    (c0, c1), *_ = np.linalg.lstsq(design, 1.0 / eff, rcond=None)
    if c0 <= 0:  # degenerate (all shapes alike): flat curve at the best measured efficiency
        eff_max, d_half = float(eff.max()), 0.0
    else:
        eff_max, d_half = float(1.0 / c0), float(max(c1, 0.0) / c0)
    pred = eff_max * d / (d + d_half)
    return MatmulCurve(eff_max=eff_max, d_half=d_half,
                       max_rel_error=float(np.max(np.abs(pred - eff) / eff)))


def fit_seq_falloff(seq_lens: Sequence[int], efficiencies: Sequence[float]) -> MatmulCurve:
    """Fit ``eff_max * S / (S + S_half)`` to an attention kernel's efficiency over a sweep of S.

    The same line as the matmul curve (1/eff = 1/eff_max + (S_half/eff_max) / S), but weighted by
    eff (each row's residual relative to its 1/eff, i.e. to its time): over S = 16..4096 an
    unweighted fit lets the shortest, slowest calls decide the curve.
    """
    s = np.asarray(seq_lens, dtype=float)
    eff = np.asarray(efficiencies, dtype=float)
    if s.size < 2 or s.shape != eff.shape:
        raise MeshplanError("a sequence falloff fit needs at least two lengths")
    if np.any(eff <= 0) or np.any(s <= 0):
        raise MeshplanError("attention samples need positive lengths and throughput")
    y = 1.0 / eff
    design = np.stack([np.ones_like(s), 1.0 / s], axis=1) / y[:, None]
    (c0, c1), *_ = np.linalg.lstsq(design, np.ones_like(s), rcond=None)
    if c0 <= 0:  # degenerate (time grows slower than S^2 over the sweep): flat at the best seen
        eff_max, s_half = float(eff.max()), 0.0
    else:
        eff_max, s_half = float(1.0 / c0), float(max(c1, 0.0) / c0)
    pred = eff_max * s / (s + s_half)
    return MatmulCurve(eff_max=eff_max, d_half=s_half, max_rel_error=float(np.max(np.abs(pred - eff) / eff)))
