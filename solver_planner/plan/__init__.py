"""The end-to-end plan (the resharding paper §5.2-5.3): stages, placements, proven programs, broadcast
schedules and the whole iteration simulated; the plan file and its check."""

from .boundaries import STRATEGIES, Boundary, boundary_problem, solve_boundaries, transfers_of
from .compose import TrainingPlan, breakdown, compose, make_plan, model_flops, simulate_plan
from .parts import StagePart, stage_matrix, stage_parts

__all__ = ["STRATEGIES", "Boundary", "boundary_problem", "solve_boundaries", "transfers_of", "TrainingPlan",
           "breakdown", "compose", "make_plan", "model_flops", "simulate_plan", "StagePart", "stage_matrix",
           "stage_parts"]
