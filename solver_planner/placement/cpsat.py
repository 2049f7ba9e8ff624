"""The CP-SAT model of parallelism matrices (P² §3.1, Eq. 1-2) over prime exponents.

Every entry is a product of primes of the axis sizes and level counts, so the model's
variables are ``e[i][j][q]``, the exponent of prime ``q`` in ``x[i][j]``.  Eq. 1 (columns
multiply to the level counts) and Eq. 2 (rows multiply to the axis sizes) become linear:
for every prime, exponents sum to the exponent in the level count (per column) and in the
axis size (per row).  A product objective ``sum w[i][j] * log x[i][j]`` becomes linear too.
"""

from __future__ import annotations

import math
from typing import Sequence

from ..solve import SolveResult, Status, Stopwatch
from .matrix import ParallelismMatrix, PlacementRule

__all__ = ["cpsat_matrices", "prime_exponents", "model_size"]

SCALE = 1_000_000  # CP-SAT objectives are integers: weights are scaled and rounded


def prime_exponents(n: int) -> dict[int, int]:
    out: dict[int, int] = {}
    q = 2
    while q * q <= n:
        while n % q == 0:
            out[q] = out.get(q, 0) + 1
            n //= q
        q += 1
    if n > 1:
        out[n] = out.get(n, 0) + 1
    return out


def _primes(axis_sizes: Sequence[int], level_counts: Sequence[int]) -> list[int]:
    return sorted({q for n in list(axis_sizes) + list(level_counts) for q in prime_exponents(n)})


def model_size(axis_sizes: Sequence[int], level_counts: Sequence[int]) -> int:
    """Number of exponent variables: what ``method='auto'`` compares with its threshold."""
    return len(axis_sizes) * len(level_counts) * max(1, len(_primes(axis_sizes, level_counts)))


def _build(axis_sizes, level_counts, rules):
    from ortools.sat.python import cp_model

    primes = _primes(axis_sizes, level_counts)
    m = cp_model.CpModel()
    e = {}
    for i, p in enumerate(axis_sizes):
        for j, h in enumerate(level_counts):
            for q in primes:
                ub = min(prime_exponents(p).get(q, 0), prime_exponents(h).get(q, 0))
                e[i, j, q] = m.new_int_var(0, ub, f"e_{i}_{j}_{q}")
    for q in primes:
        for j, h in enumerate(level_counts):  # Eq. 1
            m.add(sum(e[i, j, q] for i in range(len(axis_sizes))) == prime_exponents(h).get(q, 0))
        for i, p in enumerate(axis_sizes):  # Eq. 2
            m.add(sum(e[i, j, q] for j in range(len(level_counts))) == prime_exponents(p).get(q, 0))
    feasible = True
    for rule in rules:
        for i, j, v in rule.fixed_entries():
            exps = prime_exponents(v)
            if any(q not in primes for q in exps):
                feasible = False
            for q in primes:
                m.add(e[i, j, q] == exps.get(q, 0))
    return m, e, primes, feasible


def _matrix(value, e, primes, n_axes, n_levels) -> ParallelismMatrix:
    return ParallelismMatrix(tuple(
        tuple(math.prod(q ** value(e[i, j, q]) for q in primes) for j in range(n_levels)) for i in range(n_axes)
    ))


def cpsat_matrices(axis_sizes: Sequence[int], level_counts: Sequence[int], rules: Sequence[PlacementRule] = (),
                   weights: Sequence[Sequence[float]] | None = None, time_limit: float = 30.0,
                   enumerate_all: bool = True, limit: int | None = None) -> SolveResult[ParallelismMatrix]:
    """All matrices (``result.solutions``) and, with ``weights``, the one minimising
    ``sum w[i][j] log x[i][j]`` (``result.solution``), with its bound and gap."""
    from ortools.sat.python import cp_model

    n_axes, n_levels = len(axis_sizes), len(level_counts)
    with Stopwatch() as sw:
        solutions: list[ParallelismMatrix] = []
        status = Status.UNKNOWN
        m, e, primes, feasible = _build(axis_sizes, level_counts, rules)
        if not feasible:
            return SolveResult(Status.INFEASIBLE, "cp-sat", info={"reason": "a fixed entry has a prime no size has"})
        if enumerate_all:
            class Collect(cp_model.CpSolverSolutionCallback):
                def on_solution_callback(self) -> None:
                    solutions.append(_matrix(self.value, e, primes, n_axes, n_levels))
                    if limit is not None and len(solutions) >= limit:
                        self.StopSearch()           # the caller refuses more (a memory bound)

            solver = cp_model.CpSolver()
            solver.parameters.enumerate_all_solutions = True
            solver.parameters.num_workers = 1
            solver.parameters.random_seed = 0
            # deterministic limit (the answer must not depend on machine load); wall clock only
            # as a safety net
            solver.parameters.max_deterministic_time = time_limit
            solver.parameters.max_time_in_seconds = 10 * time_limit + 10
            code = solver.solve(m, Collect())
            solutions.sort(key=lambda x: x.rows)
            status = {cp_model.OPTIMAL: Status.FEASIBLE, cp_model.FEASIBLE: Status.FEASIBLE,
                      cp_model.INFEASIBLE: Status.INFEASIBLE}.get(code, Status.UNKNOWN)
            complete = code in (cp_model.OPTIMAL, cp_model.INFEASIBLE)
        else:
            complete = False
        best = objective = bound = None
        if weights is not None and status is not Status.INFEASIBLE:
            coeff = {(i, j, q): round(weights[i][j] * math.log(q) * SCALE) for (i, j, q) in e}
            m.minimize(sum(c * e[k] for k, c in coeff.items()))
            solver = cp_model.CpSolver()
            solver.parameters.num_workers = 1
            solver.parameters.random_seed = 0
            solver.parameters.max_deterministic_time = time_limit
            solver.parameters.max_time_in_seconds = 10 * time_limit + 10
            code = solver.solve(m)
            if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                best = _matrix(solver.value, e, primes, n_axes, n_levels)
                objective = log_objective(best, weights)
                bound = objective if code == cp_model.OPTIMAL else solver.best_objective_bound / SCALE
                status = Status.OPTIMAL if code == cp_model.OPTIMAL else Status.FEASIBLE
            elif code == cp_model.INFEASIBLE:
                status = Status.INFEASIBLE
        elif solutions:
            best = solutions[0]
    return SolveResult(status, "cp-sat", best, objective, bound, sw.seconds, solutions,
                       {"complete": complete, "variables": len(e)})


def log_objective(matrix: ParallelismMatrix, weights: Sequence[Sequence[float]]) -> float:
    """``sum w[i][j] * log x[i][j]``: the placement proxy objective, evaluated exactly."""
    return sum(w * math.log(v) for row_w, row in zip(weights, matrix.rows) for w, v in zip(row_w, row))
