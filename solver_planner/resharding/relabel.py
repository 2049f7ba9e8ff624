"""Reuse a solved resharding on an isomorphic one: the same tensor and specs, meshes of the
same shapes on devices that the cluster cannot tell apart from the first ones.

A pipeline of 65 equal stages on 100 000 GPUs has 128 boundaries, most of them the same
problem shifted by a few hundred hosts; each took about 0.1 s to cost, schedule and replay.
Two problems are *isomorphic* when their devices, listed source mesh then destination mesh,
row by row, agree position by position on everything the cost model reads: which instance
of every level each device is in and which port of every interconnect it uses (numbered by
first appearance, so only equalities count).  Then every route crosses the same levels and
shares ports the same way, so unit tasks, candidates, durations and conflicts correspond one
to one, and the solved schedule, renamed, is a schedule of the new problem with the same
makespan and bound.  Only renamings that keep device and host order are used: the new
problem's candidates are then in the same order, so a fresh solve would see the same
instance (tested against fresh solves).  Ring interconnects (whose segments depend on
positions around the ring) are never renamed.
"""

from __future__ import annotations

import dataclasses

from ..solve import SolveResult
from ..topology import Resource, Topology
from .plan import ReshardingPlan
from .schedule import Candidate, Instance
from .strategies import UnitCost
from .tasks import ReshardingProblem, UnitTask

__all__ = ["signature", "relabel"]


def _devices(problem: ReshardingProblem) -> tuple[int, ...]:
    return problem.src.mesh.flat + problem.dst.mesh.flat


def signature(problem: ReshardingProblem, topology: Topology) -> tuple | None:
    """What a solved plan of ``problem`` depends on, up to renaming devices (None: never reuse)."""
    ics = list(topology.interconnects.values())
    if any(ic.shape == "ring" for ic in ics):
        return None
    devices = _devices(problem)
    columns = []
    for level in range(len(topology.levels)):
        columns.append(_first_seen(topology.instance(d, level) for d in devices))
    for ic in ics:
        columns.append(_first_seen(topology.port(d, ic) for d in devices))
    return (problem.shape, problem.dtype, problem.src.spec, problem.dst.spec, problem.src.mesh.shape,
            problem.dst.mesh.shape, tuple(columns))


def _first_seen(values) -> tuple[int, ...]:
    seen: dict[int, int] = {}
    return tuple(seen.setdefault(v, len(seen)) for v in values)


def relabel(result: SolveResult[ReshardingPlan], problem: ReshardingProblem, topology: Topology
            ) -> SolveResult[ReshardingPlan] | None:
    """``result`` (a solved problem with the same :func:`signature` as ``problem``) renamed
    onto ``problem``; None when the renaming would not keep device and host order, or meets
    a port it cannot rename."""
    old = result.solution
    pairs = sorted(zip(_devices(old.problem), _devices(problem)))
    dev = dict(pairs)
    if any(b1 >= b2 for (_, b1), (_, b2) in zip(pairs, pairs[1:])):
        return None
    host: dict[int, int] = {}
    for a, b in pairs:
        if host.setdefault(topology.host(a), topology.host(b)) != topology.host(b):
            return None
    hosts = sorted(host.items())
    if any(b1 >= b2 for (_, b1), (_, b2) in zip(hosts, hosts[1:])):
        return None
    ports: dict[tuple[str, int], int] = {}
    for ic in topology.interconnects.values():
        for a, b in pairs:
            ports[ic.name, topology.port(a, ic)] = topology.port(b, ic)

    renamed: dict[Resource, Resource] = {}

    def res(r: Resource) -> Resource:
        # each port once: a boundary's unit costs and its instance name each port twice (on
        # 100 000 GPUs, 6 144 names of 3 072 ports per boundary)
        out = renamed.get(r)
        if out is None:
            out = renamed[r] = Resource(r.interconnect, ports[r.interconnect, r.instance], r.direction)
        return out

    try:
        resources = [res(r) for r in old.instance.resources]
        costs = [[UnitCost(u.strategy, u.time, frozenset(res(r) for r in u.resources),
                           tuple((dev[a], dev[b], n) for a, b, n in u.transfers)) for u in row] for row in old.costs]
    except KeyError:
        return None
    tasks = [UnitTask(t.index, t.slice, t.nbytes, tuple(dev[d] for d in t.holders), tuple(dev[d] for d in t.receivers))
             for t in old.tasks]
    inst = Instance([[Candidate(host[c.host], dev[c.device], c.duration, c.resources) for c in row]
                     for row in old.instance.candidates], resources)
    plan = ReshardingPlan(problem, old.strategy, tasks, inst, old.schedule, costs)
    return dataclasses.replace(result, solution=plan, solutions=[plan], info=dict(result.info), wall_time=0.0)
