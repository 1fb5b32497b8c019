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
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np

_REL = 1e-12
"""Relative slack when comparing floats that were computed along different paths."""


@dataclass(frozen=True)
class StageTable:
    """Affine per-rank costs for C global configurations with the same ``p`` and ``v``."""

    layer_time_s: np.ndarray  # (C,) a
    recompute_time_s: np.ndarray  # (C,) b
    layer_static_bytes: np.ndarray  # (C,) c
    layer_act_bytes: np.ndarray  # (C,) d
    layer_act_recomputed_bytes: np.ndarray  # (C,) g (<= d)
    rank_time_s: np.ndarray  # (C, p) e
    rank_bytes: np.ndarray  # (C, p) f
    inflight: np.ndarray  # (C, p) k
    allow_recompute: np.ndarray  # (C,) bool: recompute policy is not 'none'
    num_layers: int  # L
    chunks: int | np.ndarray = 1  # v: layers per rank at least v (one int, or (C,) per config)
    recompute_jump_bytes: np.ndarray | None = None
    """(C,) memory added once a rank recomputes any layer (full recompute rematerialises one
    layer's activations during its backward); None means 0."""

    def chunk_array(self) -> np.ndarray:
        """v per config, (C,) int (read-only; built once per table)."""
        return self._chunk_array[0]

    def min_chunks(self) -> int:
        """The least v of the table (1 when it has no config)."""
        return self._chunk_array[1]

    def uniform_chunks(self) -> bool:
        """Whether every config has the same v (then no grid needs :func:`_mask_grid`)."""
        return self._chunk_array[2]

    @cached_property
    def _chunk_array(self) -> tuple[np.ndarray, int, bool]:
        # one cached entry: the walk asks for these at every point of every table it takes
        v = np.broadcast_to(np.asarray(self.chunks, dtype=np.int64), (self.num_configs,))
        if v.size == 0:
            return v, 1, True
        lo = int(v.min())
        return v, lo, np.ndim(self.chunks) == 0 or lo == int(v.max())

    def jump(self) -> np.ndarray:
        if self.recompute_jump_bytes is None:
            return np.zeros(self.num_configs)
        return self.recompute_jump_bytes

    @cached_property
    def _whole_grid(self) -> _Grid:
        return _Grid(self)

    @property
    def num_configs(self) -> int:
        return int(self.layer_time_s.size)

    @property
    def num_ranks(self) -> int:
        return int(self.rank_time_s.shape[1])

    def take(self, idx: np.ndarray) -> "StageTable":
        return StageTable(self.layer_time_s[idx], self.recompute_time_s[idx], self.layer_static_bytes[idx],
                          self.layer_act_bytes[idx], self.layer_act_recomputed_bytes[idx],
                          self.rank_time_s[idx], self.rank_bytes[idx], self.inflight[idx],
                          self.allow_recompute[idx], self.num_layers,
                          self.chunks if np.ndim(self.chunks) == 0 else self.chunks[idx],
                          self.jump()[idx])

    # ---- the per-rank cost of a concrete choice ------------------------------------------
    def rank_costs(self, n: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(time, memory) per rank for layer counts n and recomputed counts r, both (C, p)."""
        a, b, c, d, g = (x[:, None] for x in (self.layer_time_s, self.recompute_time_s,
                                              self.layer_static_bytes, self.layer_act_bytes,
                                              self.layer_act_recomputed_bytes))
        t = n * a + r * b + self.rank_time_s
        m = n * c + self.inflight * ((n - r) * d + r * g) + self.rank_bytes
        return t, m + np.where(r > 0, self.jump()[:, None], 0.0)


@dataclass(frozen=True)
class StagePoints:
    """Frontier points of many configs: ``config`` indexes the StageTable rows."""

    config: np.ndarray  # (P,)
    max_time_s: np.ndarray  # (P,) slowest rank per micro-batch
    peak_bytes: np.ndarray  # (P,) most loaded rank
    layers: np.ndarray  # (P, p) n_s
    recomputed: np.ndarray  # (P, p) r_s


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


def _grid(tbl: StageTable, top: int | None = None) -> _Grid:
    """Broadcast helpers of shape (C, p, G) over the layer counts n = v_min .. L - (p-1) v_min,
    v_min the least v of the table (see :func:`_mask_grid` for configs with a larger v), or
    v_min .. ``top`` (:func:`_top`: the cells beyond count as +inf)."""
    if top is None:
        return tbl._whole_grid  # one per table
    if "_whole_grid" in tbl.__dict__:
        return tbl._whole_grid.upto(top - tbl.min_chunks() + 1)
    return _Grid(tbl, top)  # a grid cut short: only its own columns


def _mask_grid(values: np.ndarray, grid: _Grid) -> np.ndarray:
    """Per-config usable range of a (C, p, G) grid of levels: fewer than v layers is free
    (-inf: a rank always holds v) and more than L - (p-1) v is impossible (+inf).
    Overwrites and returns ``values`` (callers pass a fresh array)."""
    if grid.below is None:
        return values  # the grid is exactly v .. L - (p-1) v
    # The masks are (C, 1, G): write through them in place (values is the caller's scratch).
    np.copyto(values, -np.inf, where=grid.below)
    np.copyto(values, np.inf, where=grid.above)
    return values


CAP_SLACK = 1e-6
"""Relative slack on a limit when :func:`_top` bounds the layer counts worth evaluating (far
above the tolerances the grids compare with, ``_REL``), plus CAP_EXTRA_LAYERS more layers."""
CAP_EXTRA_LAYERS = 2

TRUNCATE_MIN_LAYER_COUNTS = 40
"""``stage_frontier``'s default: grids are cut short (:func:`_top`) only when a rank can hold at
least this many layer counts; on smaller grids the bounds' own passes cost about what they save
(Llama-2-7B's 32 layers: 0.074 s cut against 0.063 s whole; Llama-3-70B's 80: 0.34 s against
0.73 s)."""


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
        np.copyto(r_min, np.inf, where=never)
        np.copyto(r_min, 0.0, where=fits_plain)
        bad = ~(r_min <= n)
        r_min *= b  # inf * 0 (NaN) where bad: overwritten below
        t = np.add(na, r_min, out=r_min)
        t += e
        np.copyto(t, np.inf, where=bad)
        out.append(_mask_grid(t, grid))
    return out


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
    np.copyto(r_max, np.inf, where=~(b > 0))
    np.minimum(r_max, n, out=r_max)
    np.copyto(r_max, 0.0, where=~allow)
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
    np.add(mem, jump, out=mem, where=r_max > 0)
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


def stage_frontier(tbl: StageTable, max_points: int = 64,
                   keep_going: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None,
                   memory_cap_bytes: float = np.inf, truncate: bool | None = None) -> StagePoints:
    """Every Pareto point (max rank time, peak rank memory) of each config, fastest first.

    ``max_points`` bounds the staircase per config (the fastest points are kept; exact when the
    frontier is shorter). Only points with peak memory <= ``memory_cap_bytes`` are walked (the
    walk starts at the fastest such point). ``keep_going(rows, next_time, least_memory)`` may
    stop configs early:
    given the config rows still walking, the time of their next point and their least possible
    memory, it returns which are still worth walking (e.g. not dominated by known plans).
    ``truncate`` False evaluates every layer count on every grid, True cuts the grids short
    (the same points: tests compare the two); None cuts them when they are large
    (TRUNCATE_MIN_LAYER_COUNTS).
    """
    with _quiet():
        cells = tbl.num_configs * tbl.num_ranks * (tbl.num_layers - tbl.num_ranks * tbl.min_chunks() + 1)
        if tbl.num_ranks == 1:
            return _walk_one_rank_table(tbl, max_points, keep_going, memory_cap_bytes, truncate)
        if tbl.uniform_chunks() or cells < SPLIT_MIN_CELLS:
            return _walk(tbl, max_points, keep_going, memory_cap_bytes, truncate)
        return _walk_by_chunks(tbl, max_points, keep_going, memory_cap_bytes, truncate)


def _walk_by_chunks(tbl: StageTable, max_points: int, keep_going, memory_cap_bytes: float,
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


def _walk_parts(tbl: StageTable, parts: list, max_points: int, keep_going, memory_cap_bytes: float,
                truncate: bool | None) -> StagePoints:
    """The walk of ``tbl`` as walks of its parts (rows, walker): each config's points are its own
    walk's, returned in the whole walk's order (step, then row)."""
    walked = []
    for rows, walker in parts:
        if rows.size == 0:
            continue
        go = None if keep_going is None else (lambda r, t, m, rows=rows: keep_going(rows[r], t, m))
        pts = walker(tbl.take(rows), max_points, go, memory_cap_bytes, truncate)
        walked.append((rows[pts.config], pts))
    parts = walked
    if not parts:
        return _empty_points(tbl.num_ranks)
    cfg = np.concatenate([c for c, _ in parts])
    if cfg.size == 0:
        return _empty_points(tbl.num_ranks)
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


def _quiet() -> np.errstate:
    """The grids divide by zero and multiply inf by 0 in cells they then overwrite: the walk
    runs with those warnings off (one context per walk, not one per grid pass)."""
    return np.errstate(divide="ignore", invalid="ignore", over="ignore")


def _walk(tbl: StageTable, max_points: int, keep_going, memory_cap_bytes: float,
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
    mem_cap = np.full(C, float(memory_cap_bytes))
    top = _top(tbl, mem_limit=mem_cap)[0] if truncate else None
    t_cur = _min_bottleneck(_time_given_memory(tbl, mem_cap, strict=False, top=top), tbl)
    active = np.isfinite(t_cur)
    m_floor = _min_bottleneck(_memory_given_time(tbl, inf, strict=False), tbl)
    # The slowest point of the staircase (its leanest): no point of the walk is slower.
    t_last = (_min_bottleneck(_time_given_memory(tbl, m_floor, strict=False, top=_top(tbl, mem_limit=m_floor)[0]),
                              tbl) if truncate else inf)
    rows = np.arange(C)
    for _ in range(max_points):
        if not active.any():
            break
        every = bool(active.all())
        sub = tbl if every else tbl.take(rows[active])
        t_a = t_cur if every else t_cur[active]
        top = _top(sub, time_limit=t_a)[0] if truncate else None
        m_a = _min_bottleneck(_memory_given_time(sub, t_a, strict=False, top=top), sub)
        # The split of this point, and the next point: the least time that lets memory go
        # strictly below this point's.
        n, r, t_next = _point(sub, t_a, m_a, t_last[active], truncate)
        t_s, m_s = sub.rank_costs(n, r)
        out.append((rows[active], t_s.max(axis=1), m_s.max(axis=1), n, r))
        idx = rows[active]
        t_cur[idx] = t_next
        active[idx] = np.isfinite(t_next)
        if keep_going is not None and active.any():
            live = rows[active]
            active[live] = keep_going(live, t_cur[live], m_floor[live])
    if not out:
        return _empty_points(tbl.num_ranks)
    cfg, t, m, n, r = (np.concatenate(x) for x in zip(*out))
    return StagePoints(cfg, t, m, n, r)


ONE_RANK_MIN_STEP = 1e-6
""":func:`_walk_one_rank` takes a config whose layer adds at least this fraction of its rank's
scale to both time and memory (a: the time; c + k min(d, g): the least memory); others are
walked on the whole grid (:func:`_walk`)."""


def _walk_one_rank_table(tbl: StageTable, max_points: int, keep_going, memory_cap_bytes: float,
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


def _walk_one_rank(tbl: StageTable, max_points: int, keep_going, memory_cap_bytes: float) -> StagePoints:
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
    24.7k pp = 1 configurations, 930k points: 2.2 s -> see docs/search.md."""
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
    for _ in range(max_points):
        if not active.any():
            break
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
        t_next = strict[:, 0, 0]
        t_s, m_s = sub.rank_costs(n, r)
        idx = rows[active]
        out.append((idx, t_s.max(axis=1), m_s.max(axis=1), n, r))
        t_cur[idx] = t_next
        active[idx] = np.isfinite(t_next)
        if keep_going is not None and active.any():
            live = rows[active]
            active[live] = keep_going(live, t_cur[live], m_floor[live])
    if not out:
        return _empty_points(1)
    cfg, t, m, n, r = (np.concatenate(x) for x in zip(*out))
    return StagePoints(cfg, t, m, n, r)


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


def _empty_points(p: int) -> StagePoints:
    z = np.empty(0)
    return StagePoints(np.empty(0, dtype=np.int64), z, z, np.empty((0, p), np.int64), np.empty((0, p), np.int64))
