"""Per-stage layer split and per-stage recompute count, searched as a (time, memory) frontier.

For one *global configuration* (mesh degrees, schedule, micro-batch, recompute policy fixed) each
pipeline rank ``s`` of ``p`` holds ``n_s`` transformer layers of which ``r_s`` are recomputed.
Its time per micro-batch and its peak memory are affine in (n, r) (the cost model's per-layer
decomposition, see :class:`StageTable`)::

    t_s(n, r) = n * a + r * b + e_s            a: fwd+bwd of a layer, b: recompute extra
    m_s(n, r) = n * c + k_s * ((n - r) * d + r * g) + f_s
                                               c: weights+grads+optimizer of a layer,
                                               d / g: activations kept per in-flight micro-batch
                                               without / with recompute, k_s in-flight micro-batches

``e_s`` and ``f_s`` carry the embedding (rank 0) and LM head (last rank) plus fixed overheads,
which is why those ranks end up with fewer layers (the time/memory balancing of Galvatron-BMW,
Wang et al. 2023, Sec. 4). Step time is governed by the slowest rank and peak memory by the most
loaded rank, so a global configuration's frontier is over ``(max_s t_s, max_s m_s)`` subject to
``sum_s n_s = L`` and ``n_s >= v`` (each of the rank's ``v`` virtual stages needs a layer).

Exact frontier without enumerating splits (frontier tracking, TensorOpt Sec. 4): the set of
feasible (n, r) for a rank under limits (T, M) is downward closed in n, and the fewest-recompute
time ``T_s(n | M)`` / least memory ``M_s(n | T)`` of n layers increase with n. Hence
``min T given M`` is the larger of the L-th smallest value among all ``T_s(n | M)`` and
``max_s T_s(v | M)``; symmetrically for ``min M given T``. Alternating the two walks the frontier
staircase point by point (each point a vectorised partition over all configs at once).

Modules: :mod:`~meshplan.search.stage_table` (the table and its points),
:mod:`~meshplan.search.stage_grid` (levels over the layer counts, the smallest bottleneck, a
split meeting a point, the grid cut), :mod:`~meshplan.search.stage_walk` (the staircase walk),
:mod:`~meshplan.search.stage_one_rank` (pp = 1: the walk on the one layer count a rank holds),
:mod:`~meshplan.search.stage_tails` (pp > 1: the step's per-step tail apart, the walk by the
step itself); this one: the entry point and the bounds.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from meshplan.search.stage_grid import _memory_given_time, _min_bottleneck, _quiet, _time_given_memory
from meshplan.search.stage_one_rank import _walk_one_rank_table
from meshplan.search.stage_table import StagePoints, StageTable
from meshplan.search.stage_tails import _walk_tailed
from meshplan.search.stage_walk import SPLIT_MIN_CELLS, _walk, _walk_by_chunks

__all__ = ["StagePoints", "StageTable", "corner_bounds", "relaxed_bounds", "stage_frontier"]


def stage_frontier(tbl: StageTable, max_points: int | None = 64,
                   keep_going: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None,
                   memory_cap_bytes: float = np.inf, truncate: bool | None = None) -> StagePoints:
    """Every Pareto point (max rank time, peak rank memory) of each config, fastest first.

    ``max_points`` bounds the points walked per config (the fastest are kept; None: no bound;
    exact when the staircase is shorter). Only points with peak memory <= ``memory_cap_bytes``
    are walked (the walk starts at the fastest such point). ``keep_going(rows, next_time,
    least_memory)`` may stop configs early: given the config rows still walking, the time of
    their next point and their least possible memory, it returns which are still worth walking
    (e.g. not dominated by known plans). When it also has ``memory_bound(rows, time)`` (the
    memory a point at that time or later must go below for no known plan to beat it,
    ``refine._Stop``), the walk records no point at or above it: the config jumps to the least
    time of memory below the bound (``stage_walk._jump``), and ``max_points`` counts only the
    points recorded, those no known plan beats.
    ``truncate`` False evaluates every layer count on every grid, True cuts the grids short
    (the same points: tests compare the two); None cuts them when they are large
    (TRUNCATE_MIN_LAYER_COUNTS). With per-step tails (``StageTable.layer_tail_s``) the time is
    the step's objective, max_s (t_s - y_s) + max_s y_s (:mod:`meshplan.search.stage_tails`).
    """
    with _quiet():
        if tbl.num_ranks == 1:  # (one rank: its tail is the step's, the folded time exact)
            return _walk_one_rank_table(tbl, max_points, keep_going, memory_cap_bytes, truncate)
        return _walk_tailed(tbl, max_points, keep_going, memory_cap_bytes, truncate, _walk_ranks)


def _walk_ranks(tbl: StageTable, max_points: int, keep_going, memory_cap_bytes: float,
                truncate: bool | None) -> StagePoints:
    """The walk of a table of several ranks by its folded time: whole, or one virtual-stage
    count at a time on large mixed tables (SPLIT_MIN_CELLS)."""
    cells = tbl.num_configs * tbl.num_ranks * (tbl.num_layers - tbl.num_ranks * tbl.min_chunks() + 1)
    if tbl.uniform_chunks() or cells < SPLIT_MIN_CELLS:
        return _walk(tbl, max_points, keep_going, memory_cap_bytes, truncate)
    return _walk_by_chunks(tbl, max_points, keep_going, memory_cap_bytes, truncate)


def relaxed_bounds(tbl: StageTable) -> tuple[np.ndarray, np.ndarray]:
    """Cheap lower bounds (O(C p)) on :func:`corner_bounds`: let layer counts be real numbers.

    Time: the slowest rank is at least the average, (L a + sum_s e_s) / p, and at least any
    rank holding its minimum v layers. Memory: every choice costs at least n (c + k_s g) + f_s
    on rank s (g <= d and the jump >= 0), and the least max over real splits of these lines
    solves sum_s (M - f_s) / slope_s = L (water filling).
    """
    a = tbl.layer_time_s
    p, L, v = tbl.num_ranks, tbl.num_layers, tbl.chunk_array()[:, None]
    e, f, k = tbl.rank_time_s, tbl.rank_bytes, tbl.inflight
    t_lb = np.maximum((L * a + e.sum(axis=1)) / p, (e + v * a[:, None]).max(axis=1))
    slope = tbl.layer_static_bytes[:, None] + k * np.minimum(tbl.layer_act_bytes, tbl.layer_act_recomputed_bytes)[:, None]
    slope = np.maximum(slope, 1e-30)
    water = (L + (f / slope).sum(axis=1)) / (1.0 / slope).sum(axis=1)
    m_lb = np.maximum(water, (f + v * slope).max(axis=1))
    return t_lb, m_lb


def corner_bounds(tbl: StageTable) -> tuple[np.ndarray, np.ndarray]:
    """Per config the least max-rank time (no memory limit) and least peak memory (no time
    limit): no split of that config does better in either objective."""
    inf = np.full(tbl.num_configs, np.inf)
    with _quiet():
        t_lb = _min_bottleneck(_time_given_memory(tbl, inf, strict=False), tbl)
        m_lb = _min_bottleneck(_memory_given_time(tbl, inf, strict=False), tbl)
    return t_lb, m_lb
