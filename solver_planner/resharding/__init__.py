"""Cross-mesh resharding (the resharding paper §2.2-§3): meshes and sharding specs, unit tasks,
strategies for one unit task, and per-host load balancing and scheduling."""

from .mesh import Box, DeviceMesh, DimTiling, Layout, ShardingSpec, box_size, format_box
from .plan import (AUTO_EXACT_TASKS, METHODS, ReshardingPlan, Scheduled, baselines, build_instance, check,
                   plan_resharding, replay, report, schedule_instance)
from .schedule import TIME_UNIT, Candidate, Instance, Schedule
from .strategies import Strategy, UnitCost, unit_cost
from .tasks import ReshardingProblem, UnitTask, problems_from_model

__all__ = [
    "Box", "DeviceMesh", "DimTiling", "Layout", "ShardingSpec", "box_size", "format_box",
    "AUTO_EXACT_TASKS", "METHODS", "ReshardingPlan", "Scheduled", "schedule_instance", "baselines", "build_instance", "check", "plan_resharding",
    "replay", "report", "TIME_UNIT", "Candidate", "Instance", "Schedule", "Strategy", "UnitCost", "unit_cost",
    "ReshardingProblem", "UnitTask", "problems_from_model",
]
