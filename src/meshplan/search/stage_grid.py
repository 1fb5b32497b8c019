"""The stage search's grids: a table's levels over every layer count per rank (the least time
within a memory limit, the least memory within a time limit), the smallest bottleneck at
which the ranks hold all layers, a split meeting a point, and the grid cut (:func:`_top`)."""

from __future__ import annotations

from functools import cached_property

import numpy as np

from meshplan.search.stage_table import _REL, StageTable


class _Grid:
    """The table over its layer-count grid (see :func:`_grid`): broadcast columns, and the grids
    no limit changes (computed once each, when first read)."""

    _LAZY = ("base", "na", "nae", "nc")

    def __init__(self, tbl: StageTable, top: int | None = None, last_only: bool = False) -> None:
        v_min = tbl.min_chunks()
        n_max = tbl.num_layers - (tbl.num_ranks - 1) * v_min if top is None else top
        col = lambda x: x[:, None, None]  # noqa: E731
        # (1, 1, G) layer counts; ``last_only``: the one count a single rank holds (all L layers,
        # :func:`_walk_one_rank`), the last column of the whole grid
        self.n = np.arange(n_max if last_only else v_min, n_max + 1, dtype=float)[None, None, :]
        # (C, 1, 1) per config; e, f, k (C, p, 1) per rank
        self.a, self.b, self.c = col(tbl.layer_time_s), col(tbl.recompute_time_s), col(tbl.layer_static_bytes)
        self.d, self.g = col(tbl.layer_act_bytes), col(tbl.layer_act_recomputed_bytes)
        self.e, self.f, self.k = tbl.rank_time_s[:, :, None], tbl.rank_bytes[:, :, None], tbl.inflight[:, :, None]
        self.allow, self.jump = col(tbl.allow_recompute), col(tbl.jump())
        self.below = self.above = None  # (C, 1, G): n < v, n > L - (p-1) v (mixed v only, :func:`_mask_grid`)
        if not tbl.uniform_chunks() and not last_only:  # (one rank: v <= L, no cell is masked)
            vc = tbl.chunk_array()[:, None, None]
            self.below, self.above = self.n < vc, self.n > tbl.num_layers - (tbl.num_ranks - 1) * vc
        if tbl.max_layers is not None:  # (C, p, G): more than a rank's cap (StageTable.max_layers)
            capped = self.n > tbl.max_layers[:, :, None]
            self.above = capped if self.above is None else capped | self.above

    @cached_property
    def base(self) -> np.ndarray:
        """(C, p, G) n (c + k d) + f: memory recomputing nothing."""
        return self.n * (self.c + self.k * self.d) + self.f

    @cached_property
    def na(self) -> np.ndarray:
        """(C, 1, G) n a."""
        return self.n * self.a

    @cached_property
    def nae(self) -> np.ndarray:
        """(C, p, G) n a + e: time recomputing nothing."""
        return self.na + self.e

    @cached_property
    def nc(self) -> np.ndarray:
        """(C, 1, G) n c."""
        return self.n * self.c

    def upto(self, columns: int) -> _Grid:
        """The first ``columns`` layer counts (views of what this grid has computed)."""
        out = object.__new__(_Grid)
        out.__dict__.update(self.__dict__)
        for name in ("n", "below", "above") + self._LAZY:
            x = self.__dict__.get(name)
            if x is not None:
                out.__dict__[name] = x[:, :, :columns]
        return out


_WHOLE_GRID = "_whole_grid"
"""The attribute under which a table keeps its grid over every layer count (built once, by _grid)."""


def _grid(tbl: StageTable, top: int | None = None) -> _Grid:
    """Broadcast helpers of shape (C, p, G) over the layer counts n = v_min .. L - (p-1) v_min,
    v_min the least v of the table (see :func:`_mask_grid` for configs with a larger v), or
    v_min .. ``top`` (:func:`_top`: the cells beyond count as +inf)."""
    whole = tbl.__dict__.get(_WHOLE_GRID)  # one per table, kept on the table (it is never copied)
    if top is None:
        if whole is None:
            whole = tbl.__dict__[_WHOLE_GRID] = _Grid(tbl)
        return whole
    if whole is not None:
        return whole.upto(top - tbl.min_chunks() + 1)
    return _Grid(tbl, top)  # a grid cut short: only its own columns


def _mask_grid(values: np.ndarray, grid: _Grid) -> np.ndarray:
    """Per-config usable range of a (C, p, G) grid of levels: fewer than v layers is free
    (-inf: a rank always holds v) and more than L - (p-1) v is impossible (+inf).
    Overwrites and returns ``values`` (callers pass a fresh array)."""
    # The masks are (C, 1, G) (caps: (C, p, G)): write through them in place (values is the
    # caller's scratch); none: the grid is exactly v .. L - (p-1) v.
    if grid.below is not None:
        np.copyto(values, -np.inf, where=grid.below)
    if grid.above is not None:
        np.copyto(values, np.inf, where=grid.above)
    return values


CAP_SLACK = 1e-6
"""Relative slack on a limit when :func:`_top` bounds the layer counts worth evaluating (far
above the tolerances the grids compare with, ``_REL``), plus CAP_EXTRA_LAYERS more layers."""
CAP_EXTRA_LAYERS = 2


def _top(tbl: StageTable, *, time_limit: np.ndarray | None = None,
         mem_limit: np.ndarray | None = None) -> tuple[int, np.ndarray]:
    """The largest layer count worth evaluating on any rank, and per config whether that holds
    for every finite answer (else only for answers up to ``time_limit``).

    A rank's n layers take at least ``n a + e`` seconds and ``n (c + k min(d, g)) + f`` bytes
    (no recompute time, everything recomputed), increasing in n. Past the count where that
    exceeds ``time_limit`` (``mem_limit``) a cell is either infeasible (+inf) under that limit,
    or larger than the limit. Since a rank's values increase with n, dropping cells above the
    k-th smallest value leaves it unchanged (:func:`_min_bottleneck`); so the grid may stop at
    the largest such count over the table's configs and ranks. ``time_limit`` on a memory grid
    and ``mem_limit`` on a time grid are feasibility limits (dropped cells are +inf: exact for
    every answer, ``pure`` True); ``time_limit`` with ``mem_limit`` (a time grid) is an upper
    bound the caller checks the answer against (``pure`` False where it decided the count)."""
    v_min = tbl.min_chunks()
    n_full = tbl.num_layers - (tbl.num_ranks - 1) * v_min

    def count(limit, slope, intercept):
        lim = limit[:, None] * (1 + CAP_SLACK) + CAP_SLACK * np.abs(intercept)
        cap = np.where(slope > 0, np.floor((lim - intercept) / slope) + CAP_EXTRA_LAYERS, np.inf)
        cap[np.isnan(cap)] = np.inf  # (np.nan_to_num's NaN rule; -inf stays below every count)
        return cap

    def clip(cap):
        return int(np.clip(cap.max(initial=v_min), v_min, n_full))

    everyone = np.ones(tbl.num_configs, dtype=bool)
    # (a recompute time b < 0 or a jump < 0 would lower the bounds: taken in, should a table hold one)
    t_slope = (tbl.layer_time_s + np.minimum(tbl.recompute_time_s, 0.0))[:, None]
    t_cap = None if time_limit is None else count(time_limit, t_slope, tbl.rank_time_s)
    if mem_limit is None:
        return (n_full if t_cap is None else clip(t_cap)), everyone
    slope = (tbl.layer_static_bytes[:, None]
             + tbl.inflight * np.minimum(tbl.layer_act_bytes, tbl.layer_act_recomputed_bytes)[:, None])
    m_cap = count(mem_limit, slope, tbl.rank_bytes + np.minimum(tbl.jump(), 0.0)[:, None])
    if t_cap is None:
        return clip(m_cap), everyone
    top = clip(np.minimum(t_cap, m_cap))
    return top, (m_cap <= top).all(axis=1)


def _time_given_memory(tbl: StageTable, mem_limit: np.ndarray, strict: bool,
                       top: int | None = None) -> np.ndarray:
    """T_s(n | M): least time of n layers on rank s within memory M (inf if impossible): (C,p,L)."""
    return _times_given_memory(tbl, mem_limit, (strict,), top)[0]


def _times_given_memory(tbl: StageTable, mem_limit: np.ndarray,
                        stricts: tuple[bool, ...], top: int | None = None,
                        grid: _Grid | None = None) -> list[np.ndarray]:
    """:func:`_time_given_memory` for each of ``stricts`` at one limit (shared intermediates);
    on ``grid`` when given (else the table's, cut at ``top``)."""
    grid = _grid(tbl, top) if grid is None else grid
    n, b, d, g, e, k, allow, jump = grid.n, grid.b, grid.d, grid.g, grid.e, grid.k, grid.allow, grid.jump
    lim = mem_limit[:, None, None]
    base = grid.base  # memory with no recompute
    saving = k * (d - g)  # memory saved per recomputed layer
    has_saving = saving > 0
    tol = np.maximum(np.abs(lim), 1.0) * _REL
    out = []
    x = (base + jump - lim) / np.where(has_saving, saving, 1.0)  # recomputed layers needed
    na = grid.na  # (C, 1, G): the same for every rank and every strictness
    # Recomputing cannot help a rank that saves nothing by it or a policy that recomputes
    # nothing: (C, p, 1), so the grid pays one pass for both.
    never = ~has_saving | ~allow
    never_cells = never[:, :, 0]  # (C, p)
    for strict in stricts:
        # In-place passes over the (C, p, G) grid; each step computes what the plain
        # expression would (same operations, same order), without the temporaries.
        r_min = x + 1e-9 if strict else x - 1e-9
        if strict:  # memory strictly below the limit: r > x
            fits_plain = base < lim - tol
            np.floor(r_min, out=r_min)
            r_min += 1
        else:  # r >= x
            fits_plain = base <= lim + tol
            np.ceil(r_min, out=r_min)
        np.maximum(r_min, 1.0, out=r_min)
        r_min[never_cells] = np.inf  # (C, p) cells: the rows and ranks it names, every column
        np.copyto(r_min, 0.0, where=fits_plain)
        bad = ~(r_min <= n)
        r_min *= b  # inf * 0 (NaN) where bad: overwritten below
        t = np.add(na, r_min, out=r_min)
        t += e
        np.copyto(t, np.inf, where=bad)
        out.append(_mask_grid(t, grid))
    return out


def _rows(mask: np.ndarray) -> np.ndarray:
    """The rows (configs) a (C, 1, 1) condition holds for."""
    return np.flatnonzero(mask.reshape(-1))


def _memory_given_time(tbl: StageTable, time_limit: np.ndarray, strict: bool,
                       top: int | None = None, grid: _Grid | None = None) -> np.ndarray:
    """M_s(n | T): least memory of n layers on rank s within time T (inf if impossible): (C,p,L)."""
    grid = _grid(tbl, top) if grid is None else grid
    n, b, d, g, k, allow, jump = grid.n, grid.b, grid.d, grid.g, grid.k, grid.allow, grid.jump
    lim = time_limit[:, None, None]
    # In-place passes over the (C, p, G) grid, each the plain expression's operations in order.
    slack = np.subtract(lim, grid.nae)
    if strict:
        slack -= np.maximum(np.abs(lim), 1e-30) * _REL
    else:
        slack += np.maximum(np.abs(lim), 1e-30) * _REL
    r_max = slack / b
    np.floor(r_max, out=r_max)
    # (C, 1, 1) conditions are written on their rows only: the (C, p, G) passes a broadcast
    # mask costs are paid by the few rows they touch
    r_max[_rows(~(b > 0))] = np.inf
    np.minimum(r_max, n, out=r_max)
    r_max[_rows(~allow)] = 0.0
    ok = slack >= 0
    # (where slack < 0, r_max is negative and the cell's memory is set to inf below: its value,
    # and whether it counts as recomputing, never show)
    # n c + k ((n - r) d + r g) + f + [r > 0] jump
    mem = n - r_max
    mem *= d
    mem += r_max * g
    mem *= k
    np.add(grid.nc, mem, out=mem)
    mem += grid.f
    jumps = _rows(jump != 0)  # (adding a zero jump leaves the cell as it is)
    if jumps.size:
        part = mem[jumps]
        np.add(part, jump[jumps], out=part, where=r_max[jumps] > 0)
        mem[jumps] = part
    np.minimum(mem, grid.base, out=mem)  # recomputing nothing may be leaner (jump)
    np.copyto(mem, np.inf, where=~ok)
    return _mask_grid(mem, grid)


def _n_high(tbl: StageTable) -> np.ndarray:
    """Most layers one rank can hold, (C,): every other rank needs v."""
    return tbl.num_layers - (tbl.num_ranks - 1) * tbl.chunk_array()


def _min_bottleneck(values: np.ndarray, tbl: StageTable) -> np.ndarray:
    """Smallest bottleneck level at which the ranks can hold L layers, >= v each: (C,).

    ``values[c, s, j]`` is rank s's level for n = v_min + j layers (increasing in j; -inf below
    the config's own v, see :func:`_mask_grid`). Once every rank can hold v layers, the ranks
    hold p (v_min - 1) layers below the grid for free, so the grid must supply L - p (v_min - 1):
    the (L - p (v_min - 1))-th smallest value.
    """
    C, p, G = values.shape
    if C == 0:
        return np.empty(0)
    v_min = tbl.min_chunks()
    k = tbl.num_layers - p * (v_min - 1) - 1
    if k >= p * G:  # a grid cut short (:func:`_top`): the cells beyond are +inf
        return np.full(C, np.inf)
    kth = np.partition(values.reshape(C, p * G), k, axis=1)[:, k]
    if tbl.uniform_chunks():  # every rank's level at n = v is the grid's first column
        return np.maximum(kth, values[:, :, 0].max(axis=1))
    col = tbl.chunk_array() - v_min
    at_v = values[np.arange(C), :, np.minimum(col, G - 1)]  # (C, p): each config's own column
    at_v = np.where((col < G)[:, None], at_v, np.inf)
    return np.maximum(kth, at_v.max(axis=1))


def _assignment(tbl: StageTable, t_lim: np.ndarray, m_lim: np.ndarray,
                t_of_n: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A concrete (n, r) per rank meeting (T, M); None-free: rows must be feasible.
    ``t_of_n`` is ``_time_given_memory(tbl, m_lim, strict=False)`` when the caller has it."""
    if t_of_n is None:
        t_of_n = _time_given_memory(tbl, m_lim, strict=False)
    tol = np.maximum(np.abs(t_lim), 1e-30)[:, None, None] * 1e-9
    n_max = (t_of_n <= t_lim[:, None, None] + tol).sum(axis=2).astype(np.int64) + tbl.min_chunks() - 1
    n = np.minimum(n_max, _n_high(tbl)[:, None])
    excess = n.sum(axis=1) - tbl.num_layers
    # Give back surplus layers from the ranks holding the most (keeps both limits: downward closed).
    while np.any(excess > 0):
        rows = np.flatnonzero(excess > 0)
        j = np.argmax(n[rows], axis=1)
        n[rows, j] -= 1
        excess[rows] -= 1
    return n, _fewest_recomputed(tbl, n, m_lim)


def _fewest_recomputed(tbl: StageTable, n: np.ndarray, m_lim: np.ndarray) -> np.ndarray:
    """Fewest recomputed layers per rank (C, p) that keep n layers within the memory limit (the
    fastest choice)."""
    c, d, g = tbl.layer_static_bytes[:, None], tbl.layer_act_bytes[:, None], tbl.layer_act_recomputed_bytes[:, None]
    base = n * (c + tbl.inflight * d) + tbl.rank_bytes
    saving = tbl.inflight * (d - g)
    tol = np.maximum(np.abs(m_lim), 1.0)[:, None] * _REL
    need = np.ceil((base + tbl.jump()[:, None] - m_lim[:, None]) / np.where(saving > 0, saving, 1.0) - 1e-9)
    r = np.where(base <= m_lim[:, None] + tol, 0.0, np.maximum(need, 1.0))
    r = np.minimum(np.maximum(r, 0), n).astype(np.int64)  # np.clip, without its wrapper
    return np.where(tbl.allow_recompute[:, None], r, 0)


def _quiet() -> np.errstate:
    """The grids divide by zero and multiply inf by 0 in cells they then overwrite: the walk
    runs with those warnings off (one context per walk, not one per grid pass)."""
    return np.errstate(divide="ignore", invalid="ignore", over="ignore")

