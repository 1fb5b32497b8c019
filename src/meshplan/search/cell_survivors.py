"""The cells of :mod:`meshplan.search.group_prune` that no known plan beats, and of a kept cell
the schedule / virtual-stage pairs whose own bound no known plan beats (:class:`CellKeep`).

The cells are never materialised whole (DeepSeek-V3 on 1024 GB200: 157k groups x 14 micro-batch
sizes x 11 recompute choices, 24M cells, of which the first round keeps 2 %): the first round
works on the (group, size) *blocks*, each with its corner (the least time and the least memory
over its cells: below every cell), and computes the cells of the blocks a corner does not
settle. Both steps are exact:

* the first seeds are the groups holding the Pareto frontier of every live cell. A block whose
  corner a real cell beats strictly in time (and weakly in memory) holds none of it, nor an exact
  duplicate of a frontier point (``frontier.beaten_faster``); the frontier of the cells of the
  other blocks, in the cells' order, is that of all cells (a dropped cell's dominator is beaten
  by a cell that is kept), the first copy of a tie the same.
* a block whose corner :func:`prunable` holds for holds it for every cell (prunable is monotone
  in both objectives): the cells that survive the first round are those a whole pass finds, in
  the same (ascending) order, so the later rounds pick the same groups.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

import numpy as np

from meshplan.search.frontier import Front, beaten_faster, pareto_indices
from meshplan.search.prune import STRICT, prunable
from meshplan.search.space import take_groups

if TYPE_CHECKING:
    from meshplan.search.group_prune import GroupBounds

GROUP_SEED_ROUNDS = 4
"""Rounds of exact scoring before the cells are pruned: the first scores the groups holding the
frontier of the cells' bounds, each later one the groups holding the open cells of least bound
time; after each, the cells are pruned against every plan scored so far."""

GROUP_SEED_GROUPS = 64
"""Open cells (fastest bound first) whose groups a seeding round after the first scores."""


@dataclass(frozen=True)
class CellKeep:
    """The cells to cross (``cells``: kept groups x sizes x choices, the groups ``groups`` of the
    bounds'), and of a kept cell the configurations of the schedule / virtual-stage pairs whose
    own bound (``PairTerms.time_s``, the cell's memory bound) is not :func:`prunable` against the
    same known plans: ``space.cross_groups``' ``keep``."""

    cells: np.ndarray
    bounds: GroupBounds
    groups: np.ndarray  # (cells' groups,) their index in the bounds' groups
    known: Front
    fastest_fitting_s: float
    shrink: float
    beaten_at_s: np.ndarray | None = None
    """(as ``cells``) per kept cell :func:`beaten_at_s` of its memory bound (inf elsewhere)."""

    def take(self, index) -> CellKeep:
        """The keep of the groups at ``index`` (of this keep's groups)."""
        return replace(self, cells=self.cells[index], groups=self.groups[index],
                       beaten_at_s=None if self.beaten_at_s is None else self.beaten_at_s[index])

    def mask(self, group: np.ndarray, pair: np.ndarray, size: np.ndarray) -> np.ndarray:
        """(rows, choices) whether each row's (group of this keep, pair, size index) crossed
        with each recompute choice is kept."""
        keep = take_rows(self.cells, group, size)
        terms = self.bounds.pair
        if terms is None:
            return keep
        # (a pair at the cell's own fewest layers and bubble has the cell's bound: kept with it)
        g = self.groups[group]
        rows = np.flatnonzero(_any_column(keep) & take_rows(terms.above_cell, terms.pp_of[g], pair))
        if rows.size == 0:
            return keep
        group, size = group[rows], size[rows]
        time_s = terms.time_s(g[rows], pair[rows], size)
        # prunable(known, time_s, the cell's memory bound), its frontier lookup done per cell:
        # dropped where time_s >= the fastest fitting time and time_s * shrink * STRICT (rounded
        # in that order) reaches the cell's beaten_at_s, written in place
        dropped = time_s >= self.fastest_fitting_s
        time_s *= self.shrink
        time_s *= STRICT
        dropped &= time_s >= take_rows(self.beaten_at_s, group, size)
        keep[rows] &= ~dropped
        return keep


def take_rows(values: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """``values[i, j]`` (in-range, non-negative indices) as one gather of the flat rows of a
    C-contiguous array: numpy's two-index fancy indexing is several times slower on the cell
    arrays (Qwen3-30B-A3B on 256 GB200, meshplan target: 2.1M rows per search)."""
    if not values.flags.c_contiguous:
        return values[i, j]
    n, m = values.shape[:2]
    return np.take(values.reshape(n * m, *values.shape[2:]), i * m + j, axis=0)


def _any_column(values: np.ndarray) -> np.ndarray:
    """``values.any(axis=1)`` of a (rows, few) bool array, column by column: numpy's reduction
    along a short last axis is ~10x slower."""
    if values.shape[1] == 0:
        return np.zeros(values.shape[0], dtype=bool)
    out = values[:, 0].copy()
    for j in range(1, values.shape[1]):
        out |= values[:, j]
    return out


def beaten_at_s(known: Front, memory_bytes: np.ndarray, shrink: float) -> np.ndarray:
    """Per memory bound, the least shrunk time (``time_s * shrink * STRICT``) at which
    :func:`prunable`'s dominance holds against ``known`` (inf: at none): the time of the fastest
    known point within the shrunk memory. ``known`` is a frontier (times strictly rising,
    memories strictly falling), so a shrunk time is dominated exactly when it reaches that point's
    time (``frontier.dominated_by``'s lookup, made once per bound instead of once per time)."""
    j = np.searchsorted(-known.memory_bytes, -(memory_bytes * shrink * STRICT), side="left")
    return np.concatenate([known.time_s, [np.inf]])[j]


def _live_cells(bounds: GroupBounds, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The live (finite-time) cells of ``blocks`` (ascending (group, size) flat indices): their
    flat (group, size, choice) indices, ascending, and their time and memory bounds."""
    s_n, c_n = bounds.shape[1:]
    t, m = bounds.cells(*np.divmod(blocks, s_n))
    live = np.isfinite(t)
    flat = (blocks * c_n)[:, None] + np.arange(c_n)
    return flat[live], t[live], m[live]


def _frontier_cells(bounds: GroupBounds, blocks: np.ndarray, t_lo: np.ndarray, m_lo: np.ndarray) -> np.ndarray:
    """Flat indices of the Pareto frontier (``pareto_indices``, first copy of a tie) of every live
    cell of ``blocks`` (ascending), whose corners are ``t_lo`` / ``m_lo``: the cells of the blocks
    on the corners' frontier give real points; a block whose corner one of them beats strictly in
    time holds no frontier cell (module docstring)."""
    near = blocks[pareto_indices(t_lo, m_lo)]
    _, t0, m0 = _live_cells(bounds, np.sort(near))
    f0 = Front.of(t0, m0, np.arange(t0.size))
    flat, t, m = _live_cells(bounds, blocks[~beaten_faster(f0.time_s, f0.memory_bytes, t_lo, m_lo)])
    return flat[pareto_indices(t, m)]


def surviving(groups: dict[str, np.ndarray], bounds: GroupBounds,
              score: Callable[[dict[str, np.ndarray]], tuple[np.ndarray, np.ndarray]], *,
              shrink: float, budget_bytes: float) -> tuple[CellKeep, int]:
    """The (group, size, choice) cells whose bound no plan scored here beats (:func:`prunable`),
    with those plans (:class:`CellKeep`, of the groups with a kept cell), and how many
    configurations were scored. ``score(groups)`` returns the exact even (step, peak) of the
    configurations of those groups that it scored exactly (any subset: only exact points prune).
    Rounds as :func:`meshplan.search.prune.settle`: the groups holding the frontier of the cells'
    bounds first, then those holding the open cells of least bound time."""
    g_n, s_n, c_n = bounds.shape
    per_group = s_n * c_n
    t_lo, m_lo = (a.reshape(-1) for a in bounds.corners())
    blocks = np.flatnonzero(np.isfinite(t_lo))  # the blocks holding a live cell
    if shrink <= 0.0 or blocks.size == 0:
        live, _, _ = _live_cells(bounds, blocks)
        return _keep(bounds, live, replace(bounds, pair=None), Front.empty(), np.inf, shrink, None), 0
    seen = np.zeros(g_n, dtype=bool)
    known_t, known_m = np.empty(0), np.empty(0)
    scored = 0
    live = live_t = live_m = None
    for round_ in range(GROUP_SEED_ROUNDS):
        if round_ == 0:
            cells = _frontier_cells(bounds, blocks, t_lo[blocks], m_lo[blocks])
        else:
            # The alive cells with their bounds, compressed as cells die (as settle's open rows).
            unseen = ~seen[live // per_group]
            open_, open_t = live[unseen], live_t[unseen]  # (ascending, as live)
            if open_.size == 0:
                break
            cells = open_[np.argpartition(open_t, min(GROUP_SEED_GROUPS, open_.size) - 1)[:GROUP_SEED_GROUPS]]
        pick = np.unique(cells // per_group)
        seen[pick] = True
        t, m = score(take_groups(groups, pick))
        scored += t.size
        known = Front.of(np.concatenate([known_t, t]), np.concatenate([known_m, m]), np.arange(known_t.size + t.size))
        known_t, known_m = known.time_s, known.memory_bytes
        fits = known_m <= budget_bytes
        fastest_fitting = float(known_t[fits].min()) if fits.any() else np.inf
        if round_ == 0:
            # a block whose corner is beaten holds only beaten cells (module docstring)
            kept = ~prunable(known, t_lo[blocks], m_lo[blocks], shrink=shrink, fastest_fitting_s=fastest_fitting)
            live, live_t, live_m = _live_cells(bounds, blocks[kept])
        still = ~prunable(known, live_t, live_m, shrink=shrink, fastest_fitting_s=fastest_fitting)
        live, live_t, live_m = live[still], live_t[still], live_m[still]
    return _keep(bounds, live, bounds, known, fastest_fitting, shrink, beaten_at_s(known, live_m, shrink)), scored


def _keep(bounds: GroupBounds, live: np.ndarray, kept_bounds: GroupBounds, known: Front, fastest_fitting_s: float,
          shrink: float, beaten: np.ndarray | None) -> CellKeep:
    """The keep of the cells ``live`` (ascending flat indices), of the groups holding one."""
    _, s_n, c_n = bounds.shape
    group, rest = np.divmod(live, s_n * c_n)
    kept = np.unique(group)
    at = np.searchsorted(kept, group)
    cells = np.zeros((kept.size, s_n, c_n), dtype=bool)
    cells[at, rest // c_n, rest % c_n] = True
    beaten_s = None
    if beaten is not None:
        beaten_s = np.full(cells.shape, np.inf)
        beaten_s[at, rest // c_n, rest % c_n] = beaten
    return CellKeep(cells, kept_bounds, kept, known, fastest_fitting_s, shrink, beaten_s)
