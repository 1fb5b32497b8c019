"""Honest evaluation: refit without a group of rows (a model family, a GPU generation, a source)
and score the held-out rows with the fit that never saw them (issue 14, item 7).

Every row is predicted once, by the fit made without its group, so the pooled scores are
out-of-sample. A held-out row whose (generation, stack) has no training rows left (leave one GPU
generation out) is scored with one fit pooled over the stack's remaining rows of every
generation: what the model would say about a generation it has never seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

from meshplan.calib.fit import (FIT_ROUNDS, FitResult, calibration_key, fit_all, fit_rows, fitted_calibration,
                                predict_all, prepare, shared_settings, source_group)
from meshplan.calib.forked import map_forked
from meshplan.calib.validate import Run
from meshplan.cost.calibration import fitted_records, gpu_generation

HOLDOUTS: Mapping[str, Callable[[Run], str]] = MappingProxyType({
    "family": lambda r: r.family,
    "generation": lambda r: gpu_generation(r.cluster.gpu),
    "source": source_group,
})
"""The groups a row can be held out by."""
HOLDOUT_RESTARTS = 0
"""Perturbed restarts of a held-out refit. A fold starts its descent from the full fit's values
(``warm``) rather than the literature start, and the restarts the full fit needed to leave the
literature start's one-field optima are not run again: a fold is then one descent of at most
``FIT_ROUNDS`` sweeps, ~5x cheaper than the shipped fit. The descent still moves every field the
held-out rows had pinned; what it keeps from the full fit is the region, which is stated in
every result (``HeldOut.how``)."""
HOW = ("each fold refits the (generation, stack) records its held-out rows belong to, from the full "
       "fit's values, by coordinate descent without restarts (calib/holdout.py HOLDOUT_RESTARTS); "
       "a generation with no rows left is scored by "
       "one fit pooled over the stack's other generations, from the literature start")


@dataclass(frozen=True)
class HeldOut:
    """Out-of-sample throughput errors of one leave-one-group-out pass."""

    by: str
    groups: dict[str, dict[str, float]]
    """group -> rows, median absolute and median signed error of its held-out rows."""
    errors: tuple[float, ...]
    """predicted / measured - 1 of every held-out row."""
    how: str = HOW
    """How the folds were fitted (warm start, restarts)."""

    def summary(self) -> dict[str, Any]:
        e = np.abs(np.array(self.errors))
        return {"by": self.by, "rows": int(e.size),
                "median_abs_error": float(np.median(e)) if e.size else float("nan"),
                "p90_abs_error": float(np.percentile(e, 90)) if e.size else float("nan"),
                "median_signed_error": float(np.median(self.errors)) if e.size else float("nan"),
                "median_of_group_medians": (float(np.median([g["median_abs_error"] for g in self.groups.values()]))
                                            if self.groups else float("nan")),
                "groups": self.groups, "how": self.how}


def _errors(rows: list[Run], fits: Mapping[str, FitResult], pooled: Mapping[str, FitResult]) -> list[float]:
    out = []
    for r in rows:
        own = fits if calibration_key(r) in fits else {calibration_key(r): pooled[r.stack]}
        pred, _ = predict_all(prepare([r]), fitted_calibration(r, own))
        out.append(float(pred[0] / r.measured - 1.0))
    return out


def full_time_fit(rows: list[Run], settings: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Where the folds start: the shipped fitted record of each (generation, stack) of ``rows``
    (the full fit of the shipped runs; ``leave_one_out``'s ``full`` replaces it with a fit just
    made, as ``validate --fit --holdout`` does)."""
    shipped = fitted_records()
    return {k: dict(shipped[k].values) for k in {calibration_key(r) for r in rows} if k in shipped}


def _fold(rows: list[Run], group_of, g: str, settings: Mapping[str, Any], rounds: int, restarts: int,
          full: Mapping[str, FitResult | Mapping[str, float]]) -> tuple[str, list[float]]:
    train = [r for r in rows if group_of(r) != g]
    test = [r for r in rows if group_of(r) == g]
    if not train:
        return g, []
    warm = {k: dict(v.values if isinstance(v, FitResult) else v) for k, v in full.items()}
    refit = {calibration_key(r) for r in test}
    # only the records with held-out rows change; the others score no held-out row
    fits = fit_all([r for r in train if calibration_key(r) in refit], settings, rounds, memory_grid={},
                   restarts=restarts, warm=warm)
    pooled = {}
    for stack in {r.stack for r in test if calibration_key(r) not in fits}:
        same = [r for r in train if r.stack == stack]
        if same:
            pooled[stack] = fit_rows(same, f"pooled/{stack}", stack, shared_settings(same, settings),
                                     rounds, memory_grid={}, restarts=restarts)
    test = [r for r in test if calibration_key(r) in fits or r.stack in pooled]
    return g, _errors(test, fits, pooled)


def leave_one_out(runs: list[Run], by: str, settings: Mapping[str, Any], rounds: int = FIT_ROUNDS,
                  full: Mapping[str, FitResult | Mapping[str, float]] | None = None, workers: int = 1,
                  restarts: int = HOLDOUT_RESTARTS) -> HeldOut:
    """Refit without each group of ``HOLDOUTS[by]`` and score it; throughput fields only. Folds
    start from ``full`` (a fit on all rows, or fitted values per key; default: the shipped
    records) and run ``workers`` at a time in forked processes."""
    group_of = HOLDOUTS[by]
    rows = [r for r in runs if r.metric and r.measured]
    full = full_time_fit(rows, settings) if full is None else full
    done = map_forked(lambda g: _fold(rows, group_of, g, settings, rounds, restarts, full),
                      sorted({group_of(r) for r in rows}), workers)
    groups, errors = {}, []
    for g, e in done:
        if e:
            groups[g] = {"rows": len(e), "median_abs_error": float(np.median(np.abs(e))),
                         "median_signed_error": float(np.median(e))}
            errors.extend(e)
    return HeldOut(by=by, groups=groups, errors=tuple(errors))
