"""The cost model's error on the RATIO of two layouts of one job (issue 15 items 3 and 5).

Two plans of the same job share most of the model's error: the same model, GPU, stack and
precision, so a bias of the model (a kernel rate, a fitted fixed cost) moves both steps alike and
cannot reorder them. What can reorder them is the error of the model's step ratio, measured where
the published data holds several layouts of one job:

    pair error = log(model step ratio A/B / measured step ratio A/B)

(for each pair of measured layouts of a job; |.| is the error, its sign says which layout the model
favours too much). It is grouped by the plan knobs in which the two layouts differ (``KNOBS``), so
a choice between two plans can be held to the error the data shows for the knobs that separate
them (search/robust.py), not to the error of one absolute step.

Both steps come from validate (``RowResult.predicted_step_s``, and the measured step its metric
stands for), so this measures exactly what ``meshplan validate`` estimates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from meshplan.plan.knobs import KNOB_SET_SEP, KNOBS, knobs_differing

if TYPE_CHECKING:
    from meshplan.calib.validate import RowResult, Run

MEASURED_TIE = 0.05
"""Two layouts whose measured steps differ by less than this (fraction) are a tie: published
tables repeat within a few percent between runs and releases (docs/experts.md, 'Releases'), so
the model cannot be said to order them wrongly."""

BRIDGE_SOURCE = "Megatron-Bridge"


def release(source: str) -> str:
    """What a row was measured on: its container release for a Megatron-Bridge table ("Megatron-Bridge
    26.04.01"), else the publication (the source's first word: "Narayanan2021", "BLOOM", ...).
    Pairs are taken within one release: across releases a regression or a fix of the stack is not
    separated from the layout. A row whose source is blank forms its own release ("")."""
    if source.startswith(BRIDGE_SOURCE):
        return source
    words = source.split()
    return words[0] if words else ""


STEP_METRIC = "step_time_s"


def measured_step_s(row: RowResult) -> float | None:
    """The step time the row's measured metric stands for (throughput metrics scale as 1/step, the
    FLOPs per step being the same on both sides of validate's error)."""
    if row.error is None or row.predicted_step_s is None:
        return None
    if row.metric == STEP_METRIC:
        return row.predicted_step_s / (1.0 + row.error)
    return row.predicted_step_s * (1.0 + row.error)


def job_of(run: Run) -> tuple:
    """What two rows share when they are the same job on the same stack release."""
    return (run.model.name, run.cluster.gpu.name, run.cluster.num_gpus, run.training.seq_len,
            run.training.global_batch, run.training.precision.value, run.stack, release(run.source))


@dataclass(frozen=True)
class Pair:
    """Two measured layouts of one job."""

    a: str
    """Row id of the first layout."""
    b: str
    model_log_ratio: float
    """log(model step a / model step b)."""
    measured_log_ratio: float
    knobs: tuple[str, ...]
    moe: bool

    @property
    def error(self) -> float:
        """|log(model ratio / measured ratio)|."""
        return abs(self.model_log_ratio - self.measured_log_ratio)

    @property
    def misordered(self) -> bool:
        """The measurements separate the layouts by more than ``MEASURED_TIE`` and the model puts
        them the other way round."""
        return (abs(self.measured_log_ratio) > math.log1p(MEASURED_TIE)
                and self.model_log_ratio * self.measured_log_ratio < 0)

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "model_ratio": math.exp(self.model_log_ratio),
                "measured_ratio": math.exp(self.measured_log_ratio), "knobs": list(self.knobs),
                "error": self.error, "misordered": self.misordered}


def measured_groups(runs: Sequence[Run], rows: Sequence[RowResult],
                    key: Callable[[Run], tuple]) -> list[list[tuple[Run, float, float]]]:
    """The runs with a measured step, grouped by ``key``: (run, model step, measured step) each;
    ``rows`` are validate's results for ``runs``, in the same order."""
    groups: dict[tuple, list[tuple[Run, float, float]]] = {}
    for run, row in zip(runs, rows):
        meas = measured_step_s(row)
        if meas is not None and meas > 0 and row.predicted_step_s:
            groups.setdefault(key(run), []).append((run, row.predicted_step_s, meas))
    return list(groups.values())


def pairs(runs: Sequence[Run], rows: Sequence[RowResult]) -> list[Pair]:
    """Every pair of measured rows of one job (``job_of``) with different layouts; ``rows`` are
    validate's results for ``runs``, in the same order."""
    out = []
    for members in measured_groups(runs, rows, job_of):
        for (ra, pa, ma), (rb, pb, mb) in combinations(members, 2):
            knobs = knobs_differing(ra.plan, rb.plan)
            if knobs:
                out.append(Pair(a=ra.row_id, b=rb.row_id, model_log_ratio=math.log(pa / pb),
                                measured_log_ratio=math.log(ma / mb), knobs=knobs, moe=ra.model.is_moe))
    return out


def _stats(group: Sequence[Pair]) -> dict[str, Any]:
    e = np.array([p.error for p in group])
    return {"pairs": len(group), "median_abs_log_error": float(np.median(e)) if e.size else None,
            "p90_abs_log_error": float(np.percentile(e, 90)) if e.size else None,
            "misordered": sum(p.misordered for p in group)}



def summarize(found: Sequence[Pair]) -> dict[str, Any]:
    """Median / p90 of |log(model ratio / measured ratio)| over all pairs, per knob (pairs that
    differ in it, among others), per knob alone (pairs that differ in nothing else), and the errors
    per set of knobs a pair differs in (what search/robust.py pools for two plans)."""
    names = [name for name, _ in KNOBS]
    sets: dict[str, list[float]] = {}
    for p in found:
        sets.setdefault(KNOB_SET_SEP.join(p.knobs), []).append(round(p.error, 6))
    return {
        "all": _stats(found),
        "by_knob": {k: _stats([p for p in found if k in p.knobs]) for k in names},
        "by_knob_alone": {k: _stats([p for p in found if p.knobs == (k,)]) for k in names},
        "by_arch": {arch: _stats([p for p in found if p.moe == (arch == "moe")]) for arch in ("dense", "moe")},
        "by_knob_set": {k: sorted(v) for k, v in sorted(sets.items())},
    }
