"""The stage walk of a one-rank table (pp = 1): every point on the grid's last column."""

from __future__ import annotations

import numpy as np

from meshplan.search.stage_grid import (_Grid, _assignment, _fewest_recomputed, _memory_given_time,
                                        _times_given_memory)
from meshplan.search.stage_table import StagePoints, StageTable, _empty_points
from meshplan.search.stage_walk import _points, _step, _walk, _walk_parts


ONE_RANK_MIN_STEP = 1e-6
""":func:`_walk_one_rank` takes a config whose layer adds at least this fraction of its rank's
scale to both time and memory (a: the time; c + k min(d, g): the least memory); others are
walked on the whole grid (:func:`_walk`)."""


def _walk_one_rank_table(tbl: StageTable, max_points: int | None, keep_going, memory_cap_bytes: float,
                         truncate: bool | None) -> StagePoints:
    """A one-rank table's walk: :func:`_walk_one_rank` on its configs whose levels rise with n by
    far more than rounding (ONE_RANK_MIN_STEP), the whole grid's walk on the rest (tables whose
    layers cost next to nothing, where rounding can make a level fall as n grows)."""
    L = tbl.num_layers
    k = tbl.inflight[:, 0]
    lean = tbl.layer_static_bytes + k * np.minimum(tbl.layer_act_bytes, tbl.layer_act_recomputed_bytes)
    scale_m = (np.abs(tbl.rank_bytes[:, 0]) + L * (tbl.layer_static_bytes + k * tbl.layer_act_bytes)
               + np.abs(tbl.jump()) + (float(memory_cap_bytes) if np.isfinite(memory_cap_bytes) else 0.0))
    scale_t = np.abs(tbl.rank_time_s[:, 0]) + L * (tbl.layer_time_s + np.abs(tbl.recompute_time_s))
    ok = (lean > ONE_RANK_MIN_STEP * scale_m) & (tbl.layer_time_s > ONE_RANK_MIN_STEP * scale_t)
    if ok.all():
        return _walk_one_rank(tbl, max_points, keep_going, memory_cap_bytes)
    one = lambda t, mp, go, cap, _trunc: _walk_one_rank(t, mp, go, cap)  # noqa: E731
    return _walk_parts(tbl, [(np.flatnonzero(ok), one), (np.flatnonzero(~ok), _walk)], max_points, keep_going,
                       memory_cap_bytes, truncate)


def _walk_one_rank(tbl: StageTable, max_points: int | None, keep_going, memory_cap_bytes: float) -> StagePoints:
    """:func:`_walk` of a table of one rank (pp = 1): its points are those of the whole grid's
    walk, computed on the grid's last column alone (n = L, the only count a lone rank holds).

    The whole grid's answers are read there already: with p = 1, :func:`_min_bottleneck` takes
    the (L - v_min + 1)-th smallest of a row of L - v_min + 1 levels, its largest, and a rank's
    levels increase with n, so that is the level at n = L, computed by the same operations here;
    :func:`_assignment` gives the rank n = L wherever that level is within the point's time (every
    point of the walk: the point's memory is the least within its time), else the rows are redone
    on the whole grid. "Levels increase with n" holds in floating point when a layer adds far more
    than rounding to both (the caller's ONE_RANK_MIN_STEP): then the least recomputed count that
    fits rises by at least one per layer, a, c and k g stay positive, and every tolerance of the
    grids (_REL, 1e-9 layers) is far below one layer's step. One (C, 1, 1) pass in place of (C, 1, L) per step (the grid cut,
    :func:`_top`, does not apply: a rank holds every layer). Session 10: Qwen3-30B-A3B on 256 GB200,
    24.7k pp = 1 configurations, 930k points: 2.2 s -> 0.11 s of walk."""
    C = tbl.num_configs
    if C == 0:
        return _empty_points(1)
    out: list[tuple[np.ndarray, ...]] = []
    col = lambda t: _Grid(t, last_only=True)  # noqa: E731
    grid = col(tbl)
    t_cur = _times_given_memory(tbl, np.full(C, float(memory_cap_bytes)), (False,), grid=grid)[0][:, 0, 0]
    active = np.isfinite(t_cur)
    m_floor = _memory_given_time(tbl, np.full(C, np.inf), False, grid=grid)[:, 0, 0]
    rows = np.arange(C)
    L = tbl.num_layers
    steps = 0
    while active.any() and (max_points is None or steps < max_points):
        steps += 1
        every = bool(active.all())
        sub = tbl if every else tbl.take(rows[active])
        g = grid if every else col(sub)
        t_a = t_cur if every else t_cur[active]
        m_a = _memory_given_time(sub, t_a, False, grid=g)[:, 0, 0]
        loose, strict = _times_given_memory(sub, m_a, (False, True), grid=g)
        tol = np.maximum(np.abs(t_a), 1e-30) * 1e-9  # (_assignment's)
        n = np.full((sub.num_configs, 1), L, dtype=np.int64)
        r = _fewest_recomputed(sub, n, m_a)
        off = np.flatnonzero(~(loose[:, 0, 0] <= t_a + tol))
        if off.size:  # not met at n = L: the whole grid's assignment (never seen; kept exact)
            n[off], r[off] = _assignment(sub.take(off), t_a[off], m_a[off])
        _step(out, sub, n, r, strict[:, 0, 0], rows[active], active, t_cur, m_floor, keep_going)
    return _points(out, 1)
