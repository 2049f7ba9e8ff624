"""Parallelism placements (P² §3.1): matrices, device assignment, solver and enumeration."""

from .cpsat import cpsat_matrices, log_objective
from .enumerate import enumerate_matrices
from .matrix import ParallelismMatrix, PlacementRule
from .search import AUTO_THRESHOLD, find_placements, resolve_rules, traffic_weights

__all__ = [
    "ParallelismMatrix", "PlacementRule", "enumerate_matrices", "cpsat_matrices", "log_objective",
    "find_placements", "resolve_rules", "traffic_weights", "AUTO_THRESHOLD",
]
