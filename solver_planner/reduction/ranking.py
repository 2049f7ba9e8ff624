"""Costing reduction programs and ranking placements with the shared cost model.

A lowered program runs its steps one after another; inside a step every device group
runs at once and they share links (:meth:`CostModel.collective`).  The buffer of a step is
the share of the data its members hold then, read off the semantics' state: after a
ReduceScatter over ``g`` devices each holds ``1/g`` of the chunks, so the next step moves
``1/g`` of the bytes (NCCL's size convention: the AllGather buffer is its output).  A group
whose members hold nothing issues no call: it takes no time and loads no link (the
lowering skips it too).  A step whose buffers are not contiguous in the library's rank
order pays the local copies :func:`.layout.copies` names, at the device's memory
bandwidth, after the collective.  Every costed program is replayed by the simulator with
the same cost model, and a disagreement fails loudly (DESIGN.md, "Every solver output is
checked").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..cost import Collective, CollectiveCost, CostModel
from ..errors import OptionError, PlannerError
from ..memory import check as check_memory
from ..memory import max_placements, ranking_estimate
from ..placement import ParallelismMatrix, find_placements, resolve_rules, traffic_weights
from ..placement.search import count_bound
from ..simulate import Simulation
from ..simulate.tasks import compute_resource
from ..solve import SolveResult
from ..spec.model import ModelSpec, ReductionSpec, check_fits
from ..topology import Topology
from .dsl import Instruction, Program, format_program
from .hierarchy import INSIDE, Lowering, SynthesisHierarchy
from .layout import call_of, copies, runs_of_mask
from .synthesis import DEFAULT_MAX_SIZE, states_along, synthesize_traced

__all__ = ["Step", "StepCoster", "CostedProgram", "ReductionReport", "PlacementReport", "cost_program",
           "replay", "allreduce_program", "rank_placements", "proxy_placement", "reduce_on_placement", "check_placeable",
           "lowering_for", "reduction_named"]


@dataclass(frozen=True)
class Step:
    collective: Collective
    groups: list[list[int]]  # device groups over the whole system that move data
    nbytes: list[float]  # buffer of each group
    copy_time: float = 0.0  # local packing / unpacking after the collective (layout.copies)


@dataclass
class CostedProgram:
    program: Program
    time: float
    steps: list[Step]
    step_times: list[float]  # collective + local copies
    costs: list[CollectiveCost] = field(default_factory=list)

    @property
    def text(self) -> str:
        return format_program(self.program)


def allreduce_program() -> Program:
    """The default: one AllReduce over each reduction group."""
    return (Instruction("root", INSIDE, Collective.ALLREDUCE),)


class StepCoster:
    """Costs steps of programs on one lowering, remembering each (instruction, chunks held).

    Synthesized programs share most of their steps, so a program costs a few lookups.
    """

    def __init__(self, cost: CostModel, lowering: Lowering, nbytes: float, algorithm: str = "ring"):
        self.cost, self.lowering, self.nbytes, self.algorithm = cost, lowering, nbytes, algorithm
        self.k = lowering.hierarchy.size
        self._steps: dict[tuple, tuple[Step, CollectiveCost]] = {}
        self._instr: dict[Instruction, list[tuple[int, ...]]] = {}

    def _groups(self, instruction: Instruction) -> list[tuple[int, ...]]:
        groups = self._instr.get(instruction)
        if groups is None:
            groups = self._instr[instruction] = self.lowering.hierarchy.groups(instruction.slice, instruction.form)
        return groups

    def step(self, instruction: Instruction, rows: Sequence[int]) -> tuple[Step, CollectiveCost]:
        """The step ``instruction`` takes when position ``p`` holds the chunks of bit mask ``rows[p]``."""
        key = (instruction, tuple(rows))
        hit = self._steps.get(key)
        if hit is None:
            kind, chunk = instruction.collective, self.nbytes / self.k
            priced = bool(self.cost.topology.device.memory_bandwidth)  # else copies cost nothing
            active, sizes, copy = [], [], 0.0
            for g in self._groups(instruction):
                held = bin(rows[g[0]]).count("1")
                if held == 0 or len(g) < 2:
                    continue  # nothing to move (a broadcast root or reduction members holding nothing)
                active.append(g)
                sizes.append(chunk * held * (len(g) if kind is Collective.ALLGATHER else 1))
                if priced:
                    call = call_of(kind, g, [runs_of_mask(rows[p]) for p in g])
                    copied = max((c.chunks for c in copies(call).values()), default=0)
                    copy = max(copy, self.cost.copy_time(copied * chunk))
            # Every non-reduction coordinate repeats the pattern, so the copies are the same.
            step = Step(kind, self.lowering.lower(active), sizes * len(self.lowering.keys), copy)
            hit = self._steps[key] = (step, self.cost.collective(kind, step.groups, step.nbytes, self.algorithm))
        return hit

    def program(self, program: Program, held: Sequence[Sequence[int]] | None = None) -> CostedProgram:
        """Cost ``program``; ``held`` (:attr:`Synthesized.held`, from :func:`synthesize_traced`)
        saves re-running the semantics."""
        if held is None:
            held = [st.rows for st in states_along(self.lowering.hierarchy, program)]
        parts = [self.step(ins, h) for ins, h in zip(program, held)]
        times = [c.time + s.copy_time for s, c in parts]
        return CostedProgram(program, sum(times), [s for s, _ in parts], times, [c for _, c in parts])


def cost_program(cost: CostModel, lowering: Lowering, program: Program, nbytes: float,
                 algorithm: str = "ring") -> CostedProgram:
    return StepCoster(cost, lowering, nbytes, algorithm).program(program)


def replay(cost: CostModel, costed: CostedProgram, algorithm: str = "ring", check: bool = True) -> Simulation:
    """The program as simulator tasks, one per step, each after the previous one.

    With ``check``, raise :class:`PlannerError` unless the simulated makespan equals the
    cost the ranking reported.  A step's task holds no port: each step waits for the one
    before it, so no two ever share a port, and listing every port of a step over 100 000
    devices would cost more than the whole ranking.
    """
    sim = Simulation()
    prev: list[int] = []
    for n, step in enumerate(costed.steps):
        # The collective is costed afresh from its device groups and bytes, independently
        # of the coster's memo, so the check covers the memo too.
        c = cost.collective(step.collective.value, step.groups, step.nbytes, algorithm)
        devices = sorted(d for g in step.groups for d in g)
        prev = [sim.add(f"step {n + 1}: {costed.program[n]}", c.time, (), prev, devices=devices,
                        category=c.collective, args={"bytes": c.nbytes, "algorithm": c.algorithm,
                                                     "bus_bandwidth": c.bus_bandwidth, "bottleneck": c.bottleneck})]
        if step.copy_time > 0:
            prev = [sim.add(f"step {n + 1}: local copies", step.copy_time, [compute_resource(d) for d in devices],
                            prev, devices=devices, stream="compute", category="copy")]
    if check:
        makespan = sim.run().makespan
        if not math.isclose(makespan, costed.time, rel_tol=1e-9, abs_tol=1e-15):
            raise PlannerError(f"simulated time {makespan} disagrees with the costed {costed.time}"
                               f" for {costed.text}")
    return sim


@dataclass
class ReductionReport:
    name: str
    axes: list[str]
    nbytes: float
    weight: float
    hierarchy: SynthesisHierarchy
    allreduce: CostedProgram
    programs: list[CostedProgram]  # valid programs, fastest first

    @property
    def best(self) -> CostedProgram:
        return self.programs[0] if self.programs else self.allreduce

    @property
    def nothing_to_reduce(self) -> bool:
        """Every group of the reduction holds one device (its axes have size 1 here): no
        program is synthesized, and none is needed."""
        return not self.programs and self.allreduce.time == 0

    @property
    def speedup(self) -> float:
        return self.allreduce.time / self.best.time if self.best.time > 0 else 1.0

    def as_dict(self) -> dict:
        return {"name": self.name, "axes": self.axes, "bytes": self.nbytes, "weight": self.weight,
                "hierarchy": str(self.hierarchy), "allreduce_time": self.allreduce.time,
                "best_program": None if self.nothing_to_reduce else self.best.text, "best_time": self.best.time,
                "speedup": self.speedup, "programs": len(self.programs), "nothing_to_reduce": self.nothing_to_reduce}


@dataclass
class PlacementReport:
    matrix: ParallelismMatrix
    reductions: list[ReductionReport] = field(default_factory=list)

    @property
    def cost(self) -> float:
        return sum(r.weight * r.best.time for r in self.reductions)

    @property
    def allreduce_cost(self) -> float:
        return sum(r.weight * r.allreduce.time for r in self.reductions)

    def as_dict(self) -> dict:
        return {"matrix": self.matrix.as_lists(), "cost": self.cost, "allreduce_cost": self.allreduce_cost,
                "reductions": [r.as_dict() for r in self.reductions]}


def reduction_named(spec: ModelSpec, name: str | None) -> ReductionSpec:
    """The model's reduction called ``name`` (the first when None); a spec error when it
    asks for none, an option error naming the ones it has when none is called that."""
    if not spec.reductions:
        raise spec.source.error(("reductions",), "the model spec asks for no reduction")
    if name is None:
        return spec.reductions[0]
    for red in spec.reductions:
        if red.name == name:
            return red
    raise OptionError(f"no reduction named {name!r}; the model has: {', '.join(r.name for r in spec.reductions)}")


def check_placeable(topology: Topology, model: ModelSpec) -> None:
    """Refuse a model without parallelism axes, or whose axes do not fill the cluster."""
    if model.parallelism is None:
        raise model.source.error(("parallelism",), "placing needs 'parallelism.axes'")
    check_fits(model, topology.num_devices, topology.name)


def lowering_for(topology: Topology, model: ModelSpec, matrix: ParallelismMatrix,
                 reduction: ReductionSpec) -> Lowering:
    """The synthesis hierarchy and lowering of ``reduction`` on the placement ``matrix``."""
    axes = [model.axis_names.index(a) for a in reduction.axes]
    return Lowering(matrix, [lv.count for lv in topology.levels], topology.level_names, axes)


def reduce_on_placement(topology: Topology, model: ModelSpec, matrix: ParallelismMatrix, reduction: ReductionSpec,
                        max_size: int = DEFAULT_MAX_SIZE, algorithm: str = "ring", cost: CostModel | None = None,
                        cache: dict | None = None, check: bool = True, metric: str = "instructions",
                        symmetric: bool | None = None, memory_bound: int | None = None) -> ReductionReport:
    """Synthesize, cost and rank the programs of one reduction on one placement (``metric``:
    how program size is counted, see :mod:`.synthesis`).

    ``symmetric``: synthesize on the representative hierarchy (:mod:`.symmetry`) and cost
    on the real one; None (the default) does so when the representative is the smaller.
    ``memory_bound``: as :func:`rank_placements`, for this one placement.
    """
    from .symmetry import RepresentativeCoster, representative

    if memory_bound is not None:
        check_memory(ranking_estimate(topology.num_devices, topology.devices_per_host, 1, 1),
                     "synthesizing on this placement", memory_bound)
    cost = cost or CostModel(topology)
    lowering = lowering_for(topology, model, matrix, reduction)
    rep = representative(lowering.hierarchy)
    if symmetric is None:
        symmetric = rep.size < lowering.hierarchy.size
    synthesized_on = rep if symmetric else lowering.hierarchy
    key = (synthesized_on, max_size, metric)
    if cache is not None and key in cache:
        programs = cache[key]
    else:
        programs = synthesize_traced(synthesized_on, max_size, metric)
        if cache is not None:
            cache[key] = programs
    if symmetric:
        coster = RepresentativeCoster(cost, lowering, reduction.bytes, algorithm)
        costed = coster.programs([p.program for p in programs])
    else:
        coster = StepCoster(cost, lowering, reduction.bytes, algorithm)
        costed = [coster.program(p.program, p.held) for p in programs]
    order = sorted(range(len(costed)), key=lambda i: (costed[i].time, len(costed[i].program), i))
    costed = [costed[i] for i in order]
    baseline = coster.program(allreduce_program())
    if check:
        replay(cost, baseline, algorithm)
        if costed:
            replay(cost, costed[0], algorithm)
    return ReductionReport(reduction.name, list(reduction.axes), reduction.bytes, reduction.weight,
                           lowering.hierarchy, baseline, costed)


# Below this many matrices (a bound), method 'auto' enumerates them rather than build a
# CP-SAT model: both are exact, and loading OR-Tools takes longer than the enumeration.
FEW_MATRICES = 1000


def _method(model: ModelSpec, counts: Sequence[int], method: str) -> str:
    return "enumerate" if method == "auto" and count_bound(model.axis_sizes, counts) <= FEW_MATRICES else method


def proxy_placement(topology: Topology, model: ModelSpec, method: str = "auto"
                    ) -> tuple[ParallelismMatrix | None, SolveResult]:
    """One placement without synthesizing any program: the best under the solver's proxy
    objective (:mod:`solver_planner.placement.search`: reduced bytes over each level's
    bandwidth, P² §3.1's matrices).  What `reduce verify` needs when no matrix is given: a
    proof is about one placement, and ranking every placement by its best programs costs
    far more than the proof.  ``None`` when no placement satisfies the constraints.

    ``method='auto'`` enumerates when there are few matrices (:data:`FEW_MATRICES`), else
    asks CP-SAT for its optimum."""
    check_placeable(topology, model)
    counts = [lv.count for lv in topology.levels]
    result = find_placements(model.axis_sizes, counts, resolve_rules(model, topology),
                             traffic_weights(model, topology), _method(model, counts, method), every=False)
    return result.solution, result


def rank_placements(topology: Topology, model: ModelSpec, method: str = "auto", max_size: int = DEFAULT_MAX_SIZE,
                    algorithm: str = "ring", matrices: Sequence[ParallelismMatrix] | None = None,
                    progress: Callable[[int, int], None] | None = None, metric: str = "instructions",
                    memory_bound: int | None = None):
    """Every placement with its reductions' best programs, best placement first.

    ``method='auto'`` enumerates when there are few matrices (:data:`FEW_MATRICES`), else
    lets :func:`.find_placements` choose.

    Returns ``(reports, placement_result)``; the ranking key is the weighted sum of the
    best program times of all reductions.  ``memory_bound``: refuse
    (:class:`~solver_planner.errors.RefusedError`) before synthesizing when the ranking's
    estimate passes it (:mod:`solver_planner.memory`).
    """
    check_placeable(topology, model)
    counts = [lv.count for lv in topology.levels]
    # under a memory bound, placements are listed only up to the most the ranking could hold
    # (one more, to know): 16 axes of 2 on 16 levels of 2 (16! matrices) were listed for
    # 100 s before the bound was checked
    limit = None
    if matrices is not None:
        limit = 1           # the placements are given: the search only says how it would run
    elif memory_bound is not None:
        limit = 1 + max_placements(topology.num_devices, topology.devices_per_host, len(model.reductions),
                                   memory_bound)
    result = find_placements(model.axis_sizes, counts, resolve_rules(model, topology),
                             traffic_weights(model, topology), _method(model, counts, method), limit=limit)
    cost = CostModel(topology)
    cache: dict = {}
    reports = []
    todo = list(matrices if matrices is not None else result.solutions)
    if memory_bound is not None:
        at_least = "at least " if result.info.get("limited") and matrices is None else ""
        check_memory(ranking_estimate(topology.num_devices, topology.devices_per_host, len(todo),
                                      len(model.reductions), at_least), "ranking these placements", memory_bound)
    for n, matrix in enumerate(todo):
        if progress is not None:
            progress(n, len(todo))
        rep = PlacementReport(matrix)
        for red in model.reductions:
            rep.reductions.append(reduce_on_placement(topology, model, matrix, red, max_size, algorithm, cost, cache,
                                                      metric=metric))
        reports.append(rep)
    reports.sort(key=lambda r: (r.cost, r.allreduce_cost, r.matrix.rows))
    return reports, result
