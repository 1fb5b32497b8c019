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
from meshplan.calib.validate import Run
from meshplan.cost.calibration import gpu_generation

HOLDOUTS: Mapping[str, Callable[[Run], str]] = MappingProxyType({
    "family": lambda r: r.family,
    "generation": lambda r: gpu_generation(r.cluster.gpu),
    "source": source_group,
})
"""The groups a row can be held out by."""


@dataclass(frozen=True)
class HeldOut:
    """Out-of-sample throughput errors of one leave-one-group-out pass."""

    by: str
    groups: dict[str, dict[str, float]]
    """group -> rows, median absolute and median signed error of its held-out rows."""
    errors: tuple[float, ...]
    """predicted / measured - 1 of every held-out row."""

    def summary(self) -> dict[str, Any]:
        e = np.abs(np.array(self.errors))
        return {"by": self.by, "rows": int(e.size),
                "median_abs_error": float(np.median(e)) if e.size else float("nan"),
                "p90_abs_error": float(np.percentile(e, 90)) if e.size else float("nan"),
                "median_signed_error": float(np.median(self.errors)) if e.size else float("nan"),
                "groups": self.groups}


def _errors(rows: list[Run], fits: Mapping[str, FitResult], pooled: Mapping[str, FitResult]) -> list[float]:
    out = []
    for r in rows:
        own = fits if calibration_key(r) in fits else {calibration_key(r): pooled[r.stack]}
        pred, _ = predict_all(prepare([r]), fitted_calibration(r, own))
        out.append(float(pred[0] / r.measured - 1.0))
    return out


def leave_one_out(runs: list[Run], by: str, settings: Mapping[str, Any], rounds: int = FIT_ROUNDS) -> HeldOut:
    """Refit without each group of ``HOLDOUTS[by]`` and score it; throughput fields only."""
    group_of = HOLDOUTS[by]
    rows = [r for r in runs if r.metric and r.measured]
    groups, errors = {}, []
    for g in sorted({group_of(r) for r in rows}):
        train = [r for r in rows if group_of(r) != g]
        test = [r for r in rows if group_of(r) == g]
        if not train:
            continue
        fits = fit_all(train, settings, rounds, memory_grid={})
        pooled = {}
        for stack in {r.stack for r in test if calibration_key(r) not in fits}:
            same = [r for r in train if r.stack == stack]
            if same:
                pooled[stack] = fit_rows(same, f"pooled/{stack}", stack, shared_settings(same, settings),
                                         rounds, memory_grid={})
        test = [r for r in test if calibration_key(r) in fits or r.stack in pooled]
        e = _errors(test, fits, pooled)
        if e:
            groups[g] = {"rows": len(e), "median_abs_error": float(np.median(np.abs(e))),
                         "median_signed_error": float(np.median(e))}
            errors.extend(e)
    return HeldOut(by=by, groups=groups, errors=tuple(errors))
