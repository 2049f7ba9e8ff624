"""solver_planner: plans how a deep-learning job is spread over a GPU cluster, and proves its plans.

The data flows one way (DESIGN.md): spec -> topology/workload -> problem -> solver ->
solution -> check (simulation with the shared cost model) -> report.
"""

from .cost import Collective, CostModel
from .errors import InfeasibleError, PlannerError, SpecError
from .spec import load_cluster_spec, load_model_spec
from .topology import Topology, load_topology

__version__ = "0.1.0"

__all__ = [
    "Collective", "CostModel", "InfeasibleError", "PlannerError", "SpecError",
    "load_cluster_spec", "load_model_spec", "Topology", "load_topology", "__version__",
]
