"""Step 3 of :mod:`meshplan.search.planner`: uneven stage splits of the promising configurations
(affine per-rank tables, :mod:`meshplan.search.tables`; the staircase walk,
:mod:`meshplan.search.stages`), their points scored exactly."""

from __future__ import annotations

from typing import Callable

import numpy as np

from meshplan.cost.arrays import PlanArrays
from meshplan.plan import Recompute
from meshplan.search.even import EvenCost
from meshplan.search.frontier import Front, dominated_by, merge_fronts
from meshplan.search.space import RECOMPUTES, SearchOptions
from meshplan.search.stages import StagePoints, relaxed_bounds, stage_frontier
from meshplan.search.split_scoring import score_splits
from meshplan.search.tables import (MEMORY_PROBE_LAYERS, CostContext, SharedLayerCost, pipeline_alpha,
                                    stage_probes, stage_table)

PRUNE_MARGIN = 0.05
"""Bounds from the affine per-rank tables are lowered by this fraction before they are compared
with known plans. The tables are exact for the cost model's linear terms, but the overlap of
data-parallel and ZeRO-3 communication with compute (``comms.exposed``: a min of two lines) is
read off at one or two layers and extrapolated, which can overstate a rank's time by a few
percent; the margin keeps such configurations in the search."""

def _refine(ctx: CostContext, space: PlanArrays, plans: PlanArrays, layer: SharedLayerCost,
            even: EvenCost, candidate: np.ndarray, fronts: list[Front],
            splits: list[tuple[np.ndarray, np.ndarray, np.ndarray]], *, options: SearchOptions,
            cap: float, stage_points: int | None,
            tick: Callable[[str, float], None], truncate: bool | None = None) -> tuple[int, int]:
    """Uneven splits of the promising configurations (step 3 of the module docstring).

    Appends one Front per group of configurations to ``fronts`` (keys >= 0 number the rows of
    ``splits``, in order: each item holds the per-rank layer and recomputed counts and the
    configuration of its next rows) and returns (configurations refined, splits scored).
    """
    model = ctx.model
    refined = evaluated = 0
    # Policy 'none' is recompute policy 'selective' with zero recomputed layers: refine the
    # recomputing policies only (their frontier contains every no-recompute split).
    none_code = RECOMPUTES.index(Recompute.NONE)
    has_rec = np.isin(space.recompute, [RECOMPUTES.index(r) for r in options.recomputes
                                        if r != Recompute.NONE])
    if has_rec.any():
        candidate = candidate & (space.recompute != none_code)  # (a new array: the caller's is shared)
    # One group per pipeline degree and grid width class: configurations with different
    # virtual-stage counts share a table (StageTable.chunks per config) when their usable
    # layer-count ranges (L - p v + 1 values per rank) are within a factor of two, so that no
    # table is padded to much more than its configurations need. Most promising groups first so
    # that their plans prune the later groups; within a group fastest even split first.
    cand = np.flatnonzero(candidate)  # the rest of the space is not read below
    width = model.num_layers - space.pp[cand] * space.vpp[cand] + 1
    group_of = space.pp[cand].astype(np.int64) * 64 + np.floor(np.log2(np.maximum(width, 1))).astype(np.int64)
    groups, group_idx = np.unique(group_of, return_inverse=True)
    best = np.full(groups.size, np.inf)
    np.minimum.at(best, group_idx, even.step_time_s[cand])
    order = np.argsort(best, kind="stable")
    by_group = np.argsort(group_idx, kind="stable")  # candidates grouped, in row order within a group
    starts = np.searchsorted(group_idx[by_group], np.arange(groups.size + 1))
    # The stage tables' probes of every candidate in one cost-model call (cand is ascending).
    probes = stage_probes(ctx, plans.take(cand), shared=layer.rows(cand))
    next_key = 0
    for gi, g in enumerate(order):
        idx = cand[by_group[starts[g]:starts[g + 1]]]
        idx = idx[np.argsort(even.step_time_s[idx], kind="stable")]
        pp = int(space.pp[idx[0]])
        # pp = 1: the staircase is one point per recomputed-layer count, L + 1 at most, walked
        # whole (a cap would keep the points nearest the memory cap and drop the leaner ones).
        walk_points = stage_points if pp > 1 or stage_points is None else max(stage_points, model.num_layers + 1)
        refined += idx.size
        pts_t, pts_m, pts_k = [], [], []
        for chunk in np.array_split(idx, max(1, int(np.ceil(idx.size * pp * model.num_layers / 1e6)))):
            sub = plans.take(chunk)
            tbl = stage_table(ctx, sub, int(pp), sub.vpp, probes=probes.take(np.searchsorted(cand, chunk)))
            alpha = pipeline_alpha(ctx, sub)
            known = merge_fronts(*fronts)

            def keep_going(rows, t_next, m_floor, alpha=alpha, known=known):
                # alpha * max(t + x/alpha) = max(alpha t + x) bounds the step from below.
                return ~dominated_by(known.time_s, known.memory_bytes,
                                     alpha[rows] * t_next * (1 - PRUNE_MARGIN),
                                     m_floor * (1 - PRUNE_MARGIN))

            t_lb, m_lb = relaxed_bounds(tbl)
            live = keep_going(np.arange(len(sub)), t_lb, m_lb) & (m_lb <= cap)
            if not live.any():
                continue
            chunk, sub, tbl = chunk[live], sub.take(live), tbl.take(np.flatnonzero(live))
            alpha = alpha[live]
            pts = stage_frontier(tbl, max_points=walk_points, memory_cap_bytes=cap,
                                 keep_going=_Stop(lambda r, t, m, a=alpha: keep_going(r, t, m, alpha=a),
                                                  known, alpha),
                                 truncate=truncate)
            if truncate is not False and pts.config.size:
                pts = _worth_scoring(pts, keep_going(pts.config, pts.max_time_s, pts.peak_bytes, alpha=alpha))
            if options.allow_split is not None and pts.config.size:
                pts = _take(pts, options.allow_split(sub.take(pts.config), pts.layers, pts.recomputed))
            if pts.config.size == 0:
                continue
            exact = score_splits(ctx, sub.take(pts.config), pts.layers, pts.recomputed,
                                 shared=layer.rows(chunk[pts.config]))  # chunk: the live rows by now
            evaluated += pts.config.size
            splits.append((pts.layers, pts.recomputed, chunk[pts.config]))  # keys next_key...
            pts_t.append(exact.step_time_s)
            pts_m.append(exact.peak_memory_bytes)
            pts_k.append(np.arange(next_key, next_key + pts.config.size))
            next_key += pts.config.size
        if pts_t:
            fronts.append(Front.of(np.concatenate(pts_t), np.concatenate(pts_m), np.concatenate(pts_k)))
        tick("stage splits", 0.4 + 0.55 * (gi + 1) / len(groups))

    return refined, evaluated


class _Stop:
    """The walk's stop (``keep_going``) and, for a point at time t, the memory a point of the
    same config at t or later must go below for no known plan to beat it (``memory_bound``):
    the known plans fast enough for t are fast enough for any slower point (the lookup
    ``dominated_by`` makes in ``keep_going``, loosened by 1e-9 against rounding). The walk jumps
    past the points below that bound (``stage_walk._jump``) and counts only the others against
    its cap. (Ported from session 12's branch speed12b, 1a124dd.)"""

    def __init__(self, stop, known: Front, alpha: np.ndarray):
        self._stop, self._known, self._alpha = stop, known, alpha

    def __call__(self, rows, t, m):
        return self._stop(rows, t, m)

    def memory_bound(self, rows: np.ndarray, t: np.ndarray) -> np.ndarray:
        ft, fm = self._known.time_s, self._known.memory_bytes
        count = np.searchsorted(ft, self._alpha[rows] * t * (1 - PRUNE_MARGIN), side="right")
        return np.concatenate(([np.inf], fm))[count] / (1 - PRUNE_MARGIN) * (1 + 1e-9)


def _worth_scoring(pts: StagePoints, undominated: np.ndarray) -> StagePoints:
    """The walked points worth an exact score: those whose own table point, lowered by
    PRUNE_MARGIN (``undominated``: the walk's ``keep_going`` asked of the point itself), no
    known plan dominates, and every point with a rank of fewer than MEMORY_PROBE_LAYERS layers
    (there the table may overstate memory by a gathered ZeRO-3 layer: tables.MEMORY_PROBE_LAYERS).

    The walk's own stop (``keep_going`` of the next point's time and the configuration's least
    memory) rests on the tables being within PRUNE_MARGIN of the exact cost; this asks the same
    of each point's (time, memory): a point so dominated is off the frontier, and ~93 % of the
    walked points of Qwen3-30B-A3B on 256 GB200 are (session 10: 3.2M points, 6 s of exact
    scoring). ``search(prune=False)`` scores them all (tests compare the two)."""
    return _take(pts, undominated | (pts.layers.min(axis=1) < MEMORY_PROBE_LAYERS))


def _take(pts: StagePoints, keep: np.ndarray) -> StagePoints:
    if keep.all():
        return pts
    return StagePoints(pts.config[keep], pts.max_time_s[keep], pts.peak_bytes[keep], pts.layers[keep],
                       pts.recomputed[keep])
