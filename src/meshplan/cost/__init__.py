"""The cost model: what a parallel plan costs in time and memory, as breakdowns.

``estimate(model, cluster, training, plan)`` for one plan; ``estimate_batch`` with
``PlanArrays`` for many (see :mod:`meshplan.cost.batch`). Factors live in
:class:`~meshplan.cost.calibration.Calibration`.
"""

from meshplan.cost.arrays import PlanArrays
from meshplan.cost.batch import BatchEstimate, estimate_batch
from meshplan.cost.calibration import Calibration, calibration_for
from meshplan.cost.step import Estimate, MemoryBreakdown, StageCost, TimeBreakdown, estimate

__all__ = [
    "BatchEstimate", "Calibration", "Estimate", "MemoryBreakdown", "PlanArrays", "StageCost",
    "TimeBreakdown", "calibration_for", "estimate", "estimate_batch",
]
