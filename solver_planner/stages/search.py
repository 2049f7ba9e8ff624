"""The stage planner: every mesh shape and micro-batch count, one partition solver.

For each (mesh shape, B) pair the partition problem of :mod:`.partition` is solved by the
chosen method; pairs are visited in order of a lower bound and skipped once the bound
cannot beat the best plan, so a skipped pair never hides a better plan.

Methods: ``dp`` (exact dynamic program), ``cpsat`` (CP-SAT, status and bound from the
solver), ``greedy`` (seed 001 Alg. 5, bound from the lower bounds), ``brute-force`` (tests),
and ``auto``: CP-SAT when the model is small, else the dynamic program, else greedy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ..cost import CostModel
from ..errors import InfeasibleError, PlannerError
from ..solve import SolveResult, Status, Stopwatch
from ..topology import Topology
from .costs import SCHEDULES, CostTables, MeshShape, StageCosts, cost_tables, divisors, mesh_shapes
from .cpsat import solve_cpsat
from .layers import LayerModel
from .partition import Partition, PartitionProblem, balanced_greedy, brute_force

__all__ = ["METHODS", "plan_partition", "StageSearch"]

METHODS = ("auto", "dp", "cpsat", "greedy", "brute-force")
AUTO_CPSAT_CELLS = 20_000        # (stage, degree, first, last) cells over all pairs for CP-SAT
AUTO_DP_CELLS = 40_000_000       # beyond this the DP's arrays get large: greedy
CPSAT_MAX_CELLS = 400_000        # one Boolean per cell: larger pairs are refused


@dataclass
class StageSearch:
    """Inputs shared by every (shape, B) problem."""

    model: LayerModel
    topology: Topology
    schedule: str = "1f1b"
    comm: bool = True
    synthesize: bool = True

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise PlannerError(f"unknown schedule '{self.schedule}'; expected one of: {', '.join(SCHEDULES)}")
        self.cost = CostModel(self.topology)
        self._tables: dict[MeshShape, dict[int, CostTables]] = {}

    def tables(self, shape: MeshShape) -> dict[int, CostTables]:
        if shape not in self._tables:
            self._tables[shape] = cost_tables(self.topology, self.cost, shape, self.synthesize)
        return self._tables[shape]

    def microbatch_options(self) -> list[int]:
        if self.model.microbatches is not None:
            return [self.model.microbatches]
        return divisors(self.model.global_batch)

    def problems(self, shapes: list[MeshShape] | None = None, stages: int | None = None) -> list[PartitionProblem]:
        out = []
        for shape in shapes or mesh_shapes(self.topology.num_hosts, self.topology.devices_per_host):
            S = self.topology.num_devices // shape.size
            if S > self.model.num_layers or (stages is not None and S != stages):
                continue
            for B in self.microbatch_options():
                costs = StageCosts(self.model, self.topology, shape, B, self.schedule, self.comm, self.tables(shape))
                prob = PartitionProblem(costs)
                if prob.possible:
                    out.append(prob)
        return out


def _cells(p: PartitionProblem) -> int:
    return p.S * len(p.degrees) * p.L * p.L


def plan_partition(search: StageSearch, method: str = "auto", time_limit: float = 10.0, seed: int = 0,
                   shapes: list[MeshShape] | None = None, stages: int | None = None,
                   progress: Callable[[int, int], None] | None = None) -> SolveResult[Partition]:
    """The best partition over all mesh shapes and micro-batch counts."""
    if method not in METHODS:
        raise PlannerError(f"unknown method '{method}'; expected one of: {', '.join(METHODS)}")
    with Stopwatch() as sw:
        problems = search.problems(shapes, stages)
        if not problems and stages is not None:
            sizes = sorted({search.topology.num_devices // s.size for s in mesh_shapes(
                search.topology.num_hosts, search.topology.devices_per_host)})
            raise PlannerError(f"{stages} stages are not possible on '{search.topology.name}' with"
                               f" {search.model.num_layers} layers; stage counts of its mesh shapes:"
                               f" {', '.join(map(str, sizes))}")
        if not problems:
            raise InfeasibleError(
                f"no stage plan exists: {search.model.num_layers} layers cannot fill the stages of any mesh shape of"
                f" '{search.topology.name}' with a data degree dividing a micro-batch of"
                f" {search.model.global_batch} samples")
        chosen = method
        if method == "auto":
            total = sum(_cells(p) for p in problems)
            chosen = "cpsat" if total <= AUTO_CPSAT_CELLS else "dp" if max(map(_cells, problems)) <= AUTO_DP_CELLS \
                else "greedy"
        if chosen == "cpsat" and max(map(_cells, problems)) > CPSAT_MAX_CELLS:
            raise PlannerError(f"the CP-SAT model would have up to {max(map(_cells, problems)):,} Booleans per"
                               f" (mesh, micro-batch) pair (limit {CPSAT_MAX_CELLS:,}); use --method dp (exact) or"
                               f" --stages to narrow the search")
        bounds = {id(p): p.lower_bound() for p in problems}
        order = sorted(problems, key=lambda p: (bounds[id(p)], p.costs.shape, p.costs.microbatches))
        best: Partition | None = None
        proven = chosen != "greedy"
        bound = math.inf                 # min over pairs of a lower bound on the pair's optimum
        runs = solved = 0
        for n, prob in enumerate(order):
            if progress is not None:
                progress(n, len(order))
            lb = bounds[id(prob)]
            incumbent = best.objective if best is not None else math.inf
            if lb >= incumbent:
                bound = min(bound, lb)
                continue
            solved += 1
            if chosen == "dp":
                cand, r = prob.solve_dp(incumbent)
                runs += r
                # the DP stops once nothing beats the incumbent: the pair's optimum is at least this
                pair_bound = min(cand.objective, incumbent) if cand else math.inf
            elif chosen == "brute-force":
                cand = brute_force(prob)
                pair_bound = cand.objective if cand else math.inf
            elif chosen == "greedy":
                cand, pair_bound = balanced_greedy(prob), lb
            else:
                hint = balanced_greedy(prob)
                status, stages, solver_bound = solve_cpsat(prob, time_limit, seed, hint.stages if hint else None)
                cand = prob.evaluate(stages) if stages else None
                proven &= status in (Status.OPTIMAL, Status.INFEASIBLE)
                pair_bound = math.inf if status is Status.INFEASIBLE else max(solver_bound, lb)
            bound = min(bound, pair_bound)
            if cand is not None and cand.feasible and cand.objective < incumbent:
                best = cand
    info = {"pairs": len(problems), "solved_pairs": solved, "dp_runs": runs, "solver": chosen}
    if best is None:
        raise InfeasibleError(_shortfall_message(search, problems))
    status = Status.OPTIMAL if proven else Status.FEASIBLE
    bound = best.objective if proven else min(bound, best.objective)
    return SolveResult(status, chosen if method == "auto" else method, best, best.objective, bound, sw.seconds,
                       info=info)


def _shortfall_message(search: StageSearch, problems: list[PartitionProblem]) -> str:
    """The smallest memory shortfall over the plans that use the least memory per pair."""
    short = math.inf
    where = None
    for prob in problems:
        plan = balanced_greedy(prob)
        if plan is not None and plan.shortfall < short:
            short, where = plan.shortfall, plan
    mem = search.topology.device.memory
    if where is None:
        return f"no stage plan fits in {mem / 2**30:.1f} GiB per device"
    return (f"no stage plan fits in device memory ({mem / 2**30:.2f} GiB): the closest plan found"
            f" ({where.costs.stages} stages on {where.costs.shape} meshes, {where.costs.microbatches} micro-batches)"
            f" needs {(mem + short) / 2**30:.2f} GiB per device, {short / 2**30:.2f} GiB short")
