"""CP-SAT model of the partition for one mesh shape and micro-batch count.

One Boolean per (stage p, first layer k, last layer i, tensor degree t) that fits in
memory; each stage picks one; stage p+1 starts where stage p ends (contiguity); stage 0
starts at layer 0 and the last stage ends at the last layer.  Objective, in integer
nanoseconds: ``sum_p cost_p + (B - 1) M`` with ``M >= t_p`` for every stage (seed 003).
"""

from __future__ import annotations

import math

import numpy as np
from ortools.sat.python import cp_model

from ..solve import Status
from .partition import PartitionProblem, StagePlan

__all__ = ["solve_cpsat", "TIME_UNIT"]

TIME_UNIT = 1e-9


def solve_cpsat(problem: PartitionProblem, time_limit: float = 10.0, seed: int = 0,
                hint: list[StagePlan] | None = None) -> tuple[Status, list[StagePlan] | None, float]:
    """(status, stages, bound in seconds) of the CP-SAT model."""
    time, cost, ok = problem._stacked
    S, L, degs = problem.S, problem.L, problem.degrees
    m = cp_model.CpModel()
    x: dict[tuple[int, int, int, int], cp_model.IntVar] = {}
    for p in range(S):
        for j, k, i in zip(*np.nonzero(ok[p])):
            x[p, int(k), int(i), int(j)] = m.new_bool_var(f"x{p}_{k}_{i}_{j}")
    if not x:
        return Status.INFEASIBLE, None, math.inf
    by_stage: dict[int, list] = {p: [] for p in range(S)}
    ends: dict[tuple[int, int], list] = {}
    starts: dict[tuple[int, int], list] = {}
    for (p, k, i, j), v in x.items():
        by_stage[p].append(v)
        ends.setdefault((p, i), []).append(v)
        starts.setdefault((p, k), []).append(v)
    for p in range(S):
        if not by_stage[p]:
            return Status.INFEASIBLE, None, math.inf
        m.add_exactly_one(by_stage[p])
    for p in range(S - 1):
        for b in range(L):
            m.add(sum(ends.get((p, b - 1), [])) == sum(starts.get((p + 1, b), [])))
    ns = lambda s: int(round(s / TIME_UNIT))
    top = max(max(ns(float(tp[op].max())) for tp, op in zip(time, ok) if op.any()), 1)
    mx = m.new_int_var(0, top, "max_stage_time")
    for p in range(S):
        m.add(mx >= sum(ns(float(time[p][j, k, i])) * v for (q, k, i, j), v in x.items() if q == p))
    B = problem.costs.microbatches
    m.minimize(sum(ns(float(cost[p][j, k, i])) * v for (p, k, i, j), v in x.items()) + (B - 1) * mx)
    if hint:
        index = {t: j for j, t in enumerate(degs)}
        chosen = {(p, s.first, s.last, index[s.tensor]) for p, s in enumerate(hint)}
        for key, v in x.items():
            m.add_hint(v, key in chosen)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    code = solver.solve(m)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        status = Status.INFEASIBLE if code == cp_model.INFEASIBLE else Status.UNKNOWN
        return status, None, math.inf
    stages = [None] * S
    for (p, k, i, j), v in x.items():
        if solver.value(v):
            stages[p] = StagePlan(k, i, degs[j])
    status = Status.OPTIMAL if code == cp_model.OPTIMAL else Status.FEASIBLE
    return status, stages, solver.best_objective_bound * TIME_UNIT
