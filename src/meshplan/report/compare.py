"""Where a given plan (yours: imported or hand-tuned) stands against a frontier of plans.

Both sides come from the same cost model, so the comparison is like for like: "yours: 312
tok/s/GPU, 71 GiB; best that fits: 401 tok/s/GPU (+28%), 64 GiB".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, Sequence

from meshplan.plan import Plan
from meshplan.report.attribution import Attribution, attribute

if TYPE_CHECKING:
    from meshplan.calib.hardware import Hardware
    from meshplan.plan import Job
    from meshplan.spec.model import ModelSpec
    from meshplan.spec.training import TrainingSpec


class CostPoint(Protocol):
    """What the comparison reads: ``Estimate`` and the search's ``ScoredPlan`` both provide it."""

    plan: Plan
    step_time_s: float
    tokens_per_s_per_gpu: float

    @property
    def peak_memory_gib(self) -> float: ...

    @property
    def fit_memory_gib(self) -> float:
        """The device peak "fits" compares with the budget (cost.device_memory.fit_bytes)."""
        ...


@dataclass(frozen=True)
class Comparison:
    yours: CostPoint
    budget_gib: float
    best: CostPoint | None
    """Fastest frontier plan within the budget (None when nothing fits)."""
    leanest_as_fast: CostPoint | None
    """Least memory among frontier plans at least as fast as yours."""
    attribution: Attribution | None = None
    """Yours against ``target``, term by term (when both were estimated)."""
    recommended: CostPoint | None = None
    """The plan `plan` recommends (robust to the model's error, meshplan.search.robust); None:
    the fastest that fits stands for it."""
    band: float | None = None
    """The model's measured error on the ratio of yours and the target (fraction; ModelError.band:
    the pairwise error of the knobs they differ in, the absolute error where no pair measures one)."""
    band_basis: str = ""
    """What ``band`` rests on, in words."""

    @property
    def target(self) -> CostPoint | None:
        """The plan yours is measured against: the recommended one, else the fastest that fits."""
        return self.recommended if self.recommended is not None else self.best

    @property
    def yours_fits(self) -> bool:
        return self.yours.fit_memory_gib <= self.budget_gib

    @property
    def speedup(self) -> float | None:
        """target / yours - 1 in tokens per second per GPU (0.28 means 28% faster)."""
        if self.target is None or self.yours.tokens_per_s_per_gpu <= 0:
            return None
        return self.target.tokens_per_s_per_gpu / self.yours.tokens_per_s_per_gpu - 1.0

    @property
    def memory_saving_gib(self) -> float | None:
        if self.leanest_as_fast is None:
            return None
        return self.yours.fit_memory_gib - self.leanest_as_fast.fit_memory_gib

    def summary(self) -> str:
        y = self.yours
        text = f"yours: {y.tokens_per_s_per_gpu:,.0f} tok/s/GPU, {y.fit_memory_gib:.0f} GiB"
        if not self.yours_fits:
            text += f" (over the {self.budget_gib:.0f} GiB budget)"
        if self.best is None:
            return text + f"; no frontier plan fits {self.budget_gib:.0f} GiB"
        b, r = self.best, self.target
        if b.tokens_per_s_per_gpu <= y.tokens_per_s_per_gpu * (1 + 1e-9) and self.yours_fits:
            text += "; yours is on the frontier (no plan that fits is faster)"
            lean = self.leanest_as_fast
            if lean is not None and self.memory_saving_gib and self.memory_saving_gib > 0.5:
                text += f"; as fast with {lean.fit_memory_gib:.0f} GiB: {lean.plan.notation()}"
            return text
        if r is not b and r.plan.notation() == y.plan.notation() and self.yours_fits:
            # yours is the plan the search recommends: the faster ones lie within the model's error
            return text + (f"; yours is the recommended plan (the nominally fastest that fits, "
                           f"{b.tokens_per_s_per_gpu:,.0f} tok/s/GPU: {b.plan.notation()}, is within the "
                           "model's error)")
        label = "recommended" if self.recommended is not None else "best that fits"
        text += (f"; {label}: {r.tokens_per_s_per_gpu:,.0f} tok/s/GPU "
                 f"({self.speedup:+.0%}), {r.fit_memory_gib:.0f} GiB: {r.plan.notation()}")
        if self.attribution is not None:
            gap = self.attribution.gap_s
            text += (f"; it gains on {self.attribution.explain()}" if gap < 0
                     else f"; yours gains on {self.attribution.reversed().explain()}")
        if self.band is not None and self.speedup is not None and self.speedup > 0:
            within = self.speedup <= self.band
            text += (f"; the gain is {'within' if within else 'beyond'} the model's error on the ratio of two "
                     f"layouts ({self.band:.1%}: {self.band_basis})"
                     + ("; by the data the two plans tie" if within else ""))
        if r is not b:
            text += (f" (the nominally fastest that fits, {b.tokens_per_s_per_gpu:,.0f} tok/s/GPU: "
                     f"{b.plan.notation()}, is within the model's error)")
        return text

    def to_dict(self) -> dict[str, object]:
        def point(p: CostPoint | None) -> dict[str, object] | None:
            if p is None:
                return None
            return {"plan": p.plan.notation(), "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
                    "step_time_s": p.step_time_s, "peak_memory_gib": p.peak_memory_gib}

        return {"yours": point(self.yours), "yours_fits": self.yours_fits, "budget_gib": self.budget_gib,
                "best_that_fits": point(self.best), "recommended": point(self.target), "speedup": self.speedup,
                "leanest_as_fast": point(self.leanest_as_fast), "memory_saving_gib": self.memory_saving_gib,
                "attribution": self.attribution.to_dict() if self.attribution else None,
                "band": self.band, "band_basis": self.band_basis,
                "summary": self.summary()}


def compare(yours: CostPoint, frontier: Sequence[CostPoint], budget_gib: float,
            recommended: int | None = None) -> Comparison:
    """Compare ``yours`` with the frontier points under a memory budget per GPU (GiB), and with
    frontier point ``recommended`` (the robust recommendation) when given."""
    fitting = [p for p in frontier if p.fit_memory_gib <= budget_gib]
    best = max(fitting, key=lambda p: p.tokens_per_s_per_gpu, default=None)
    as_fast = [p for p in frontier if p.tokens_per_s_per_gpu >= yours.tokens_per_s_per_gpu * (1 - 1e-9)]
    leanest = min(as_fast, key=lambda p: p.fit_memory_gib, default=None)
    return Comparison(yours=yours, budget_gib=budget_gib, best=best, leanest_as_fast=leanest,
                      recommended=None if recommended is None else frontier[recommended])


def compare_job(job: "Job", frontier: Sequence[CostPoint], budget_gib: float, *, model: "ModelSpec",
                training: "TrainingSpec", num_gpus: int, hardware: "Hardware | None" = None,
                recommended: int | None = None) -> Comparison:
    """Estimate ``job``'s plan with the cost model (on ``hardware``, the frontier's resolved
    cluster and calibration; default: the job's cluster as saved) and compare it with a frontier
    searched for ``model``, ``training`` and ``num_gpus`` (and its point ``recommended``, the plan
    `plan` recommends); refuses a job for something else."""
    from meshplan.cost import estimate
    from meshplan.errors import MeshplanError

    if job.model.num_params() != model.num_params() or job.model.num_layers != model.num_layers:
        raise MeshplanError(f"the plan file is for model {job.model.name!r}, the frontier for {model.name!r}")
    if (job.training.seq_len, job.training.global_batch) != (training.seq_len, training.global_batch):
        raise MeshplanError(
            f"the plan file trains seq {job.training.seq_len} x batch {job.training.global_batch}, the "
            f"frontier seq {training.seq_len} x batch {training.global_batch}")
    if job.cluster.num_gpus != num_gpus:
        raise MeshplanError(f"the plan file uses {job.cluster.num_gpus} GPUs, the frontier {num_gpus}")
    cluster, calib = (job.cluster, None) if hardware is None else (hardware.cluster, hardware.calib)
    yours = estimate(job.model, cluster, job.training, job.plan, calib)
    result = compare(yours, frontier, budget_gib, recommended)
    if result.target is None:
        return result
    theirs = estimate(model, cluster, training, result.target.plan, calib)
    return replace(result, attribution=attribute(yours, theirs))
