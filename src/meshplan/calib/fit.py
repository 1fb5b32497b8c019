"""Fit a few calibration factors per GPU family against measured runs (no scipy).

Coordinate descent over small grids: each round sweeps one factor over its grid with the others
fixed and keeps the best value. Time factors minimise the mean absolute log error of the
throughput metric (least absolute deviations: robust to the odd noisy row); memory factors
minimise the mean absolute relative error of peak memory. Only rows of the family are used and
nothing is specific to a row. ``leave_one_source_out`` refits without each source and scores the
held-out rows, which says how well the fitted model transfers.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from meshplan.calib.validate import Run, predicted_metric
from meshplan.cost.arrays import PlanArrays
from meshplan.cost.batch import estimate_batch
from meshplan.cost.calibration import Calibration, gpu_family
from meshplan.spec.cluster import GIB

TIME_GRID: Mapping[str, tuple[float, ...]] = MappingProxyType({
    "matmul_efficiency": tuple(np.round(np.arange(0.50, 0.951, 0.025), 3)),
    "matmul_half_dim": (16.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0),
    "inter_node_comm_efficiency": (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
    "intra_node_comm_efficiency": (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
    "dp_overlap": (0.0, 0.25, 0.5, 0.75, 0.9, 1.0),
    "layer_overhead_s": (0.0, 0.25e-3, 0.5e-3, 1e-3, 1.5e-3, 2e-3, 3e-3, 4e-3, 6e-3),
    "unaligned_matmul_factor": (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0),
    "comm_half_message_bytes": (0.0, 16e6, 32e6, 64e6, 128e6, 256e6),
})
"""Factors fitted on throughput, with their grids. Families with few rows fit only the first."""
MEMORY_GRID: Mapping[str, tuple[float, ...]] = MappingProxyType({
    "framework_overhead_gib": tuple(np.round(np.arange(0.0, 12.01, 0.5), 2)),
    "allocator_fragmentation": (0.0, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2),
    "loss_transient_bytes_per_element": (0.0, 2.0, 4.0, 6.0, 8.0),
    "grad_bytes_per_param_bf16": (4.0, 4.5, 5.0, 5.5, 6.0),
})
MIN_ROWS_FOR_ALL = 10


@dataclass(frozen=True)
class FitResult:
    family: str
    values: dict[str, float]
    throughput_rows: int
    memory_rows: int
    throughput_error_before: float
    throughput_error_after: float
    memory_error_before: float
    memory_error_after: float


def _predict(run: Run, calib: Calibration) -> tuple[float | None, float]:
    b = estimate_batch(run.model, run.cluster, run.training, PlanArrays.from_plans([run.plan]), calib)
    return predicted_metric(run, float(b.step_time_s[0])), float(b.peak_memory_bytes[0]) / GIB


def time_loss(runs: list[Run], calib: Calibration) -> float:
    errs = [abs(np.log(p / r.measured)) for r in runs for p in [_predict(r, calib)[0]] if p]
    return float(np.mean(errs)) if errs else 0.0


def memory_loss(runs: list[Run], calib: Calibration) -> float:
    """Mean relative error of peak memory; a row that ran out of memory only says it needed
    more than the GPU has, so it counts as a one-sided (hinge) error when predicted to fit."""
    errs = []
    for r in runs:
        pred = _predict(r, calib)[1]
        if r.measured_memory_gib:
            errs.append(abs(pred / r.measured_memory_gib - 1))
        elif r.oom:
            errs.append(max(0.0, r.cluster.gpu.memory_gib / pred - 1))
    return float(np.mean(errs)) if errs else 0.0


def _descend(runs, calib, grid, loss, rounds) -> Calibration:
    best = loss(runs, calib)
    for _ in range(rounds):
        improved = False
        for name, values in grid.items():
            for v in values:
                trial = calib.replace_fields(**{name: float(v)})
                val = loss(runs, trial)
                if val < best - 1e-9:
                    best, calib, improved = val, trial, True
        if not improved:
            break
    return calib


def fit_family(runs: list[Run], family: str, settings: Mapping[str, Any], rounds: int = 2,
               time_grid: dict | None = None, memory_grid: dict | None = None) -> FitResult:
    """Fit the family's factors on its rows; ``settings`` describe the runs' software."""
    rows = [r for r in runs if gpu_family(r.cluster.gpu) == family]
    t_rows = [r for r in rows if r.metric and r.measured]
    m_rows = [r for r in rows if r.measured_memory_gib or r.oom]
    # Start from the literature defaults, not from FITTED, so that a refit is reproducible.
    start = Calibration().replace_fields(**settings)
    tg = dict(TIME_GRID if time_grid is None else time_grid)
    if len(t_rows) < MIN_ROWS_FOR_ALL:
        tg = dict(list(tg.items())[:1])
    calib = _descend(t_rows, start, tg, time_loss, rounds) if t_rows else start
    mg = dict(MEMORY_GRID if memory_grid is None else memory_grid)
    calib = _descend(m_rows, calib, mg, memory_loss, rounds) if m_rows else calib
    fitted = [*tg, *(mg if m_rows else ())]
    return FitResult(
        family=family, values={k: getattr(calib, k) for k in fitted if t_rows or k in mg},
        throughput_rows=len(t_rows), memory_rows=sum(1 for r in m_rows if r.measured_memory_gib),
        throughput_error_before=_median_abs(t_rows, start, 0), throughput_error_after=_median_abs(t_rows, calib, 0),
        memory_error_before=_median_abs(m_rows, start, 1), memory_error_after=_median_abs(m_rows, calib, 1),
    )


def _median_abs(runs: list[Run], calib: Calibration, which: int) -> float:
    if not runs:
        return float("nan")
    errs = []
    for r in runs:
        pred = _predict(r, calib)[which]
        meas = r.measured if which == 0 else r.measured_memory_gib
        if pred and meas:
            errs.append(abs(pred / meas - 1))
    return float(np.median(errs)) if errs else float("nan")


def source_group(run: Run) -> str:
    """Coarse source: the citation's first word (Narayanan2021, Korthikanti2022, BLOOM, ...)."""
    return (run.source.split() or ["?"])[0]


def leave_one_source_out(runs: list[Run], family: str, settings: Mapping[str, Any],
                         rounds: int = 1) -> dict[str, tuple[int, float]]:
    """For each source: (held-out throughput rows, their median abs error when fitted without)."""
    rows = [r for r in runs if gpu_family(r.cluster.gpu) == family and r.metric and r.measured]
    out = {}
    for group in sorted({source_group(r) for r in rows}):
        train = [r for r in rows if source_group(r) != group]
        test = [r for r in rows if source_group(r) == group]
        if not train:
            continue
        res = fit_family(train, family, settings, rounds=rounds, memory_grid={})
        calib = Calibration().replace_fields(**settings, **res.values)
        out[group] = (len(test), _median_abs(test, calib, 0))
    return out
