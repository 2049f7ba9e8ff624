"""solver_planner: plans how a deep-learning job is spread over a GPU cluster, and proves its plans.

The data flows one way (DESIGN.md): spec -> topology/workload -> problem -> solver ->
solution -> check (simulation with the shared cost model) -> report.

The Python API is :mod:`solver_planner.api` (``from solver_planner import api as sp``):
``load``, ``place``, ``verify``, ``reshard``, ``stages``, ``plan`` and ``check``.  All but
``plan`` and ``stages`` are also exported here; those two names belong to the subpackages
:mod:`solver_planner.plan` and :mod:`solver_planner.stages`.  The result types these
functions return are exported here too, imported on first use so that ``import
solver_planner`` does not load OR-Tools, z3 or numpy.
"""

import importlib

from . import api, units
from .api import check, load, place, reshard, verify
from .cost import Collective, CostModel
from .errors import InfeasibleError, OptionError, PlannerError, SpecError, UnknownError
from .spec import ClusterSpec, ModelSpec, load_cluster_spec, load_model_spec
from .topology import Topology, load_topology

__version__ = "0.1.0"

# name -> module that defines it; imported when first asked for (PEP 562)
_LAZY = {
    "ParallelismMatrix": "solver_planner.placement",
    "PlacementReport": "solver_planner.reduction.ranking",
    "Verdict": "solver_planner.reduction.verify",
    "ReshardingProblem": "solver_planner.resharding",
    "ReshardingPlan": "solver_planner.resharding",
    "StagesReport": "solver_planner.stages.report",
    "TrainingPlan": "solver_planner.plan.compose",
    "CheckReport": "solver_planner.plan.check",
    "PlanFileError": "solver_planner.plan.planfile",
    "plan_document": "solver_planner.plan.planfile",
    "read_plan": "solver_planner.plan.planfile",
    "write_plan": "solver_planner.plan.planfile",
    "SolveResult": "solver_planner.solve",
    "Status": "solver_planner.solve",
}

__all__ = [
    "Collective", "CostModel", "InfeasibleError", "OptionError", "PlannerError", "SpecError", "UnknownError",
    "ClusterSpec", "ModelSpec", "load_cluster_spec", "load_model_spec", "Topology", "load_topology", "__version__",
    "api", "units", "load", "place", "verify", "reshard", "check", *_LAZY,
]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        hint = f" (the function is solver_planner.api.{name})" if name in ("plan", "stages") else ""
        raise AttributeError(f"module 'solver_planner' has no attribute {name!r}{hint}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
