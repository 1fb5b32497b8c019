"""The fit's optimizer: coordinate descent over grids with perturbed restarts (no scipy).

Each sweep sets one field at a time to the best value of its grid with the others fixed, until a
sweep improves nothing. Coordinate descent alone stops where no single field can improve, which
on correlated fields (the GEMM efficiency against the overlaps and the attention efficiency) is
not the best setting the grids hold: on main at 06fa4a7, main's previous blackwell-ultra record
scored a lower loss on its rows than the refit that replaced it
(bench/results/a2a_flex_2026-11-24.json). Restarts (iterated local search, Lourenco, Martin &
Stuetzle 2003, Sec. 3) move a few fields of the best point to random grid values, descend again,
and keep the result only if its loss is lower.

A sweep of one field re-estimates only the row groups that field moves: a group whose estimate is
the same at the grid's first and last value is left at its current estimate (every cost term is
monotone in each field, so a group equal at both ends is equal in between). After a field moves,
every group is estimated again, so the loss a sweep compares against is exact.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from meshplan.calib.priors import FIELD_PRIORS
from meshplan.cost.calibration import Calibration

LOG = logging.getLogger(__name__)
RESTART_FIELDS = 3
"""Fields a restart moves at once: enough to leave a one-field optimum, few enough that the next
descent starts near the good region."""
FIT_SEED = 20261124
"""The restarts' random seed (any fixed value, a date): a refit is reproducible."""
SAME_RTOL = 1e-12
"""Relative tolerance under which a group's estimate did not move (float noise only)."""


@dataclass(frozen=True)
class Objective:
    """A loss over rows estimated in groups: ``predict(g, calib)`` gives group ``g``'s rows'
    values (their positions: ``rows[g]``) and ``score`` turns every row's value into the loss."""

    rows: tuple[tuple[int, ...], ...]
    predict: Callable[[int, Calibration], np.ndarray]
    score: Callable[[np.ndarray], float]
    size: int

    def all_values(self, calib: Calibration) -> np.ndarray:
        out = np.empty(self.size)
        for g, ix in enumerate(self.rows):
            out[list(ix)] = self.predict(g, calib)
        return out


def grid_position(values: tuple[float, ...], v: float) -> float:
    """Where ``v`` lies on a field's grid, 0 (its first value) to 1 (its last)."""
    grid = np.asarray(values, dtype=float)
    return float(np.interp(v, grid, np.linspace(0.0, 1.0, grid.size))) if grid.size > 1 else 0.0


def prior_penalty(calib: Calibration, start: Calibration, grid: Mapping[str, tuple[float, ...]],
                  weight: float) -> float:
    """``weight`` x the distance of every fitted field from its start (calib/fit.py
    ``PRIOR_WEIGHT``): the share of its physical range on its scale (calib/priors.py), or of
    its grid for a field without a prior."""
    total = 0.0
    for n, g in grid.items():
        v, s = getattr(calib, n), getattr(start, n)
        prior = FIELD_PRIORS.get(n)
        total += (prior.distance(v, s) if prior is not None
                  else abs(grid_position(g, v) - grid_position(g, s)))
    return weight * total


def _sweep_field(obj: Objective, calib: Calibration, values: np.ndarray, name: str, grid_values,
                 penalty: Callable[[Calibration], float]) -> tuple[Calibration, float, bool]:
    """The best value of ``name`` on its grid, the others fixed; ``values``: every row's value
    at ``calib`` (exact)."""
    best = obj.score(values) + penalty(calib)
    ends = {v: calib.replace_fields(**{name: float(v)}) for v in (grid_values[0], grid_values[-1])}
    at_end = {v: {} for v in ends}
    live = []
    for g, ix in enumerate(obj.rows):
        cur = values[list(ix)]
        for v, c in ends.items():
            at_end[v][g] = obj.predict(g, c)
        if not all(np.allclose(at_end[v][g], cur, rtol=SAME_RTOL, atol=0.0) for v in ends):
            live.append(g)
    moved = False
    for v in grid_values:
        trial = calib.replace_fields(**{name: float(v)})
        if getattr(trial, name) == getattr(calib, name):
            continue
        vals = values.copy()
        for g in live:
            vals[list(obj.rows[g])] = at_end[v][g] if v in at_end else obj.predict(g, trial)
        val = obj.score(vals) + penalty(trial)
        if val < best - 1e-9:
            best, calib, moved = val, trial, True
    return calib, best, moved


def _descend_once(obj: Objective, calib: Calibration, grid: Mapping[str, tuple[float, ...]], rounds: int,
                  penalty: Callable[[Calibration], float]) -> tuple[Calibration, float]:
    values = obj.all_values(calib)
    best = obj.score(values) + penalty(calib)
    for sweep in range(rounds):
        improved = False
        for name, grid_values in grid.items():
            calib, _, moved = _sweep_field(obj, calib, values, name, grid_values, penalty)
            if moved:
                values = obj.all_values(calib)  # exact again before the next field
                val = obj.score(values) + penalty(calib)
                improved |= val < best - 1e-9
                best = min(best, val)
        LOG.debug("sweep %d: loss %.5f", sweep + 1, best)
        if not improved:
            break
    return calib, best


def descend(obj: Objective, calib: Calibration, grid: Mapping[str, tuple[float, ...]], rounds: int,
            prior_weight: float = 0.0, restarts: int = 0, prior_center: Calibration | None = None) -> Calibration:
    """Coordinate descent from ``calib`` (at most ``rounds`` sweeps, stopping at the first that
    improves nothing), then ``restarts`` perturbed restarts from the best point so far. The prior
    pulls toward ``prior_center`` (default: ``calib``); a held-out refit starts from the full
    fit's values and keeps the literature start as its prior (calib/holdout.py)."""
    start = calib if prior_center is None else prior_center

    def penalty(c: Calibration) -> float:
        return prior_penalty(c, start, grid, prior_weight) if prior_weight else 0.0

    calib, best = _descend_once(obj, calib, grid, rounds, penalty)
    LOG.debug("descent from the start: loss %.5f", best)
    names = tuple(grid)
    rng = np.random.default_rng(FIT_SEED)
    for _ in range(restarts if len(names) > 1 else 0):
        moved = rng.choice(len(names), size=min(RESTART_FIELDS, len(names)), replace=False)
        trial = calib.replace_fields(**{names[i]: float(rng.choice(grid[names[i]])) for i in moved})
        trial, val = _descend_once(obj, trial, grid, rounds, penalty)
        LOG.debug("restart moving %s: loss %.5f (best %.5f)", [names[i] for i in moved], val, best)
        if val < best - 1e-9:
            calib, best = trial, val
    return calib
