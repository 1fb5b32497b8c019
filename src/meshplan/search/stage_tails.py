"""The stage walk of tables whose step has a per-step tail (pp > 1): ``estimate`` charges
alpha max_s mb_s + max_s x_s (the slowest rank's micro-batches, then the largest data-parallel
and optimizer tail x_s), and the table folds the tail into each rank's time, t_s = mb_s + y_s
with y_s = x_s / alpha, whose max bounds max_s (t_s - y_s) + max_s y_s from below and equals it
when one rank is the largest in both.

:func:`_walk_tailed` walks the folded table (:mod:`meshplan.search.stage_walk`) and checks
each walked split P against its folded time. A split S of memory from P's up to the previous
walked point's (P's band) has at least P's folded time (the staircase), so where P's objective
is its folded time P dominates S. Where it is not, S may be faster than P (never faster than
P's folded time): the band is walked again exactly (:func:`_walk_capped`). The objective's tail
part Y = max_s y_s takes one of the values y_s(n) = n y_a + y_e,s of the grid; for each level
the ranks are capped at the most layers whose tail stays within it (``StageTable.max_layers``),
and the walk of the untailed times under that cap and the band's memory reaches, for every split
S the level admits first (tail exactly the level), a split at no more memory and no more
untailed time of tail at most S's, i.e. of objective at most S's. The union with the walked
splits, Pareto-filtered, is the configuration's frontier (tests/planner/test_search_stage_tails.py
against brute force over every split; tests/planner/test_search_bruteforce.py the search's).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from meshplan.search.frontier import pareto_indices
from meshplan.search.stage_grid import _memory_given_time, _min_bottleneck, _time_given_memory, _top
from meshplan.search.stage_walk import _merge, _point
from meshplan.search.stage_table import StagePoints, StageTable, _empty_points

TAIL_MIN_ROWS = 512
TAIL_ROWS_PER_CONFIG = 0.5
"""The work limit of :func:`_walk_tailed`: the capped walks of one table are at most
max(TAIL_MIN_ROWS, TAIL_ROWS_PER_CONFIG x its configurations) (one per band and tail level that
the bounds keep), the fastest bands first; a band beyond keeps its walked point, at most its
ranks' tail spread slower than a split it misses, at no less memory (the folded time is within
that spread of the objective). Small spaces are exact (tests/planner/test_search_bruteforce.py)."""

TAIL_REL = 1e-9
"""A walked split counts as meeting its folded time when its objective is within this fraction
of it (the two are computed along different paths; the exact re-scoring compares at 1e-9 too)."""


def _walk_tailed(tbl: StageTable, max_points: int | None, keep_going, memory_cap_bytes: float,
                 truncate: bool | None, walk) -> StagePoints:
    """``walk`` (a walk of untailed tables) of ``tbl`` with its objective (module docstring)."""
    pts = walk(tbl, max_points, keep_going, memory_cap_bytes, truncate)
    if not tbl.has_tails() or pts.config.size == 0:
        return pts
    exact = tbl.take(pts.config).step_time_s(pts.layers, pts.recomputed)
    off = exact > pts.max_time_s + np.maximum(np.abs(pts.max_time_s), 1e-30) * TAIL_REL
    off &= tbl.layer_tail_s[pts.config] >= 0  # (a falling tail is no cap: never seen, kept folded)
    if keep_going is not None and off.any():
        # a split S in P's band (below) has at least P's folded time and memory: where a known
        # plan beats those, it beats S
        off[off] = keep_going(pts.config[off], pts.max_time_s[off], pts.peak_bytes[off])
    if not off.any():
        return pts
    # P's band: the splits of memory from P's up to the previous point's (the walk's cap for the
    # first), all of folded time at least P's (the staircase); one P misses is faster than P.
    by_cfg = np.argsort(pts.config, kind="stable")  # each config's points in walk order
    prev = np.full(pts.config.size, float(memory_cap_bytes))
    same = pts.config[by_cfg[1:]] == pts.config[by_cfg[:-1]]
    prev[by_cfg[1:][same]] = pts.peak_bytes[by_cfg[:-1][same]]
    band = np.flatnonzero(off)
    m_bound = getattr(keep_going, "memory_bound", None)
    if m_bound is not None:
        # A split of folded time at least P's and memory at least what the known plans fast
        # enough for P's time allow (the walk's jump, stage_walk._jump) is beaten by one of
        # them; one of less folded time than P in the band lies in a stretch the walk jumped
        # over, so is beaten too: the band ends there.
        prev[band] = np.minimum(prev[band], m_bound(pts.config[band], pts.max_time_s[band]))
    budget = max(TAIL_MIN_ROWS, int(TAIL_ROWS_PER_CONFIG * tbl.num_configs))
    taken, rows, caps, levels = _levels_to_walk(tbl, pts, band, exact, prev, keep_going, budget)
    if taken.size == 0:
        return pts
    again = _walk_capped(tbl.take(pts.config[band]), rows, caps, levels, max_points, prev[band], exact[band])
    again = StagePoints(pts.config[band][again.config], again.max_time_s, again.peak_bytes, again.layers,
                        again.recomputed)
    redo = np.unique(pts.config[band[taken]])
    mine = np.isin(pts.config, redo)
    # the redone configs: their walked splits (scored by the objective) and the capped walks'
    union = StagePoints(np.concatenate([pts.config[mine], again.config]),
                        np.concatenate([exact[mine], again.max_time_s]),
                        np.concatenate([pts.peak_bytes[mine], again.peak_bytes]),
                        np.concatenate([pts.layers[mine], again.layers]),
                        np.concatenate([pts.recomputed[mine], again.recomputed]))
    best = _fastest_front(union, max_points)
    return _merge([(pts.config[~mine], _take(pts, ~mine)), (union.config[best], _take(union, best))], tbl.num_ranks)


TAIL_FIRST_BANDS = 1024
""":func:`_levels_to_walk` reads the bands fastest first in blocks, the first of
max(this, the budget) bands, each next one twice as large, until the budget of walks is spent:
the bands beyond are never walked, so their cap vectors are not made (Qwen3-30B-A3B on 256
GB200, --target megatron: 72.7k bands reached :func:`_caps`, ~1 s, most past the budget)."""


def _levels_to_walk(tbl: StageTable, pts: StagePoints, band: np.ndarray, exact: np.ndarray, prev: np.ndarray,
                    keep_going, budget: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The bands ``band`` (indices of ``pts``) walked again and their capped walks, within the
    budget of walks, the fastest bands first: (taken: positions in ``band`` of the bands read
    before the budget ran out; rows, caps, levels: each walk's band position, per-rank cap
    vector and tail level, by band then level)."""
    order = np.argsort(pts.max_time_s[band], kind="stable")
    taken, rows, caps, levels = [], [], [], []
    used, start, size = 0, 0, max(TAIL_FIRST_BANDS, budget)
    while start < order.size:
        part = order[start:start + size]
        start, size = start + size, 2 * size
        sub = tbl.take(pts.config[band[part]])
        lb = _least_untailed(sub, prev[band[part]])
        # (every split's tail is at least the largest of the ranks' tails at v layers: bands whose
        # bound below is under that have no level to walk, and no cap vectors are made for them)
        v = sub.chunk_array()[:, None]
        y_lo = sub.tails(np.broadcast_to(v, sub.rank_tail_s.shape)).max(axis=1)
        near = np.flatnonzero(exact[band[part]] - lb >= y_lo - np.abs(y_lo) * TAIL_REL)
        if near.size == 0:
            continue
        part, sub, lb = part[near], sub.take(near), lb[near]
        col, cap, level, ok = _caps(sub)
        # a split of the band faster than P has a tail below P's objective less the band's least
        # untailed time; one new at a level has that tail (see _walk_capped) and at least P's
        # memory: the levels a known plan beats so are not walked
        bound = exact[band[part]] - lb
        r, lv = np.nonzero(ok & (level <= (bound + np.abs(bound) * TAIL_REL)[:, None]))
        if keep_going is not None and r.size:
            live = keep_going(pts.config[band[part[r]]], lb[r] + level[r, lv], pts.peak_bytes[band[part[r]]])
            r, lv = r[live], lv[live]
        # the work limit: the fastest bands first, up to the budget of walks
        within = used + np.cumsum(np.bincount(r, minlength=part.size)) <= budget
        pick = within[r]
        taken.append(part[within])
        rows.append(part[r[pick]])
        caps.append(cap[r[pick], lv[pick]][:, col])
        levels.append(level[r[pick], lv[pick]])
        if not within.all():
            break
        used += r.size
    if not taken:
        return (np.empty(0, dtype=np.int64),) * 2 + (np.empty((0, tbl.num_ranks), dtype=np.int64), np.empty(0))
    rows, levels = np.concatenate(rows), np.concatenate(levels)
    caps = np.concatenate(caps)
    by = np.lexsort((levels, rows))  # (by band, then level: the order of one pass over every band)
    return np.concatenate(taken), rows[by], caps[by], levels[by]


def _fastest_front(pts: StagePoints, max_points: int | None) -> np.ndarray:
    """Per config the indices of its Pareto points (time, memory), fastest first, at most
    ``max_points``; in config order."""
    keep = []
    for c in np.unique(pts.config):
        mine = np.flatnonzero(pts.config == c)
        front = mine[pareto_indices(pts.max_time_s[mine], pts.peak_bytes[mine])]
        keep.append(front[np.lexsort((pts.peak_bytes[front], pts.max_time_s[front]))][:max_points])
    return np.concatenate(keep) if keep else np.empty(0, dtype=np.int64)


def _least_untailed(tbl: StageTable, memory_cap_bytes: np.ndarray) -> np.ndarray:
    """(C,) the least untailed time (max_s mb_s) of a split within each row's memory cap."""
    plain = _untailed(tbl)
    return _min_bottleneck(_time_given_memory(plain, memory_cap_bytes, strict=False), plain)


def _untailed(tbl: StageTable) -> StageTable:
    """The table's times less their tails (the micro-batch times mb_s)."""
    return replace(tbl, layer_time_s=tbl.layer_time_s - tbl.layer_tail_s, rank_time_s=tbl.rank_time_s - tbl.rank_tail_s,
                   layer_tail_s=None, rank_tail_s=None)


def _caps(tbl: StageTable) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per config the tail levels (C, J) ascending (each one rank's y at some n, inf where none),
    the cap vector of each (C, J, p': the most layers whose tail stays within it, per distinct
    tail column; rank s reads column ``col[s]``), and which levels are worth a walk (feasible:
    every rank v, L in all; the first of each distinct cap vector): (col, caps, levels, ok)."""
    C, p, L = tbl.num_configs, tbl.num_ranks, tbl.num_layers
    v = tbl.chunk_array()
    n_high = L - (p - 1) * v
    ns = np.arange(tbl.min_chunks(), L - (p - 1) * tbl.min_chunks() + 1)
    # ranks of one tail in every config (the planner's plain ranks) share their levels and caps
    ye_all, ya = tbl.rank_tail_s, tbl.layer_tail_s
    ye, rank_col = np.unique(ye_all, axis=1, return_inverse=True) if C else (ye_all, np.arange(p))
    y = ns[None, None, :] * ya[:, None, None] + ye[:, :, None]  # (C, p', G)
    usable = (ns[None, :] >= v[:, None]) & (ns[None, :] <= n_high[:, None])  # (C, G)
    levels = np.sort(np.where(usable[:, None, :], y, np.inf).reshape(C, -1), axis=1)  # (C, J)
    step = np.where(ya > 0, ya, 1.0)[:, None, None]
    caps = np.floor((levels[:, :, None] - ye[:, None, :]) / step + 1e-9)
    caps = np.where((ya > 0)[:, None, None], caps, np.where(ye[:, None, :] <= levels[:, :, None], np.inf, -np.inf))
    caps = np.clip(caps, (v - 1)[:, None, None], n_high[:, None, None]).astype(np.int64)  # (C, J, p')
    ranks = np.bincount(np.asarray(rank_col).reshape(-1), minlength=ye.shape[1])  # ranks per distinct tail
    ok = np.isfinite(levels) & (caps >= v[:, None, None]).all(axis=2) & ((caps * ranks).sum(axis=2) >= L)
    ok[:, 1:] &= (caps[:, 1:] != caps[:, :-1]).any(axis=2)
    return np.asarray(rank_col).reshape(-1), caps, levels, ok


def _walk_capped(tbl: StageTable, row: np.ndarray, caps: np.ndarray, level: np.ndarray, max_points: int | None,
                 memory_cap_bytes: np.ndarray, f_hi: np.ndarray) -> StagePoints:
    """The untailed walks of ``tbl``'s rows ``row`` capped at their tail levels ``level`` (their
    cap vectors ``caps``, :func:`_caps`), each row's up to its objective ``f_hi`` and from its
    memory cap; the points with ``max_time_s`` the objective, ``config`` the row of ``tbl``.

    The splits a level's walk is there for are those its cap admits first: their tail is the
    level itself (a tail is a level, and the level below has another cap), so their objective is
    at least the walk's time plus the level; a walk whose first time already reaches ``f_hi``
    so is not walked, and a walk stops there (:func:`_walk_window`)."""
    top = f_hi * (1 + TAIL_REL)
    capped = replace(_untailed(tbl).take(row), max_layers=caps)
    cap = memory_cap_bytes[row]
    first = _min_bottleneck(_time_given_memory(capped, cap, strict=False, top=_top(capped, mem_limit=cap)[0]), capped)
    live = np.flatnonzero(first + level < top[row])
    if live.size == 0:
        return _empty_points(tbl.num_ranks)
    row, level = row[live], level[live]

    pts = _walk_window(capped.take(live), first[live], top[row] - level, max_points)
    owner = row[pts.config]
    objective = tbl.take(owner).step_time_s(pts.layers, pts.recomputed)
    return StagePoints(owner, objective, pts.peak_bytes, pts.layers, pts.recomputed)


def _walk_window(tbl: StageTable, t_first: np.ndarray, t_stop: np.ndarray, max_points: int | None) -> StagePoints:
    """``stage_walk._walk`` of ``tbl`` from its first time ``t_first`` (the least within the
    rows' memory caps) while the time stays below ``t_stop``: the same staircase points (each
    the least memory within its time, the next the least time strictly below that memory, the
    grids cut as there), without the bounds a long walk pays for once (its least memory and
    slowest point: these walks are a point or two long)."""
    out = []
    rows = np.arange(tbl.num_configs)
    t_cur = t_first.copy()
    active = t_cur < t_stop
    steps = 0
    last_idx, last_sub = rows, tbl  # the last step's rows and their table (kept while no row leaves)
    while active.any() and (max_points is None or steps < max_points):
        steps += 1
        idx = rows[active]
        if idx.size != last_idx.size or not np.array_equal(idx, last_idx):
            last_idx, last_sub = idx, tbl.take(idx)
        sub = last_sub
        t_a = t_cur[idx]
        # the grids cut where a rank's layers alone exceed the limit (stage_grid._top)
        m_a = _min_bottleneck(_memory_given_time(sub, t_a, strict=False, top=_top(sub, time_limit=t_a)[0]), sub)
        n, r, t_next = _point(sub, t_a, m_a, np.full(idx.size, np.inf), True)
        t_s, m_s = sub.rank_costs(n, r)
        out.append((idx, t_s.max(axis=1), m_s.max(axis=1), n, r))
        t_cur[idx] = t_next
        active[idx] = t_cur[idx] < t_stop[idx]
    if not out:
        return _empty_points(tbl.num_ranks)
    return StagePoints(*(np.concatenate(x) for x in zip(*out)))


def _take(pts: StagePoints, keep: np.ndarray) -> StagePoints:
    return StagePoints(pts.config[keep], pts.max_time_s[keep], pts.peak_bytes[keep], pts.layers[keep],
                       pts.recomputed[keep])
