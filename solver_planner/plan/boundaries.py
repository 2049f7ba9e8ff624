"""The tensors that cross between stages, as cross-mesh resharding problems (the resharding paper §5.2).

Every channel of a plan (the next stage, or a farther one for a skip connection) moves one
micro-batch's activations forward and their gradients back.  The resharding paper §5.2: an activation is
partitioned along the batch over a stage's data-parallel devices and replicated over its
operator-parallel ones, on both meshes.  With a stage's devices laid out as a (data, tensor)
grid (:meth:`.parts.StagePart.grid`: rows are replicas, columns tensor positions), that is
the sharding spec ``[S0, R]`` of a ``[samples, elements per sample]`` tensor on each side.
Its broadcast schedule comes from the resharding scheduler; the pipeline simulation runs it
as one task per micro-batch that lasts the schedule's replayed makespan and holds every
port the schedule uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..choices import CROSS_MESH
from ..cost import CostModel
from ..resharding import DeviceMesh, Layout, ReshardingPlan, ReshardingProblem, ShardingSpec, plan_resharding
from ..resharding import check as check_resharding
from ..resharding.relabel import relabel, signature
from ..solve import SolveResult
from ..spec.model import DTYPE_BYTES
from ..stages import Partition
from ..stages.costs import port_names
from ..stages.pipeline import exec_resource
from ..topology import Topology
from .parts import StagePart

__all__ = ["Boundary", "STRATEGIES", "boundary_problem", "solve_boundaries", "transfers_of", "directions"]

# How a boundary's tensor moves (the rows of the resharding paper's ablation): broadcast schedules, Alpa's
# send/recv (one sender per destination device), or free ("Signal Send/Recv", the bound).
STRATEGIES = CROSS_MESH
SPEC = ("S0", "R")


@dataclass
class Boundary:
    """One direction of one channel: ``kind`` 'act' (stage ``src`` to a later ``dst``) or
    'grad' (back)."""

    kind: str
    src: int
    dst: int
    problem: ReshardingProblem
    result: SolveResult[ReshardingPlan] | None      # None when cross-mesh communication is free
    time: float                                     # replayed makespan (s) per micro-batch
    ports: tuple[str, ...]

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.kind, self.src, self.dst)

    @property
    def plan(self) -> ReshardingPlan | None:
        return self.result.solution if self.result is not None else None


def stage_mesh(part: StagePart, topology: Topology) -> DeviceMesh:
    """A stage's devices as a mesh: row ``i`` is data replica ``i``, column ``j`` tensor position ``j``."""
    grid = part.grid()
    return DeviceMesh(tuple(topology.host(row[0]) for row in grid), tuple(tuple(row) for row in grid))


def boundary_problem(plan: Partition, parts: list[StagePart], topology: Topology, kind: str, src: int, dst: int
                     ) -> ReshardingProblem:
    """The resharding of one micro-batch's tensors over channel (src, dst) (the resharding paper §5.2)."""
    c = plan.costs
    lo, hi = (src, dst) if kind == "act" else (dst, src)
    dtype = c.model.dtype
    per_sample = plan.channels[lo, hi]
    elements = max(1, math.ceil(per_sample / DTYPE_BYTES[dtype]))
    shape = (c.micro_size, elements)
    layouts = [Layout(shape, stage_mesh(parts[s], topology), ShardingSpec(SPEC)) for s in (src, dst)]
    name = f"{'activation' if kind == 'act' else 'gradient'} {src}->{dst}"
    return ReshardingProblem(name, shape, dtype, layouts[0], layouts[1])


def directions(plan: Partition) -> list[tuple[str, int, int]]:
    """(kind, src, dst) of every direction of every channel that crosses meshes: the
    boundaries a plan schedules.  Two model chunks on one pipeline stage (ZB-V's turn at the
    last stage, or a skip connection between chunks of one stage) pass their tensors in
    device memory: nothing moves."""
    return [(k, s, d) for (p, q) in plan.channels if plan.mesh[p] != plan.mesh[q]
            for (k, s, d) in (("act", p, q), ("grad", q, p))]


def solve_boundaries(plan: Partition, parts: list[StagePart], topology: Topology, cost: CostModel,
                     strategy: str = "broadcast", method: str = "auto", time_limit: float = 10.0, seed: int = 0,
                     progress=None) -> list[Boundary]:
    """Schedule every direction of every channel of ``plan`` (``strategy``: :data:`STRATEGIES`)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown cross-mesh strategy {strategy!r}; expected one of: {', '.join(STRATEGIES)}")
    out = []
    # boundaries that are one problem on other devices are solved once (resharding/relabel.py)
    # (a gradient boundary has an activation boundary's signature, but renaming one onto the
    # other reverses device order: each key keeps every solved twin that differs so)
    solved: dict[tuple, list[Boundary]] = {}
    for kind, src, dst in directions(plan):
        problem = boundary_problem(plan, parts, topology, kind, src, dst)
        if strategy == "free" or not plan.costs.comm:
            out.append(Boundary(kind, src, dst, problem, None, 0.0, ()))
            continue
        key = signature(problem, topology)
        res = twin = None
        for twin in solved.get(key, []) if key is not None else []:
            res = relabel(twin.result, problem, topology)
            if res is not None:
                break
        if res is not None:
            plan_ = res.solution
            used = {r for i in range(len(plan_.tasks)) for r in plan_.unit_cost(i).resources}
            out.append(Boundary(kind, src, dst, problem, res, twin.time, port_names(used)))
            continue
        if progress is not None:
            progress(f"resharding {problem.name}")
        res = plan_resharding(problem, cost, method, strategy, time_limit, seed)
        out.append(boundary_of(kind, src, dst, problem, res, cost))
        if key is not None:
            solved.setdefault(key, []).append(out[-1])
    return out


def boundary_of(kind: str, src: int, dst: int, problem: ReshardingProblem, res: SolveResult[ReshardingPlan],
                cost: CostModel) -> Boundary:
    """A solved boundary: its schedule replayed in the simulator (which fails loudly on an
    overlap or a wrong duration), the replayed makespan and the ports it holds."""
    timeline = check_resharding(res.solution, cost)
    ports = {r for rec in timeline.records for r in rec.resources}
    return Boundary(kind, src, dst, problem, res, timeline.makespan, port_names(ports))     # sorts them


def transfers_of(boundaries: list[Boundary], mesh: tuple[int, ...], synchronous: bool = False
                 ) -> dict[tuple[str, int, int], tuple[float, tuple[str, ...]]]:
    """What :func:`solver_planner.stages.simulate_schedule` takes to run these schedules;
    ``mesh[k]``: the pipeline stage of chunk ``k`` (the partition's ``mesh``);
    ``synchronous``: each transfer also holds both stages' compute streams (no overlap)."""
    out = {}
    for b in boundaries:
        ports = b.ports
        if synchronous and b.time > 0:
            ports = ports + (exec_resource(mesh[b.src]), exec_resource(mesh[b.dst]))
        out[b.key] = (b.time, ports)
    return out
