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
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.offload import can_offload
from meshplan.plan import OFFLOAD_OPTIMIZER_BIT, OFFLOAD_PARAMS_BIT, Offload, offload_code

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


def offload_variants(space: PlanArrays, rows: np.ndarray,
                     choices: tuple[tuple[Offload, ...], ...]) -> tuple[PlanArrays, np.ndarray]:
    """Every legal offload choice of each row: the variants and the row each came from."""
    codes = np.array([offload_code(c) for c in choices], dtype=np.int64)
    src = np.repeat(rows, codes.size)
    code = np.tile(codes, rows.size)
    base = space.take(src)
    ok = legal_offload(base.zero, code)
    variants = replace(base, offload=code)
    return variants.take(ok), src[ok]


def searches_offload(cluster, options) -> bool:
    """Whether the search tries offload: the options allow it and the cluster describes its host."""
    return bool(options.offloads) and can_offload(cluster)


__all__ = ["OFFLOAD_CANDIDATES", "legal_offload", "held_back_rows", "fastest", "most_offloaded", "offload_variants",
           "searches_offload"]
