"""Pareto utilities: the frontier of non-dominated (step time, peak memory) points.

Both objectives are minimised. A point dominates another when it is no worse in both and better in
one; the frontier keeps every point that nothing dominates, so one search answers every memory
budget (TensorOpt's frontier tracking, Cai et al. 2021, Sec. 4) instead of one optimum per budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


_PREFILTER_MIN = 20_000
"""Above this many points :func:`pareto_mask` first drops points dominated by a sample's frontier."""
_PREFILTER_STRIDE = 64


def pareto_mask(time_s: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """Boolean mask of the non-dominated points (minimise both). Exact duplicates keep one copy.

    Sort by (time, memory); walking in that order a point is on the frontier iff its memory is
    strictly below every memory seen before it. O(n log n).
    """
    t = np.asarray(time_s, dtype=float)
    m = np.asarray(memory, dtype=float)
    if t.shape != m.shape or t.ndim != 1:
        raise ValueError("pareto_mask needs two 1-D arrays of equal length")
    mask = np.zeros(t.shape, dtype=bool)
    if t.size == 0:
        return mask
    if t.size > _PREFILTER_MIN:
        # Drop the points strictly dominated by the frontier of a strided sample (a cheap
        # O(n log s) pass) and sort only the rest; what is dropped is off the frontier, and ties
        # are left to the exact pass below, so the result is the same mask.
        sample = np.arange(0, t.size, _PREFILTER_STRIDE)
        sf = sample[pareto_indices(t[sample], m[sample])]
        drop = beaten_faster(t[sf], m[sf], t, m)
        rest = np.flatnonzero(~drop)
        mask[rest[pareto_mask(t[rest], m[rest])]] = True
        return mask
    order = np.lexsort((m, t))
    m_sorted = m[order]
    prev_min = np.minimum.accumulate(np.concatenate(([np.inf], m_sorted[:-1])))
    mask[order[m_sorted < prev_min]] = True
    return mask


def pareto_indices(time_s: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """Indices of the frontier points, fastest first."""
    t = np.asarray(time_s, dtype=float)
    idx = np.flatnonzero(pareto_mask(t, memory))
    return idx[np.argsort(t[idx], kind="stable")]


def dominated_by(front_time_s: np.ndarray, front_memory: np.ndarray,
                 time_s: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """For each query point, whether some frontier point is at least as good in both objectives.

    ``front_*`` must be a frontier sorted by time ascending (so memory descends). A query (t, m)
    is covered iff the frontier point with the largest time <= t has memory <= m.
    """
    ft = np.asarray(front_time_s, dtype=float)
    fm = np.asarray(front_memory, dtype=float)
    t = np.asarray(time_s, dtype=float)
    m = np.asarray(memory, dtype=float)
    if ft.size == 0:
        return np.zeros(t.shape, dtype=bool)
    return _step_lookup(fm, np.searchsorted(ft, t, side="right")) <= m


def beaten_faster(front_time_s: np.ndarray, front_memory: np.ndarray,
                  time_s: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """For each query point, whether some point of the frontier (fastest first) is strictly faster
    and no larger in memory: such a query is off the frontier of any set holding that point, and
    is no exact duplicate of a frontier point (which ``pareto_mask``'s ties would keep)."""
    # the memory of the frontier point strictly faster, NaN where none is (never <=)
    return _step_lookup(np.asarray(front_memory, dtype=float),
                        np.searchsorted(front_time_s, time_s, side="left")) <= memory


def _step_lookup(values: np.ndarray, count: np.ndarray) -> np.ndarray:
    """``values[count - 1]``, NaN where ``count`` is 0 (no point precedes the query; NaN
    compares False): one gather instead of masked passes over millions of queries."""
    return np.concatenate(([np.nan], values))[count]


@dataclass(frozen=True)
class Front:
    """A frontier as parallel arrays, fastest first; ``key`` indexes whatever produced each point."""

    time_s: np.ndarray
    memory_bytes: np.ndarray
    key: np.ndarray

    @staticmethod
    def empty() -> "Front":
        return Front(np.empty(0), np.empty(0), np.empty(0, dtype=np.int64))

    @staticmethod
    def of(time_s: np.ndarray, memory_bytes: np.ndarray, key: np.ndarray) -> "Front":
        idx = pareto_indices(time_s, memory_bytes)
        return Front(np.asarray(time_s, float)[idx], np.asarray(memory_bytes, float)[idx],
                     np.asarray(key)[idx])

    def __len__(self) -> int:
        return int(self.time_s.size)


def merge_fronts(*fronts: Front) -> Front:
    """Frontier of the union of several frontiers (keys kept)."""
    if not fronts:
        return Front.empty()
    return Front.of(np.concatenate([f.time_s for f in fronts]),
                    np.concatenate([f.memory_bytes for f in fronts]),
                    np.concatenate([f.key for f in fronts]))


def filter_budget(front: Front, budget_bytes: float) -> Front:
    """Points whose peak memory fits ``budget_bytes``."""
    keep = front.memory_bytes <= budget_bytes
    return Front(front.time_s[keep], front.memory_bytes[keep], front.key[keep])
