"""The staircase walk of :mod:`meshplan.search.stages`: point by point, every config of a table
at once (:func:`_walk`), one virtual-stage count at a time on large mixed tables
(:func:`_walk_by_chunks`); a point a known plan beats is not recorded, its config jumps past
the points that plan beats (:func:`_jump`), so that a walk reaches its staircase's leaner end
at the cost of the points worth scoring (session 13)."""

from __future__ import annotations

import numpy as np

from meshplan.search.stage_grid import (CAP_SLACK, _assignment, _memory_given_time, _min_bottleneck,
                                        _time_given_memory, _times_given_memory, _top)
from meshplan.search.stage_table import StagePoints, StageTable, _empty_points

TRUNCATE_MIN_LAYER_COUNTS = 40
"""``stage_frontier``'s default: grids are cut short (:func:`_top`) only when a rank can hold at
least this many layer counts; on smaller grids the bounds' own passes cost about what they save
(Llama-2-7B's 32 layers: 0.074 s cut against 0.063 s whole; Llama-3-70B's 80: 0.34 s against
0.73 s)."""


def _point(tbl: StageTable, t_lim: np.ndarray, m_lim: np.ndarray, t_last: np.ndarray,
           truncate: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The split (n, r) of the staircase point (t_lim, m_lim) and the next point's time (the
    least time that lets memory go strictly below m_lim; inf at the last point).

    With ``truncate`` the time grids stop where no rank can use more layers within ``m_lim``
    or within ``t_last`` (the staircase's slowest point, :func:`_top`); configurations whose
    answers that bound could have cut are redone on the whole grid."""
    top, pure = _top(tbl, mem_limit=m_lim, time_limit=t_last) if truncate else (None, None)
    loose, strict = _times_given_memory(tbl, m_lim, (False, True), top)
    n, r = _assignment(tbl, t_lim, m_lim, loose)
    t_next = _min_bottleneck(strict, tbl)
    if truncate:
        bound = t_last * (1 + CAP_SLACK)
        redo = np.flatnonzero(~pure & ((t_next > bound) | (t_lim > bound)))
        if redo.size:
            n[redo], r[redo], t_next[redo] = _point(tbl.take(redo), t_lim[redo], m_lim[redo], t_last[redo], False)
    return n, r, t_next


def _walk_by_chunks(tbl: StageTable, max_points: int | None, keep_going, memory_cap_bytes: float,
                    truncate: bool | None) -> StagePoints:
    """:func:`_walk` of a table of several virtual-stage counts v, one v at a time: each v's
    grid starts at its own v and needs no masks (:func:`_mask_grid`), and a larger v's grid is
    narrower. A config's walk reads its own row only (every grid pass, the partition and the
    assignment are per row; ``keep_going`` is asked per row), so its points are the ones the
    whole table's walk gives it; they are returned in that walk's order (step, then row), so
    that ties between configs resolve as they did."""
    v = tbl.chunk_array()
    return _walk_parts(tbl, [(np.flatnonzero(v == vv), _walk) for vv in np.unique(v)], max_points, keep_going,
                       memory_cap_bytes, truncate)


def _walk_parts(tbl: StageTable, parts: list, max_points: int | None, keep_going, memory_cap_bytes: float,
                truncate: bool | None) -> StagePoints:
    """The walk of ``tbl`` as walks of its parts (rows, walker): each config's points are its own
    walk's, returned in the whole walk's order (step, then row)."""
    walked = []
    for rows, walker in parts:
        if rows.size == 0:
            continue
        go = None if keep_going is None else _Rows(keep_going, rows)
        cap = memory_cap_bytes if np.ndim(memory_cap_bytes) == 0 else memory_cap_bytes[rows]
        pts = walker(tbl.take(rows), max_points, go, cap, truncate)
        walked.append((rows[pts.config], pts))
    return _merge(walked, tbl.num_ranks)


class _Rows:
    """``keep_going`` (and its ``memory_bound``, when it has one) of a part's rows, asked in the
    whole table's."""

    def __init__(self, stop, rows: np.ndarray):
        self._stop, self._rows = stop, rows
        if hasattr(stop, "memory_bound"):
            self.memory_bound = lambda r, t: stop.memory_bound(rows[r], t)

    def __call__(self, r, t, m):
        return self._stop(self._rows[r], t, m)


def _merge(parts: list[tuple[np.ndarray, StagePoints]], num_ranks: int) -> StagePoints:
    """Points of disjoint configurations (each part: the configs of its points, and the points,
    each config's fastest first) in a walk's order: step, then config."""
    parts = [(c, p) for c, p in parts if c.size]
    if not parts:
        return _empty_points(num_ranks)
    cfg = np.concatenate([c for c, _ in parts])
    # A config's points come out fastest first, one per step: its k-th point is step k's.
    order = np.argsort(cfg, kind="stable")
    first = np.searchsorted(cfg[order], cfg[order])  # index of the config's first point in order
    step = np.empty(cfg.size, dtype=np.int64)
    step[order] = np.arange(cfg.size) - first
    out = np.lexsort((cfg, step))
    return StagePoints(cfg[out], *(np.concatenate([getattr(p, f) for _, p in parts])[out]
                                   for f in ("max_time_s", "peak_bytes", "layers", "recomputed")))


SPLIT_MIN_CELLS = 1 << 18
"""A table of several virtual-stage counts is walked one count at a time
(:func:`_walk_by_chunks`) when its grid holds at least this many cells (configs x ranks x layer
counts); below, the per-walk fixed cost of the extra walks outweighs the masks they save
(Qwen3-30B-A3B's p = 2 tables, 10k configs x 2 x 47 counts, v 1-8: 0.46 -> 0.36 s; Llama-2-7B on
8 GPUs, small tables: 0.10 -> 0.12 s split, session 9)."""



def _walk(tbl: StageTable, max_points: int | None, keep_going, memory_cap_bytes: float,
          truncate: bool | None) -> StagePoints:
    """:func:`stage_frontier` (the caller holds the floating-point warnings off)."""
    C = tbl.num_configs
    out: list[tuple[np.ndarray, ...]] = []
    if C == 0:
        return _empty_points(tbl.num_ranks)
    inf = np.full(C, np.inf)
    if truncate is None:
        v_min = tbl.min_chunks()
        truncate = tbl.num_layers - tbl.num_ranks * v_min + 1 >= TRUNCATE_MIN_LAYER_COUNTS
    mem_cap = np.broadcast_to(np.asarray(memory_cap_bytes, dtype=float), (C,)).copy()  # (one, or one per config)
    top = _top(tbl, mem_limit=mem_cap)[0] if truncate else None
    t_cur = _min_bottleneck(_time_given_memory(tbl, mem_cap, strict=False, top=top), tbl)
    active = np.isfinite(t_cur)
    m_floor = _min_bottleneck(_memory_given_time(tbl, inf, strict=False), tbl)
    # The slowest point of the staircase (its leanest): no point of the walk is slower.
    t_last = (_min_bottleneck(_time_given_memory(tbl, m_floor, strict=False, top=_top(tbl, mem_limit=m_floor)[0]),
                              tbl) if truncate else inf)
    rows = np.arange(C)
    bound = getattr(keep_going, "memory_bound", None)
    counted = np.zeros(C, dtype=np.int64)
    last_idx, last_sub = rows, tbl  # the last step's rows and their table (kept while no config leaves)
    while active.any():
        idx = rows[active]
        if idx.size != last_idx.size or not np.array_equal(idx, last_idx):
            last_idx, last_sub = idx, (tbl if idx.size == C else tbl.take(idx))
        sub = last_sub
        t_a = t_cur[idx]
        top = _top(sub, time_limit=t_a)[0] if truncate else None
        m_a = _min_bottleneck(_memory_given_time(sub, t_a, strict=False, top=top), sub)
        beaten = None
        if bound is not None:
            # A point a known plan beats is not recorded: its config jumps past it (_jump).
            lim = bound(idx, t_a)
            beaten = m_a >= lim
            if not beaten.any():
                beaten = None
            elif beaten.all():
                _jump(sub, idx, lim, active, t_cur, m_floor, keep_going, truncate)
                continue
        if beaten is None:
            # The split of this point, and the next point: the least time that lets memory go
            # strictly below this point's.
            n, r, t_next = _point(sub, t_a, m_a, t_last[idx], truncate)
        else:
            # the beaten configs' jumps and the others' points in one grid pass (_point_or_jump)
            keep = np.flatnonzero(~beaten)
            t_jump, n, r, t_next, sub = _point_or_jump(sub, t_a, m_a, t_last[idx], beaten, lim, keep, truncate)
            _moved(idx[beaten], t_jump, active, t_cur, m_floor, keep_going)
            idx = idx[keep]
        _step(out, sub, n, r, t_next, idx, active, t_cur, m_floor, keep_going)
        # (every recorded point is one no known plan beats: the cap counts those alone)
        counted[idx] += 1
        if max_points is not None:
            active[idx] &= counted[idx] < max_points
    return _points(out, tbl.num_ranks)


def _jump(sub: StageTable, idx: np.ndarray, lim: np.ndarray, active: np.ndarray, t_cur: np.ndarray,
          m_floor: np.ndarray, keep_going, truncate: bool) -> None:
    """Move the configs ``idx`` (``sub`` their table), whose points at ``t_cur`` a known plan
    beats, past the points it beats, in place: a point at that time or later needs memory below
    ``lim`` (what the known plans fast enough for that time allow: ``keep_going.memory_bound``,
    which falls as the time grows), so the next point worth recording is no faster than the
    least time of memory strictly below ``lim``; the walk asks again there. (Session 12's
    speed12b, 1a124dd, jumped after recording the beaten point; here none is recorded, so the
    cap counts only points no known plan beats.)"""
    top = _top(sub, mem_limit=lim)[0] if truncate else None
    t_j = _min_bottleneck(_time_given_memory(sub, lim, strict=True, top=top), sub)
    _moved(idx, t_j, active, t_cur, m_floor, keep_going)


def _moved(idx: np.ndarray, t_j: np.ndarray, active: np.ndarray, t_cur: np.ndarray, m_floor: np.ndarray,
           keep_going) -> None:
    """The configs ``idx`` jump to ``t_j`` (no earlier than where they stand), in place, and keep
    walking if ``keep_going`` keeps them (:func:`_jump`)."""
    t_cur[idx] = np.maximum(t_cur[idx], t_j)
    go = np.isfinite(t_cur[idx])
    if keep_going is not None and go.any():
        go[go] = keep_going(idx[go], t_cur[idx[go]], m_floor[idx[go]])
    active[idx] = go


def _point_or_jump(sub: StageTable, t_lim: np.ndarray, m_lim: np.ndarray, t_last: np.ndarray, beaten: np.ndarray,
                   lim: np.ndarray, keep: np.ndarray, truncate: bool):
    """:func:`_jump`'s time for the ``beaten`` rows of ``sub`` and :func:`_point` for the others
    (``keep``) from one pass over one grid: both are the least time of memory strictly below a
    limit (``lim`` for a beaten row, its point's ``m_lim`` for the others). The grid is cut at the
    larger of the two cuts (:func:`_top`; a beaten row's cut is a feasibility limit, so its answer
    is exact on any grid at least that long, and a kept row's is redone on the whole grid
    where the cut could have decided it, as in :func:`_point`). Returns the jumps' times, then
    the kept rows' (n, r), next time and table."""
    mem = np.where(beaten, lim, m_lim)
    top, pure = _top(sub, mem_limit=mem, time_limit=np.where(beaten, np.inf, t_last)) if truncate else (None, None)
    loose, strict = _times_given_memory(sub, mem, (False, True), top)
    t_all = _min_bottleneck(strict, sub)
    kept = sub.take(keep)
    t_lim, m_lim, t_last = t_lim[keep], m_lim[keep], t_last[keep]
    n, r = _assignment(kept, t_lim, m_lim, loose[keep])
    t_next = t_all[keep]
    if truncate:
        bound = t_last * (1 + CAP_SLACK)
        redo = np.flatnonzero(~pure[keep] & ((t_next > bound) | (t_lim > bound)))
        if redo.size:
            n[redo], r[redo], t_next[redo] = _point(kept.take(redo), t_lim[redo], m_lim[redo], t_last[redo], False)
    return t_all[beaten], n, r, t_next, kept


def _step(out: list, sub: StageTable, n: np.ndarray, r: np.ndarray, t_next: np.ndarray, idx: np.ndarray,
          active: np.ndarray, t_cur: np.ndarray, m_floor: np.ndarray, keep_going) -> None:
    """One step of a walk (:func:`_walk`, ``stage_one_rank._walk_one_rank``): record the split
    (n, r) of the rows ``idx`` (``sub`` their table), move them to their next point's time
    ``t_next`` (in place) and keep walking those with a next point that ``keep_going`` keeps."""
    t_s, m_s = sub.rank_costs(n, r)
    out.append((idx, t_s.max(axis=1), m_s.max(axis=1), n, r))
    t_cur[idx] = t_next
    active[idx] = np.isfinite(t_next)
    live = idx[active[idx]]
    if keep_going is not None and live.size:
        active[live] = keep_going(live, t_cur[live], m_floor[live])


def _points(out: list, num_ranks: int) -> StagePoints:
    """The points :func:`_step` recorded, step by step."""
    if not out:
        return _empty_points(num_ranks)
    cfg, t, m, n, r = (np.concatenate(x) for x in zip(*out))
    return StagePoints(cfg, t, m, n, r)
