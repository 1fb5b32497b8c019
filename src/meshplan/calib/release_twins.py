"""Rows that a twin in another release contradicts (issue 14: the Megatron-Bridge tail).

Megatron-Bridge publishes the same job in the same layout once per container release. Where the
model estimates two such twins alike (its settings for the two releases move the step by less
than ``MODEL_SAME_RUN``) and the two measurements are far apart (the model's ratio misses the
measured one by more than ``TWIN_UNEXPLAINED``), no term of the model can close both rows: one of
the releases regressed or was fixed (26.06.01's table blames cudnn-frontend#256 for its GPT-OSS
fp8 rows), or one table line is misread. Such rows are marked, never dropped: the figures of
``meshplan validate`` stay over every row, and a correction (data/corrections.csv) is made only
where a source says what a run was.

The twin test is the model's own: the same model, GPU, GPU count, sequence, global batch and plan
(layout, micro-batch, recompute, offload) on the same stack, in another release, any precision
(the 25.09 tables print none). It is the cross-release complement of calib/pairwise.py, which
compares layouts within one release.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import combinations
from typing import TYPE_CHECKING, Any, Sequence

from meshplan.calib.pairwise import measured_groups, release

if TYPE_CHECKING:
    from meshplan.calib.validate import Run
    from meshplan.calib.validation_report import ValidationReport

MODEL_SAME_RUN = 0.10
"""The model sees two twins as one run when its steps for them are within this fraction: the
release settings it knows (spec/presets/stack_releases.json: CUDA graphs, fused kernels, the
dispatcher) then explain little of a gap. Releases with such a setting (26.06's full-iteration
CUDA graphs: 0.6x the step) stay out of the test, as their gap is the model's to explain."""

TWIN_UNEXPLAINED = 0.20
"""How far the measured ratio of two twins must be from the model's for a mark: 20%, the
Megatron-Bridge p90 target (issue 14), four times the run-to-run spread of one layout between
releases (calib/pairwise.py MEASURED_TIE, 5%)."""

FLAG_PREFIX = "release twin disagrees"
"""The start of the mark a row carries (``RowResult.flags``)."""


@dataclass(frozen=True)
class TwinDisagreement:
    """Two rows of one job and plan from different releases, measured far apart, estimated alike."""

    a: str
    """Row id of the first twin."""
    b: str
    release_a: str
    release_b: str
    measured_ratio: float
    """Measured step a / measured step b."""
    model_ratio: float
    """The model's step a / step b."""

    def flag_for(self, row_id: str) -> str:
        """The mark on ``row_id`` (one of the two): which twin, and the two ratios seen from it."""
        mine, other = (self.a, self.b) if row_id == self.a else (self.b, self.a)
        rel = self.release_b if mine == self.a else self.release_a
        m, p = (self.measured_ratio, self.model_ratio) if mine == self.a else (
            1.0 / self.measured_ratio, 1.0 / self.model_ratio)
        return (f"{FLAG_PREFIX}: measured step {m:.2f}x that of row {other} ({rel}), the model "
                f"{p:.2f}x: a release regression or a misread table line suspected")

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "release_a": self.release_a, "release_b": self.release_b,
                "measured_ratio": self.measured_ratio, "model_ratio": self.model_ratio}


def twin_key(run: Run) -> tuple:
    """What two rows of different releases share when they ran the same job in the same plan."""
    return (run.model.name, run.cluster.gpu.name, run.cluster.num_gpus, run.training.seq_len,
            run.training.global_batch, run.plan.notation(), run.stack)


def disagreements(runs: Sequence[Run], report: ValidationReport) -> list[TwinDisagreement]:
    """Every pair of twins (``twin_key``, different releases) that the model estimates alike
    (``MODEL_SAME_RUN``) and whose measured ratio is more than ``TWIN_UNEXPLAINED`` from the
    model's; ``report.rows`` are validate's results for ``runs``, in the same order."""
    out = []
    for members in measured_groups(runs, report.rows, twin_key):
        for (ra, pa, ma), (rb, pb, mb) in combinations(members, 2):
            rel_a, rel_b = release(ra.source), release(rb.source)
            if rel_a == rel_b:
                continue
            model_log, meas_log = math.log(pa / pb), math.log(ma / mb)
            if (abs(model_log) < math.log1p(MODEL_SAME_RUN)
                    and abs(meas_log - model_log) > math.log1p(TWIN_UNEXPLAINED)):
                out.append(TwinDisagreement(a=ra.row_id, b=rb.row_id, release_a=rel_a, release_b=rel_b,
                                            measured_ratio=ma / mb, model_ratio=pa / pb))
    return out


def mark_rows(report: ValidationReport, found: Sequence[TwinDisagreement]) -> ValidationReport:
    """The report with each row of a disagreeing pair carrying its mark (``RowResult.flags``);
    rows, errors and figures unchanged."""
    marks: dict[str, list[str]] = {}
    for d in found:
        for rid in (d.a, d.b):
            marks.setdefault(rid, []).append(d.flag_for(rid))
    if not marks:
        return report
    rows = tuple(replace(r, flags=r.flags + tuple(marks[r.row_id])) if r.row_id in marks else r
                 for r in report.rows)
    return replace(report, rows=rows)
