"""Where placing experts by their load or replicating hot ones pays: the plan re-estimated under
each placement choice (cost/expert_load.py), for the estimate's breakdown."""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.cost.calibration import Calibration
from meshplan.cost.step import estimate
from meshplan.plan import ExpertPlacement, Plan
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.expert_load import zipf_load
from meshplan.spec.model import ModelSpec
from meshplan.spec.training import TrainingSpec

MAX_REPLICAS_SHOWN = 2
"""Replica slots per rank the breakdown tries (FlexMoE's gains come from the first few copies of
the hottest experts, Nie et al. 2023 Sec. 6)."""


@dataclass(frozen=True)
class PlacementOption:
    placement: ExpertPlacement
    replicas: int
    load_factor: float
    dropped_fraction: float
    step_time_s: float
    peak_memory_gib: float
    fits: bool


def placement_options(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan,
                      calib: Calibration | None = None) -> tuple[PlacementOption, ...]:
    """The plan under contiguous, balanced and balanced + 1..MAX_REPLICAS_SHOWN replica slots
    (as many as the ranks' experts allow); empty without an expert load or expert parallelism."""
    ep = plan.dims.ep
    if training.expert_load is None or not model.is_moe or ep == 1:
        return ()
    choices = [(ExpertPlacement.CONTIGUOUS, 0)] + [
        (ExpertPlacement.BALANCED, r) for r in range(min(MAX_REPLICAS_SHOWN, model.moe_num_experts // ep) + 1)]
    out = []
    for placement, replicas in choices:
        est = estimate(model, cluster, training, replace(plan, expert_placement=placement, expert_replicas=replicas),
                       calib)
        out.append(PlacementOption(placement=placement, replicas=replicas, load_factor=est.expert_load.load_factor,
                                   dropped_fraction=est.expert_load.dropped_fraction, step_time_s=est.step_time_s,
                                   peak_memory_gib=est.peak_memory_gib, fits=est.fits))
    return tuple(out)


def uniform_step_time_s(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, plan: Plan,
                        calib: Calibration | None = None) -> float:
    """The plan's step time were the router to spread tokens evenly (the load's cost is the gap)."""
    return estimate(model, cluster, replace(training, expert_load=zipf_load(0.0)), plan, calib).step_time_s
