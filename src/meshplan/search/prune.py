"""Dominance pruning before the full estimate: configurations whose lower bound a known plan
already beats are never scored in full.

TensorOpt's frontier tracking (Cai et al. 2021, Sec. 4) keeps only the non-dominated partial
states. Here the partial state of a global configuration is the cost of one *mean rank*
(:func:`meshplan.search.even.balanced_slice`: L / p layers, neither the embedding nor the LM
head): ``compose`` takes the slowest rank for the micro-batch time and the most loaded for the
memory (a max over ranks, and the step is increasing in the micro-batch time), and the mean rank
is below the slowest rank of every layer split (the even one included) and below the even
split's first rank in memory; with one rank (``pp == 1``) it *is* the even split. The cost model
is not restated: the bound is the cost model's own ``rank_cost`` and ``compose`` over one rank.

A configuration is dropped without its full estimate when a plan already scored exactly beats
its bound made ``1 / (1 + REFINE_SLACK)`` faster and leaner, strictly (:func:`prunable`): its
exact even point is then off the even-split frontier and is no refinement candidate either (the
planner's refinement test is that point so shrunk, or at the mean rank's step time where that is
faster: both are at least the bound so shrunk, against that frontier), so the frontier the
search returns is the one without pruning. A dropped configuration keeps its bound in place of
its exact point: every consumer of the even points reads them only through those tests and the
offload pass's "held back" test, which the bound also decides (a dropped configuration is no
faster than a plan that fits; see :func:`prunable`).

Adding a dimension to the space (a new column of ``PlanArrays``) needs nothing here as long as
the mean rank's ``rank_cost`` still bounds ``compose`` from below (tests/planner/
test_search_bruteforce.py checks it against every split of small configurations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from meshplan.search.frontier import Front, dominated_by, pareto_indices

STRICT = 1.0 - 1e-9
"""A bound is pruned only when a known plan beats it by this factor in both objectives, so that
no pruned configuration ties an exact frontier point (ties keep the first key: the frontier's
keys could change)."""

SETTLE_ROWS = 1 << 15
"""Configurations scored in full per round (fastest bound first); after each round the known
frontier grows and the remaining bounds are tested again."""


@dataclass(frozen=True)
class EvenPoints:
    """Per configuration: the even split's (step time, peak memory, host memory), exact where
    ``exact`` and a lower bound (the mean rank, :func:`meshplan.search.even.balanced_slice`)
    elsewhere."""

    step_time_s: np.ndarray
    peak_memory_bytes: np.ndarray
    host_memory_bytes: np.ndarray
    exact: np.ndarray


def prunable(known: Front, time_s: np.ndarray, memory_bytes: np.ndarray, *, shrink: float,
             fastest_fitting_s: float) -> np.ndarray:
    """Bounds (time, memory) that need no exact score: a known exact point beats the bound times
    ``shrink`` (the refinement test's factor) strictly in both objectives, and the bound is no
    faster than ``fastest_fitting_s``, the fastest known plan that fits the budget (so the
    configuration is not one the offload pass holds back: those are faster than every fitting
    plan). ``shrink`` 0 (refine everything) prunes nothing."""
    if known.time_s.size == 0 or shrink <= 0.0:
        return np.zeros(time_s.shape, dtype=bool)
    return (dominated_by(known.time_s, known.memory_bytes, time_s * shrink * STRICT,
                         memory_bytes * shrink * STRICT)
            & (time_s >= fastest_fitting_s))


def settle(bound: EvenPoints, evaluate: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]],
           *, shrink: float, budget_bytes: float, overwrite: bool = False) -> tuple[EvenPoints, int]:
    """Exact points for every configuration whose bound is not :func:`prunable`.

    ``evaluate(rows)`` returns the exact (step, peak, host) of those rows. The first round scores
    the configurations on the frontier of the bounds (the likeliest frontier points); then the
    surviving bounds, fastest first, SETTLE_ROWS at a time, pruning again against the grown
    frontier after each round. Returns the points and how many configurations were scored.
    ``overwrite`` writes the exact points into ``bound``'s time and memory arrays (a caller's
    scratch: millions of rows are not copied) instead of into copies.
    """
    arrays = (bound.step_time_s, bound.peak_memory_bytes, bound.host_memory_bytes)
    t, m, h = arrays if overwrite else (a.copy() for a in arrays)
    exact = bound.exact.copy()
    scored = 0

    def score(rows: np.ndarray) -> None:
        nonlocal scored
        t[rows], m[rows], h[rows] = evaluate(rows)
        exact[rows] = True
        scored += rows.size

    # The open rows with their bounds, gathered once and compressed together as rows close.
    open_rows = np.flatnonzero(~exact)
    open_t, open_m = t[open_rows], m[open_rows]
    if open_rows.size:
        seeds = pareto_indices(open_t, open_m)  # positions in open_rows
        score(np.sort(open_rows[seeds]))
        still = np.ones(open_rows.size, dtype=bool)
        still[seeds] = False
        open_rows, open_t, open_m = open_rows[still], open_t[still], open_m[still]
    done = np.flatnonzero(exact)
    known = Front.of(t[done], m[done], done)
    while True:
        # The known frontier only grows better, so a bound pruned once stays pruned: each round
        # tests only the survivors of the last.
        fits = known.memory_bytes <= budget_bytes
        fastest_fitting = float(known.time_s[fits].min()) if fits.any() else np.inf
        still = ~prunable(known, open_t, open_m, shrink=shrink, fastest_fitting_s=fastest_fitting)
        open_rows, open_t, open_m = open_rows[still], open_t[still], open_m[still]
        if open_rows.size == 0:
            break
        if open_rows.size > SETTLE_ROWS:
            pick = np.zeros(open_rows.size, dtype=bool)
            pick[np.argpartition(open_t, SETTLE_ROWS - 1)[:SETTLE_ROWS]] = True
        else:
            pick = np.ones(open_rows.size, dtype=bool)
        batch = open_rows[pick]  # ascending, as open_rows
        score(batch)
        known = Front.of(np.concatenate([known.time_s, t[batch]]), np.concatenate([known.memory_bytes, m[batch]]),
                         np.concatenate([known.key, batch]))
        open_rows, open_t, open_m = open_rows[~pick], open_t[~pick], open_m[~pick]
    return EvenPoints(t, m, h, exact), scored
