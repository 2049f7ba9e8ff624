"""Stage partitioning on sub-meshes and pipeline schedules (Wang's thesis ch. 5-6, the resharding
paper §4, Alpa, DistIR).

The simulated iteration (:mod:`.pipeline`) is what is minimised; :mod:`.objective` gives its
closed-form lower bounds, :mod:`.problem` the dynamic programs over contiguous stages and
:mod:`.search` the branch and bound that ties them together.
"""

from .costs import MeshShape, StageConfig, StageCosts, mesh_shapes
from .layers import Layer, LayerModel, layer_model, transformer_layers
from .memory import MemoryOptions
from .objective import Bounds, bounds
from .partition import Partition, StagePlan
from .pipeline import PipelineRun, simulate_schedule
from .problem import PairProblem, Subspace
from .schedule import SCHEDULES, Schedule, family, stage_order
from ..errors import RefusedError, UnknownError
from .search import METHODS, Candidate, StageSearch, plan_partition

__all__ = ["MeshShape", "StageConfig", "StageCosts", "mesh_shapes", "Layer", "LayerModel", "layer_model",
           "transformer_layers", "MemoryOptions", "Bounds", "bounds", "Partition",
           "StagePlan", "PipelineRun", "simulate_schedule", "PairProblem", "Subspace", "SCHEDULES", "Schedule",
           "family", "stage_order", "METHODS", "Candidate", "RefusedError", "StageSearch", "UnknownError",
           "plan_partition"]
