"""What a calibration fit (calib/fit.py) minimises: the rows predicted under a calibration, grouped
so that rows sharing an estimate's inputs take one batched estimate (``prepare``, ``predict_all``),
each row under its own framework settings (``ROW_SETTINGS``), and the time and memory losses over
them. Nothing here chooses values; fit.py searches them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from meshplan.calib.fit_search import Objective
from meshplan.calib.validate import Run, predicted_metric
from meshplan.cost.arrays import PlanArrays
from meshplan.cost.batch import estimate_batch
from meshplan.cost.split_batch import estimate_split_batch
from meshplan.cost.device_memory import predicted_bytes
from meshplan.cost.calibration import Calibration
from meshplan.spec.cluster import GIB


MEMORY_SETTINGS = ("cuda_context_gib", "comm_bucket_bytes", "fp16_step_grad_copy_bytes_per_param",
                   "fp16_zero_step_grad_copy_bytes_per_param", "sp_saves_gathered_inputs",
                   "loss_parallel_transient_bytes_per_element")
"""Framework settings that change a run's memory alone (what a stack holds beside the model's
tensors, cost/device_memory.py, cost/step_memory.py): rows fitted together may differ in them,
and each row is estimated under its own."""


ROW_SETTINGS = MEMORY_SETTINGS + ("tp_backward_async",)
"""Framework settings rows fitted together may differ in, each row estimated under its own: the
memory ones, and whether a release of the stack issues the backward's TP collectives
asynchronously (Megatron-LM 2022 does, 2020-21 and Megatron-DeepSpeed do not: cost/tp_backward.py)."""


def row_settings(run: Run) -> tuple[tuple[str, Any], ...]:
    """The row's framework settings among ``ROW_SETTINGS``."""
    return tuple(sorted((k, v) for k, v in run.settings.items() if k in ROW_SETTINGS))


def own_split(run: Run) -> bool:
    """Whether the row ran a split of its own (a recipe's layout, calib/layouts.py), which the
    even-split batch estimate would not see: such rows are scored rank by rank."""
    return run.plan.uneven_split or run.plan.mtp_stage is not None


def _batch(run: Run, plans: list, arrays: PlanArrays, calib: Calibration):
    """One group's estimate: even split in one pass, or every rank of each plan's own split."""
    if own_split(run):
        return estimate_split_batch(run.model, run.cluster, run.training, plans, calib)
    return estimate_batch(run.model, run.cluster, run.training, arrays, calib)


def row_calibration(run: Run, calib: Calibration) -> Calibration:
    """``calib`` with what is the row's own over the fit: its memory settings and what its stack
    release sets (``Run.release_values``: CUDA graphs, fused experts); fitted values stay."""
    changes = {**dict(row_settings(run)), **run.release_values}
    return calib.replace_fields(**changes) if changes else calib


@dataclass(frozen=True)
class Prepared:
    """Runs grouped by (model, cluster, training, memory settings, the stack release's values):
    one batched estimate per group, and each run's metric as ``scale / step_time`` (throughput)
    or the step time itself."""

    runs: tuple[Run, ...]
    groups: tuple[tuple[Run, PlanArrays, tuple[int, ...]], ...]
    """Runs of a group share their estimate's inputs; those with a split of their own
    (:func:`own_split`) are grouped by ``pp`` apart from the even ones."""
    scale: np.ndarray
    """predicted metric = scale / step_time (0: the row has no throughput metric)."""
    is_step_time: np.ndarray


def prepare(runs: list[Run]) -> Prepared:
    by_key: dict[tuple, list[int]] = {}
    for i, r in enumerate(runs):
        split = r.plan.dims.pp if own_split(r) else 0
        by_key.setdefault((r.model, r.cluster, r.training, row_settings(r),
                           tuple(sorted(r.release_values.items())), split), []).append(i)
    groups = tuple((runs[ix[0]], PlanArrays.from_plans([runs[i].plan for i in ix]), tuple(ix))
                   for ix in by_key.values())
    scale = np.array([(predicted_metric(r, 1.0) or 0.0) if r.metric != "step_time_s" else 1.0
                      for r in runs])
    return Prepared(runs=tuple(runs), groups=groups, scale=scale,
                    is_step_time=np.array([r.metric == "step_time_s" for r in runs]))


def _predict_group(prep: Prepared, g: int, calib: Calibration,
                   memory: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """(throughput metric, peak memory GiB or None without ``memory``) of group ``g``'s rows."""
    run, arrays, ix = prep.groups[g]
    group_calib = row_calibration(run, calib)
    b = _batch(run, [prep.runs[i].plan for i in ix], arrays, group_calib)
    step = np.asarray(b.step_time_s, dtype=float)
    rows = list(ix)
    metric = np.where(prep.is_step_time[rows], step, prep.scale[rows] / step)
    if not memory:
        return metric, None
    # each row's memory on the basis it was measured on (cost/device_memory.py)
    mem = np.array([predicted_bytes(prep.runs[i].memory_basis, allocated_bytes=b.peak_allocated_bytes,
                                    reserved_bytes=b.peak_memory_bytes, plans=arrays, calib=group_calib)[j] / GIB
                    for j, i in enumerate(ix)])
    return metric, mem


def predict_all(prep: Prepared, calib: Calibration) -> tuple[np.ndarray, np.ndarray]:
    """(throughput metric, peak memory GiB) of every run under ``calib``."""
    metric = np.empty(len(prep.runs))
    mem = np.empty(len(prep.runs))
    for g, (_, _, ix) in enumerate(prep.groups):
        metric[list(ix)], mem[list(ix)] = _predict_group(prep, g, calib)
    return metric, mem


def _measured(prep: Prepared) -> tuple[np.ndarray, np.ndarray]:
    t = np.array([r.measured if r.metric and r.measured else np.nan for r in prep.runs])
    m = np.array([r.measured_memory_gib or np.nan for r in prep.runs])
    return t, m


def _prepared(runs: Prepared | list[Run]) -> Prepared:
    return runs if isinstance(runs, Prepared) else prepare(list(runs))


def _time_score(prep: Prepared, pred: np.ndarray, meas: np.ndarray) -> float:
    ok = np.isfinite(meas) & (pred > 0)
    return float(np.mean(np.abs(np.log(pred[ok] / meas[ok])))) if ok.any() else 0.0


def _memory_score(prep: Prepared, pred: np.ndarray, meas: np.ndarray) -> float:
    errs = [abs(p / m - 1) if np.isfinite(m) else max(0.0, r.cluster.gpu.memory_gib / p - 1)
            for r, p, m in zip(prep.runs, pred, meas) if np.isfinite(m) or r.oom]
    return float(np.mean(errs)) if errs else 0.0


def time_loss(prep: Prepared | list[Run], calib: Calibration) -> float:
    """Mean absolute log error of the throughput metric (least absolute deviations)."""
    prep = _prepared(prep)
    return _time_score(prep, predict_all(prep, calib)[0], _measured(prep)[0])


def memory_loss(prep: Prepared | list[Run], calib: Calibration) -> float:
    """Mean relative error of peak memory; a row that ran out of memory only says it needed
    more than the GPU has, so it counts as a one-sided (hinge) error when predicted to fit."""
    prep = _prepared(prep)
    return _memory_score(prep, predict_all(prep, calib)[1], _measured(prep)[1])


def _objective(prep: Prepared, which: int) -> Objective:
    """The time (``which`` 0) or memory (1) loss of ``prep``'s rows, estimated group by group."""
    meas = _measured(prep)[which]
    score = _time_score if which == 0 else _memory_score

    def predict(g: int, calib: Calibration) -> np.ndarray:
        return _predict_group(prep, g, calib, memory=which == 1)[which]

    return Objective(rows=tuple(ix for _, _, ix in prep.groups), predict=predict,
                     score=lambda pred: score(prep, pred, meas), size=len(prep.runs))


def median_abs(prep: Prepared, calib: Calibration, which: int) -> float:
    if not prep.runs:
        return float("nan")
    pred = predict_all(prep, calib)[which]
    meas = _measured(prep)[which]
    ok = np.isfinite(meas) & (pred > 0)
    return float(np.median(np.abs(pred[ok] / meas[ok] - 1))) if ok.any() else float("nan")
