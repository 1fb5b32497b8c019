"""Offload as a searched choice: the offload variants of the configurations memory holds back.

Offloading only trades time for GPU memory (:mod:`meshplan.cost.offload`): every variant is at
least as slow as its configuration without offload, up to the host's optimizer step replacing the
GPU's (CPU Adam streams host DRAM, some 10-50x slower than the HBM-bound GPU step it replaces).
So a variant can only become the recommended plan, or a frontier point below the others'
memory, when its configuration does not fit the budget on its own. The search scores the
most offloaded variant of every such configuration that is faster than the fastest plan that
fits (every one when none fits), which is its memory floor, then every choice of the
OFFLOAD_CANDIDATES fastest configurations whose floor fits, with an even layer split; their points
join the frontier like any other.

Where the target offloads the activations of a count of layers (Megatron-Core's
``cpu_offloading_num_layers``, 1 to ``num_layers - 1``: export/megatron.py; NVIDIA's
Megatron-Bridge recipes offload 20 to 92 layers of Llama 3 70B / 3.1 405B on GB200 / GB300,
data/bridge_recipes.csv), a variant's floor is its largest count, and of a variant whose floor
fits the budget the pass also scores the fewest layers that fit (:func:`fewest_fitting_counts`).
The count trades time for memory monotonically (``cost.offload.rank_offload``: each offloaded
layer removes its share of the stored activations and adds its share of the copies), so of the
counts that fit, the fewest is the fastest and uses the least host memory: the recommendation
over every count is exactly one of these two points per variant (tests/search/
test_offload_counts.py enumerates every count). Intermediate counts, between the two memory
levels and slower than the fewest, are not frontier points the search keeps.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.offload import can_offload
from meshplan.plan import OFFLOAD_ACTIVATIONS_BIT, OFFLOAD_OPTIMIZER_BIT, OFFLOAD_PARAMS_BIT, Offload, offload_code

OFFLOAD_CANDIDATES = 4096
"""Configurations whose offload variants are scored (fastest first). A work bound, not a
dominance rule: on llama3-70b x 8 H100 and llama3.1-405b x 64 H100 4096 and 65536 give the same
recommended plan; it keeps the pass under a tenth of the search's time on the largest spaces."""



def legal_offload(zero: np.ndarray, code: np.ndarray) -> np.ndarray:
    """Plan's rules, vectorised: ``params`` needs ``optimizer`` and ZeRO-3."""
    par = (code & OFFLOAD_PARAMS_BIT) > 0
    return ~par | (((code & OFFLOAD_OPTIMIZER_BIT) > 0) & (zero == 3))


def held_back_rows(time_s: np.ndarray, memory_bytes: np.ndarray, budget_bytes: float,
                   fastest_fitting_s: float) -> np.ndarray:
    """Rows over the budget and faster than the fastest plan that fits (every row over the
    budget when none fits): the only ones whose offload variants can be recommended."""
    return np.flatnonzero((memory_bytes > budget_bytes) & (time_s < fastest_fitting_s))


def fastest(rows: np.ndarray, time_s: np.ndarray, limit: int = OFFLOAD_CANDIDATES) -> np.ndarray:
    """The distinct ``rows`` of the ``limit`` smallest ``time_s`` (aligned with ``rows``)."""
    if rows.size > limit:
        keep = np.argpartition(time_s, limit - 1)[:limit]
        rows = rows[keep]
    return np.unique(rows)


def most_offloaded(choices: tuple[tuple[Offload, ...], ...]) -> tuple[tuple[Offload, ...], ...]:
    """Of ``choices``, those no other choice offloads more than (a superset of), with and
    without ``params`` (legal with ZeRO-3 only): a row's least memory is one of theirs."""
    def maximal(cs):
        sets = [frozenset(c) for c in cs]
        return [c for c, s in zip(cs, sets) if not any(s < o for o in sets)]

    out = maximal(list(choices)) + maximal([c for c in choices if Offload.PARAMS not in c])
    return tuple(dict.fromkeys(tuple(c) for c in out))


def maximal_per_row(src: np.ndarray, code: np.ndarray) -> np.ndarray:
    """Indices of the variants (row ``src``, offload bit mask ``code``) that no other variant of
    the same row offloads more than (a strict superset of its choices): a row's least memory is
    one of theirs. Taken after the target's mask, not before (Megatron offloads the optimizer
    only with zero 1, so of an FSDP row the most it offloads is the activations alone)."""
    keep = np.ones(src.size, dtype=bool)
    for c in np.unique(code):
        wider = np.unique(src[((code & c) == c) & (code != c)])
        keep &= ~((code == c) & np.isin(src, wider))
    return np.flatnonzero(keep)


def offload_variants(space: PlanArrays, rows: np.ndarray, choices: tuple[tuple[Offload, ...], ...],
                     layer_count: int = 0) -> tuple[PlanArrays, np.ndarray]:
    """Every legal offload choice of each row: the variants and the row each came from; those
    offloading activations offload ``layer_count`` layers' (0: every layer's)."""
    codes = np.array([offload_code(c) for c in choices], dtype=np.int64)
    src = np.repeat(rows, codes.size)
    code = np.tile(codes, rows.size)
    base = space.take(src)
    ok = legal_offload(base.zero, code)
    variants = with_layer_count(replace(base, offload=code), layer_count)
    return variants.take(ok), src[ok]


def with_layer_count(variants: PlanArrays, count) -> PlanArrays:
    """``variants`` offloading ``count`` layers' activations where they offload activations (0
    where they do not: ``Plan`` counts layers only with activation offload)."""
    act = (variants.offload & OFFLOAD_ACTIVATIONS_BIT) > 0
    return replace(variants, offload_layers=np.where(act, count, 0))


def most_layer_count(num_layers: int, counted: bool) -> int:
    """The floor's count: ``num_layers - 1`` where the target counts layers (Megatron-Core offloads
    fewer layers than the model has: export/megatron.py), else 0 (every layer)."""
    return max(num_layers - 1, 0) if counted else 0


def fewest_fitting_counts(variants: PlanArrays, most: int, budget_bytes: float,
                          peak_of: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    """Per variant (each offloading ``most`` layers' activations and fitting ``budget_bytes`` so),
    the fewest layers 1..``most`` whose peak fits. ``peak_of(idx, counts)`` is the peak memory of
    the variants ``idx`` offloading ``counts`` layers each. The peak does not grow with the count
    (``cost.offload.rank_offload``), so a bisection per row finds it exactly in
    ceil(log2(most)) calls, each over the rows still open (a bounded work)."""
    n = len(variants)
    lo, hi = np.ones(n, dtype=np.int64), np.full(n, most, dtype=np.int64)  # hi always fits
    while True:
        idx = np.flatnonzero(lo < hi)
        if not idx.size:
            return hi
        mid = (lo[idx] + hi[idx]) // 2
        fits = peak_of(idx, mid) <= budget_bytes
        hi[idx] = np.where(fits, mid, hi[idx])
        lo[idx] = np.where(fits, lo[idx], mid + 1)


def searches_offload(cluster, options) -> bool:
    """Whether the search tries offload: the options allow it and the cluster describes its host."""
    return bool(options.offloads) and can_offload(cluster)


__all__ = ["OFFLOAD_CANDIDATES", "legal_offload", "held_back_rows", "fastest", "most_offloaded", "maximal_per_row",
           "offload_variants", "with_layer_count", "most_layer_count", "fewest_fitting_counts", "searches_offload"]
