"""Stage partitioning on sub-meshes and pipeline schedules (seed 001 ch. 6, 002 §4, 003, 004)."""

from .costs import SCHEDULES, MeshShape, StageCosts, in_flight, mesh_shapes
from .layers import Layer, LayerModel, layer_model, transformer_layers
from .partition import Partition, PartitionProblem, StagePlan, balanced_greedy, brute_force
from .pipeline import PipelineRun, simulate_pipeline, simulate_schedule, stage_order
from .search import METHODS, StageSearch, plan_partition

__all__ = ["SCHEDULES", "MeshShape", "StageCosts", "in_flight", "mesh_shapes", "Layer", "LayerModel", "layer_model",
           "transformer_layers", "Partition", "PartitionProblem", "StagePlan", "balanced_greedy", "brute_force",
           "PipelineRun", "simulate_pipeline", "simulate_schedule", "stage_order", "METHODS", "StageSearch",
           "plan_partition"]
