"""Plans on a real collective library: lowering to torch.distributed, local execution,
calibration.  Only :mod:`.interpreter`, :mod:`.launch` (at run time) and
:mod:`.calibrate` need torch; lowering is pure."""

from .lower import lower_reduction, lower_resharding
from .plan import Call, DistributedPlan, PlanStep

__all__ = ["Call", "DistributedPlan", "PlanStep", "lower_reduction", "lower_resharding"]
