"""A plan's memory as the figures a run reports, and the headroom the model's memory error asks.

Issue 14 ("memory, two numbers") asks every memory answer to say both the peak a run's tensors
reach (``torch.cuda.max_memory_allocated``) and the peak the caching allocator holds
(``max_memory_reserved``, what torchtitan logs); the GPU holds the reserved peak plus what lies
outside the allocator (the CUDA context, NCCL's buffers: nvidia-smi's figure). Which of them a
plan must fit is cost/device_memory.py's one definition (``fit``: the held peak, reserved or,
under expandable segments, allocated, plus what lies outside the allocator); the search ranks
plans on that same figure.

A plan that fits on the model's figure can still run out of memory when the model is optimistic
for it. Issue 15 item 3: the headroom a recommendation keeps grows with the memory error
`meshplan validate` observes on published runs of its class (``ModelError.memory_abs_p90``,
bench/model_error.py): a plan keeps that headroom when ``fit x (1 + p90) <= budget``
(search/robust.py ``keeps_headroom``, the test the recommendation prefers plans by). The p90 of |error| bounds
the p90 of the optimistic error from above, so the test is on the safe side of what the data
says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meshplan.cost.calib_records import gpu_family
from meshplan.cost.step import Estimate, estimate
from meshplan.search.robust import ModelError, keeps_headroom, model_error

if TYPE_CHECKING:
    from meshplan.cost.calibration import Calibration
    from meshplan.plan import Plan
    from meshplan.spec.cluster import ClusterSpec
    from meshplan.spec.model import ModelSpec
    from meshplan.spec.training import TrainingSpec


@dataclass(frozen=True)
class MemoryMargin:
    """One plan's memory figures (GiB per GPU, its most loaded rank) against a budget."""

    allocated_gib: float
    """Peak allocated (``torch.cuda.max_memory_allocated``)."""
    reserved_gib: float
    """Peak reserved (``torch.cuda.max_memory_reserved``): allocated + the allocator's reserve."""
    device_gib: float
    """Reserved + the CUDA context and NCCL's buffers (nvidia-smi)."""
    fit_gib: float
    """What must fit the budget (cost.device_memory.fit_bytes; the search's frontier figure)."""
    budget_gib: float
    memory_error: float
    """The p90 |memory error| of the job's class (the headroom asked, a fraction)."""
    error_class: str
    """The class of published runs it was measured on (search/robust.py ``class_keys``)."""

    @property
    def fits(self) -> bool:
        return self.fit_gib <= self.budget_gib

    @property
    def with_headroom_gib(self) -> float:
        """The fit figure grown by the observed memory error."""
        return self.fit_gib * (1.0 + self.memory_error)

    @property
    def keeps_headroom(self) -> bool:
        return keeps_headroom(self.fit_gib, self.budget_gib, self.memory_error)

    def to_dict(self) -> dict[str, Any]:
        return {"peak_allocated_gib": self.allocated_gib, "peak_reserved_gib": self.reserved_gib,
                "peak_device_gib": self.device_gib, "fit_memory_gib": self.fit_gib,
                "budget_gib": self.budget_gib, "fits": self.fits,
                "memory_error_p90": self.memory_error, "memory_error_class": self.error_class,
                "fit_with_headroom_gib": self.with_headroom_gib, "keeps_headroom": self.keeps_headroom}

    def text(self) -> str:
        """One line: the figures and whether the plan keeps the headroom."""
        verdict = ("keeps" if self.keeps_headroom else "does NOT keep") + " that headroom"
        return (f"memory per GPU: allocated {self.allocated_gib:.1f}, reserved {self.reserved_gib:.1f}, "
                f"on the device {self.device_gib:.1f} GiB; must fit {self.fit_gib:.1f} of {self.budget_gib:.1f} "
                f"GiB; with the {self.memory_error:.1%} p90 memory error of published runs "
                f"(class {self.error_class}) {self.with_headroom_gib:.1f} GiB: it {verdict}")


def memory_margin(est: Estimate, budget_gib: float, err: ModelError) -> MemoryMargin:
    """The margin of an estimated plan against ``budget_gib`` under the memory error ``err``."""
    return MemoryMargin(allocated_gib=est.peak_allocated_gib, reserved_gib=est.peak_memory_gib,
                        device_gib=est.peak_device_gib, fit_gib=est.fit_memory_gib, budget_gib=budget_gib,
                        memory_error=err.memory_abs_p90, error_class=err.memory_class)


def job_memory_error(model: "ModelSpec", training: "TrainingSpec", cluster: "ClusterSpec") -> ModelError:
    """The observed error record of the job's class (search/robust.py ``model_error``)."""
    return model_error(model.is_moe, training.precision.value, gpu_family(cluster.gpu))


def plan_margin(model: "ModelSpec", cluster: "ClusterSpec", training: "TrainingSpec", plan: "Plan",
                calib: "Calibration", budget_gib: float) -> MemoryMargin:
    """Estimate ``plan`` and give its margin against ``budget_gib`` (``plan``'s recommendation,
    ``estimate``)."""
    est = estimate(model, cluster, training, plan, calib)
    return memory_margin(est, budget_gib, job_memory_error(model, training, cluster))
