"""Finding placements: the solver model or enumeration, chosen by ``method``.

The proxy objective ``sum w[i][j] log x[i][j]`` with ``w[i][j] = sum of the bytes of every
reduction over axis i / bandwidth of level j's interconnect`` prefers keeping reduced axes
on fast levels.  It is only a guide for the solver's pick; placements are ranked by the
cost of their synthesized reduction programs (:mod:`solver_planner.reduction.ranking`).
"""

from __future__ import annotations

from typing import Sequence

from ..errors import PlannerError
from ..solve import SolveResult, Status, Stopwatch
from ..spec.model import ModelSpec
from ..topology import Topology
from .cpsat import cpsat_matrices, log_objective, model_size, prime_exponents
from .enumerate import enumerate_matrices
from .matrix import ParallelismMatrix, PlacementRule

__all__ = ["find_placements", "resolve_rules", "traffic_weights", "AUTO_THRESHOLD", "count_bound"]

# Above this many exponent variables, method='auto' enumerates instead of building a model.
AUTO_THRESHOLD = 200


def resolve_rules(model: ModelSpec, topology: Topology) -> list[PlacementRule]:
    """The model spec's placement constraints against the cluster's levels."""
    rules = []
    if model.parallelism is None:
        return rules
    for c, rule in enumerate(model.parallelism.constraints):
        at = ("parallelism", "constraints", c)
        axis = model.axis_names.index(rule.axis)
        key, level = next((k, v) for k, v in (("inside", rule.inside), ("not_split_over", rule.not_split_over),
                                                ("level", rule.level)) if v is not None)
        if level not in topology.level_names:
            raise model.source.error(at + (key,), f"no level named '{level}' in cluster '{topology.name}';"
                                                  f" expected one of: {', '.join(topology.level_names)}")
        j = topology.level_index(level)
        kind = {"inside": "inside", "not_split_over": "not_split_over", "level": "fix"}[key]
        rules.append(PlacementRule(axis, kind, j, rule.factor or 1))
    return rules


def traffic_weights(model: ModelSpec, topology: Topology) -> list[list[float]]:
    """``w[i][j]``: bytes reduced over axis ``i`` per byte/s of level ``j``'s interconnect."""
    serving = {ic.level: ic for ic in topology.interconnects.values() if ic.level}
    weights = [[0.0] * len(topology.levels) for _ in model.axis_names]
    for red in model.reductions:
        for name in red.axes:
            i = model.axis_names.index(name)
            for j, level in enumerate(topology.level_names):
                if level in serving:
                    weights[i][j] += red.bytes / serving[level].bandwidth
    return weights


def count_bound(axis_sizes: Sequence[int], level_counts: Sequence[int]) -> int:
    """An upper bound on the number of matrices: per prime, every row's exponent spread over
    the levels independently (Eq. 2 alone; Eq. 1 only removes some)."""
    from math import comb

    primes = {q for n in list(axis_sizes) + list(level_counts) for q in prime_exponents(n)}
    bound = 1
    for q in primes:
        for p in axis_sizes:
            e = prime_exponents(p).get(q, 0)
            bound *= comb(e + len(level_counts) - 1, e)
    return bound


def find_placements(axis_sizes: Sequence[int], level_counts: Sequence[int], rules: Sequence[PlacementRule] = (),
                    weights: Sequence[Sequence[float]] | None = None, method: str = "auto",
                    time_limit: float = 30.0, every: bool = True, limit: int | None = None
                    ) -> SolveResult[ParallelismMatrix]:
    """Every parallelism matrix (``.solutions``, in lexicographic order) and the best under
    ``weights`` (``.solution``).  ``method``: 'cp-sat', 'enumerate' or 'auto' (the model
    below :data:`AUTO_THRESHOLD` variables, enumeration above); ``.method`` says which ran.
    ``every=False`` asks CP-SAT for the best only (``.solutions`` is then empty), for a
    caller that needs one placement; enumeration lists them all regardless.  ``limit``: list at
    most that many (``.info['limited']`` says the list was cut there; enumeration's best is
    then over those only, CP-SAT's over every matrix)."""
    if method not in ("auto", "cp-sat", "enumerate"):
        raise ValueError(f"unknown placement method {method!r}; expected auto, cp-sat or enumerate")
    if method == "auto":
        if not every and count_bound(axis_sizes, level_counts) > 1000:
            # one placement asked for: CP-SAT finds the optimum of 16 axes on 16 levels in
            # 11 ms, where listing the 16! matrices first never ends (`reduce verify`)
            method = "cp-sat"
        else:
            method = "cp-sat" if model_size(axis_sizes, level_counts) <= AUTO_THRESHOLD else "enumerate"
    if method == "cp-sat":
        result = cpsat_matrices(axis_sizes, level_counts, rules, weights, time_limit,
                                enumerate_all=every or weights is None, limit=limit)
        result.info["limited"] = limit is not None and len(result.solutions) >= limit
        for m in result.solutions + ([result.solution] if result.solution else []):
            try:  # every solver output is checked (DESIGN.md): Eq. 1-2 and the rules
                m.check(axis_sizes, level_counts)
            except ValueError as exc:
                raise PlannerError(f"the CP-SAT model returned an invalid matrix: {exc}") from None
            if not all(r.allows(m.rows) for r in rules):
                raise PlannerError(f"the CP-SAT model returned {m}, which breaks a placement rule")
        return result
    with Stopwatch() as sw:
        solutions = enumerate_matrices(axis_sizes, level_counts, rules, limit)
        best = objective = None
        if solutions:
            if weights is not None:
                best = min(solutions, key=lambda m: (round(log_objective(m, weights), 12), m.rows))
                objective = log_objective(best, weights)
            else:
                best = solutions[0]
    status = Status.OPTIMAL if solutions else Status.INFEASIBLE
    limited = limit is not None and len(solutions) >= limit
    return SolveResult(status, "enumerate", best, objective, objective, sw.seconds, solutions,
                       {"complete": not limited, "limited": limited})
