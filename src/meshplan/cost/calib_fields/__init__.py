"""The fields of :class:`meshplan.cost.calibration.Calibration`, one frozen dataclass per group.

``Calibration`` inherits every group; each field is documented here, with its source, where its
group's formulas live. The range checks, ``STACK_FIELDS`` and ``calibration_for`` stay in
cost/calibration.py.
"""

from meshplan.cost.calib_fields.comm import CommFields
from meshplan.cost.calib_fields.compute import ComputeFields
from meshplan.cost.calib_fields.long_context import LongContextFields
from meshplan.cost.calib_fields.mechanisms import MechanismFields
from meshplan.cost.calib_fields.memory import MemoryFields
from meshplan.cost.calib_fields.moe import MoEFields
from meshplan.cost.calib_fields.precision import PrecisionFields

__all__ = ["CommFields", "ComputeFields", "LongContextFields", "MechanismFields", "MemoryFields", "MoEFields",
           "PrecisionFields"]
