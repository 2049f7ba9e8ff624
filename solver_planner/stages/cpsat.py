"""CP-SAT model of the relaxation ``R`` on one subspace of a (mesh shape, micro-batch count) pair.

One Boolean per (stage p, configuration, first layer k, last layer i) that fits in memory;
each stage picks one; stage p+1 starts where stage p ends; the subspace's prefix is fixed
and its excluded choices are absent.  Integer nanoseconds: ``A_{p+1} = A_p + INC1_p``,
``H_{p+1} = H_p + INC2_p``, ``M >= T2_p``, ``M >= A_p + T1_p``, ``M >= H_p + T2_p`` (R1 and R2
of :mod:`.problem`; R3 runs backwards with a minimum over warm-up counts and is left to
the dynamic program), minimise ``M``.  Every
coefficient is rounded *down*, so the model's optimum, and the bound CP-SAT proves, are
below the true least ``R``: the bound stays a proven lower bound of the simulated time.
The solution is priced afresh with the exact arrays.
"""

from __future__ import annotations

import math

import numpy as np

from ..solve import Status
from .partition import StagePlan
from .problem import PairProblem, Subspace

__all__ = ["minimize_cpsat", "TIME_UNIT", "model_size"]

TIME_UNIT = 1e-9


def _fill(pair: PairProblem, prefix) -> float:
    """R2's accumulator after the prefix (the fill of the first micro-batch)."""
    return sum(pair._value(p, st)["INC2"] for p, st in enumerate(prefix))


def model_size(pair: PairProblem) -> int:
    """Booleans of the model of the whole pair (the largest subspace)."""
    return sum(int(np.isfinite(pair.stage_arrays(p)[2]).sum()) for p in range(pair.S))


def minimize_cpsat(pair: PairProblem, sub: Subspace, cutoff: float = math.inf, time_limit: float = 10.0,
                   seed: int = 0) -> tuple[Status, float, tuple | None]:
    """(status, lower bound in seconds, plan or None) of min R over the subspace.

    ``time_limit`` is CP-SAT's deterministic time (reproducible; roughly seconds) with one
    worker and a fixed seed.  INFEASIBLE means no plan of the subspace has ``R`` below
    ``cutoff`` (or none fits at all)."""
    A0, M0, start = pair.prefix_state(sub.prefix)
    if not math.isfinite(A0) or M0 >= cutoff:
        return Status.INFEASIBLE, max(M0, sub.bound), None
    S, j0 = pair.S, len(sub.prefix)
    ns = lambda s: int(math.floor(s / TIME_UNIT))       # noqa: E731 - rounding down keeps bounds valid
    from ortools.sat.python import cp_model  # imported here: OR-Tools takes 0.25 s to load

    m = cp_model.CpModel()
    x: dict[tuple[int, int, int, int], cp_model.IntVar] = {}
    excluded = {pair._cell(j0, st) for st in sub.excluded}
    for p in range(j0, S):
        T1, T2, INC = pair.stage_arrays(p)
        firsts = pair.band(p)[0]
        for j, k, i in zip(*np.nonzero(np.isfinite(INC))):
            if p == j0 and (int(j), int(k), int(i)) in excluded:
                continue
            if p == j0 and int(firsts[k]) != start:
                continue
            x[p, int(j), int(k), int(i)] = m.new_bool_var(f"x{p}_{j}_{k}_{i}")
    by_stage: dict[int, list] = {p: [] for p in range(j0, S)}
    ends: dict[tuple[int, int], list] = {}
    starts: dict[tuple[int, int], list] = {}
    bands = {p: pair.band(p) for p in range(j0, S)}
    for (p, j, k, i), v in x.items():
        by_stage[p].append(v)
        ends.setdefault((p, int(bands[p][1][i])), []).append(v)
        starts.setdefault((p, int(bands[p][0][k])), []).append(v)
    if any(not vs for vs in by_stage.values()):
        return Status.INFEASIBLE, math.inf, None
    for vs in by_stage.values():
        m.add_exactly_one(vs)
    for p in range(j0, S - 1):
        for b in range(pair.L + 1):
            e, s = ends.get((p, b - 1), []), starts.get((p + 1, b), [])
            if e or s:
                m.add(sum(e) == sum(s))
    m.add(sum(ends.get((S - 1, pair.L - 1), [])) == 1)
    top = 0
    coef: dict[tuple, tuple[int, int, int]] = {}
    for (p, j, k, i), v in x.items():
        st = pair.stage(p)
        coef[p, j, k, i] = (ns(st["T1"][j, k, i]), ns(st["T2"][j, k, i]), ns(st["INC1"][j, k, i]),
                            ns(st["INC2"][j, k, i]))
        top += max(coef[p, j, k, i][2], 0)
    big = ns(A0) + top + max(max(abs(c[0]) + abs(c[1]) for c in coef.values()), 1) + ns(M0) + 1
    mx = m.new_int_var(0, big, "R")
    m.add(mx >= ns(M0))
    if math.isfinite(cutoff):
        m.add(mx <= ns(cutoff))
    acc, fill = ns(A0), ns(_fill(pair, sub.prefix))
    for p in range(j0, S):
        items = [(coef[key], v) for key, v in x.items() if key[0] == p]
        m.add(mx >= sum(c[1] * v for c, v in items))
        m.add(mx >= fill + sum(c[1] * v for c, v in items))
        if p > 0:
            m.add(mx >= acc + sum(c[0] * v for c, v in items))
        nxt = m.new_int_var(0, big, f"A{p + 1}")
        m.add(nxt == acc + sum(c[2] * v for c, v in items))
        acc = nxt
        nh = m.new_int_var(0, big, f"H{p + 1}")
        m.add(nh == fill + sum(c[3] * v for c, v in items))
        fill = nh
    m.minimize(mx)
    solver = cp_model.CpSolver()
    solver.parameters.max_deterministic_time = time_limit
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    code = solver.solve(m)
    if code == cp_model.INFEASIBLE:
        return Status.INFEASIBLE, max(sub.bound, cutoff), None
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Status.UNKNOWN, max(sub.bound, solver.best_objective_bound * TIME_UNIT), None
    chosen = {}
    for (p, j, k, i), v in x.items():
        if solver.value(v):
            chosen[p] = (j, k, i)
    stages = list(sub.prefix) + [StagePlan(int(bands[p][0][k]), int(bands[p][1][i]), pair.configs[j])
                                 for p, (j, k, i) in sorted(chosen.items())]
    bound = max(sub.bound, solver.best_objective_bound * TIME_UNIT)
    return (Status.OPTIMAL if code == cp_model.OPTIMAL else Status.FEASIBLE), bound, tuple(stages)
