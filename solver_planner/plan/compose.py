"""One training plan from a cluster and a model: the stage planner's partition, each stage's
placement and proven gradient program, a broadcast schedule at every stage boundary, and
the whole iteration simulated with them (the resharding paper §5.2-5.3).

A composition, not a fifth solver (DESIGN.md): every part comes from its own public API
(:func:`solver_planner.stages.report.plan_stages`, :func:`.parts.stage_parts`,
:func:`.boundaries.solve_boundaries`, :func:`solver_planner.stages.simulate_schedule`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..cost import CostModel
from ..errors import InfeasibleError, OptionError
from ..spec.model import ModelSpec
from ..stages import Partition, PipelineRun, Schedule, family
from ..stages.fastsim import iteration, pipeline_run
from ..stages.pipeline import mesh_orders
from ..stages.schedule import VIRTUAL
from ..stages.devices import DeviceUse
from ..choices import DEFAULT_BUDGET, DEFAULT_GAP, DEFAULT_SIMULATIONS
from ..stages.report import Config, plan_stages
from ..topology import Topology
from .boundaries import Boundary, solve_boundaries, transfers_of
from .parts import StagePart, stage_parts

__all__ = ["TrainingPlan", "SearchOptions", "search_stages", "compose_candidates", "make_plan", "compose", "members", "simulate_plan", "breakdown", "BREAKDOWN_PARTS", "model_flops", "mesh_list"]


@dataclass
class TrainingPlan:
    """A whole plan and what its simulation says."""

    topology: Topology
    model: ModelSpec
    partition: Partition
    schedule: Schedule
    family: str
    parts: list[StagePart]
    boundaries: list[Boundary]
    run: PipelineRun
    cross_mesh: str
    solve_times: dict[str, float] = field(default_factory=dict)
    stage_planner_time: float = 0.0             # the stage planner's simulated time of this partition
    free_time: float = 0.0                      # the same iteration with cross-mesh communication free
    tried: dict[str, float] = field(default_factory=dict)
    search: dict = field(default_factory=dict)
    overlap: bool = True
    # how many of the cluster's devices the plan uses (``topology`` is their cluster), and why
    use: DeviceUse | None = None

    @property
    def iteration_time(self) -> float:
        return self.run.iteration_time

    @property
    def global_batch(self) -> int:
        return self.partition.costs.model.global_batch

    @property
    def throughput(self) -> float:
        """Samples per second."""
        return self.global_batch / self.iteration_time if self.iteration_time > 0 else 0.0

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization: the model's forward and backward FLOPs per second (no
        recomputation counted) over the peak of the devices the plan uses, for the training
        dtype (Narayanan et al. 2021's definition; idle devices are reported apart)."""
        used = self.use.used if self.use is not None else self.topology.num_devices
        peak = used * self.topology.device.peak(self.partition.costs.model.dtype)
        return model_flops(self.partition) / (self.iteration_time * peak) if self.iteration_time > 0 else 0.0


def mesh_list(plan: Partition) -> list:
    """``[hosts, devices per host]`` of every mesh, or, for a plan of the unequal search
    (:mod:`solver_planner.stages.unequal`), each pipeline stage's."""
    c = plan.costs
    if getattr(c, "layout", None) is None:
        return c.shape.as_list()
    return [c.of(m).shape.as_list() for m in range(c.stages)]


def model_flops(plan: Partition) -> float:
    """Forward and backward FLOPs of one iteration over the global batch."""
    m = plan.costs.model
    return float((m.column("forward") + m.column("backward")).sum()) * m.global_batch


def members(kind: str, part: Partition) -> list[Schedule]:
    """The schedules of family ``kind`` that ``part`` can run: the family's members on its
    stages, or, with model chunks (interleaved 1F1B, ZB-V), the one schedule of its chunk
    count."""
    if kind in VIRTUAL:
        return [Schedule(kind, virtual=part.virtual)]
    if part.virtual > 1:
        raise ValueError(f"{kind} runs one model chunk per stage; the plan has {part.virtual}")
    return family(kind, part.costs.stages)


def simulate_plan(plan: Partition, schedules: list[Schedule], transfers) -> tuple[PipelineRun, dict[str, float]]:
    """The fastest member of ``schedules`` that fits in memory when the boundaries run
    ``transfers``; and the simulated time of each member (the ones that do not fit too)."""
    best: PipelineRun | None = None
    tried: dict[str, float] = {}
    memory = plan.costs.device_memory
    # A simulation reads its schedule only through the meshes' op orders (stages/pipeline.py),
    # and eager-1F1B's larger eagerness levels give the same orders once every stage's warm-up
    # is capped by the micro-batches: each distinct order is simulated once (GPT-3 175B on
    # 100 000 GPUs, 65 stages of 8 micro-batches: 8 distinct of 16 members).  Equal times keep
    # the first member, as before.
    seen: dict[tuple, float] = {}
    for s in schedules:
        key = tuple(map(tuple, mesh_orders(plan, s, transfers)))
        if key in seen:
            tried[str(s)] = seen[key]
            continue
        # the fast simulator, equal to the engine bit for bit; the engine builds the task
        # graph only for the timeline of the member returned, when it is read (4 096
        # micro-batches on 4 stages: 37 s simulating every member with the engine)
        run = pipeline_run(plan, s, transfers)[0]
        fits = max(run.peak_memory) <= memory
        tried[str(s)] = seen[key] = run.iteration_time if fits else float("inf")
        if fits and (best is None or run.iteration_time < best.iteration_time):
            best = run
    if best is None:
        raise InfeasibleError("no schedule of the family fits in device memory with the plan's boundaries")
    return best, tried


# The parts of the plan's breakdown, in the order they are shown, with what each is.
BREAKDOWN_PARTS = {
    "compute": "forward and backward kernels (recomputation included) on the critical path",
    "tensor_parallel": "tensor-parallel all-reduces and ZeRO-3 parameter gathers inside those passes",
    "pipeline_transfer": "activations and gradients between stages that the critical path waits for",
    "gradient_reduction": "data-parallel gradient buckets and tied-copy all-reduces not hidden behind compute",
    "parameter_gather": "the distributed optimizer's parameter all-gathers a chunk's first forward waits for"
                        " (--overlap-param-gather)",
    "optimizer": "the optimizer step",
    "idle": "time on the critical path that no task explains (none in a pipeline)",
}
_PART_OF = {"activation": "pipeline_transfer", "gradient": "pipeline_transfer",
            "gradient-reduction": "gradient_reduction", "optimizer": "optimizer"}


def breakdown(plan: TrainingPlan) -> dict[str, float]:
    """Where the iteration goes, along its critical path (seconds; the parts add up to the
    iteration time, and work that overlaps other work is counted once).

    The critical path (:func:`solver_planner.simulate.critical.critical_path`) is the chain
    of tasks, each starting when the one before it ends, from the start of the iteration to
    its end.  Each task on it counts for its kind (:data:`BREAKDOWN_PARTS`); a forward or
    backward pass splits into its kernels (``compute``, as the compute model times them)
    and the collectives inside it (``tensor_parallel``)."""
    from ..simulate.critical import critical_path

    out = dict.fromkeys(BREAKDOWN_PARTS, 0.0)
    tl = plan.run.timeline
    path = list(critical_path(tl))
    for n, (task, begin, finish) in enumerate(path):
        length = finish - begin
        if task is None:
            # a chunk's first forward held back until its first parameter gather is done
            after = path[n + 1][0] if n + 1 < len(path) else None
            ready = tl[after].args.get("gather_ready", 0.0) if after is not None else 0.0
            gather = min(length, ready)
            out["parameter_gather"] += gather
            out["idle"] += length - gather
            continue
        rec = tl[task]
        if rec.category in ("forward", "backward"):
            kernels = min(length, rec.args.get("compute", length))
            if length - kernels <= 1e-9 * length:      # rounding of the sum the op's time came from
                kernels = length
            gather = min(length - kernels, rec.args.get("gather_wait", 0.0))
            collectives = length - kernels - gather
            if gather and collectives <= 1e-9 * length:  # the same rounding, of the wait's sum
                gather, collectives = gather + collectives, 0.0
            out["compute"] += kernels
            out["parameter_gather"] += gather
            out["tensor_parallel"] += collectives
        else:
            out[_PART_OF.get(rec.category, "idle")] += length
    return out


@dataclass(frozen=True)
class SearchOptions:
    """What the stage search of a plan was asked (``solver-planner plan``'s options): the plan
    file records them, so that ``check`` can run the same search again and re-derive its
    claims (status, bound, gap, the candidates composed)."""

    method: str = "auto"
    stages: int | None = None
    config: Config | None = None
    split: tuple[int, ...] | None = None
    candidates: int = 1
    time_limit: float = 10.0
    seed: int = 0
    target: str = "native"          # a framework's space only (solver_planner.targets)
    devices: int | None = None      # at most this many of the cluster's devices (stages/devices.py)
    meshes: str = "equal"           # "unequal": Alpa's space too (stages/unequal.py)
    budget: int = DEFAULT_BUDGET    # subspaces the branch and bound solves before it stops
    simulations: int = DEFAULT_SIMULATIONS      # simulated tasks per listed plan
    gap: float = DEFAULT_GAP        # the search stops at this gap once its bound stops rising

    def as_dict(self) -> dict:
        return {"method": self.method, "stages": self.stages,
                "config": None if self.config is None else str(self.config),
                "split": None if self.split is None else list(self.split), "candidates": self.candidates,
                "time_limit": self.time_limit, "seed": self.seed, "target": self.target,
                **({"devices": self.devices} if self.devices is not None else {}),
                **({"meshes": self.meshes} if self.meshes != "equal" else {}),
                # written when asked for (plan files from before these options have neither)
                **({"budget": self.budget} if self.budget != DEFAULT_BUDGET else {}),
                **({"simulations": self.simulations} if self.simulations != DEFAULT_SIMULATIONS else {}),
                **({"gap": self.gap} if self.gap != DEFAULT_GAP else {})}


def search_stages(topology: Topology, model: ModelSpec, schedule: str, options: SearchOptions,
                  compute: str = "efficiency"):
    """The stage planner's ``options.candidates`` fastest plans for the ``schedule`` family
    (a :class:`~solver_planner.stages.report.StagesReport`; its ``topology`` is the part of
    the cluster they use), and the claims the plan file records of that search."""
    o = options
    rep = plan_stages(topology, model, schedule, o.method, o.time_limit, o.seed, stages=o.stages, config=o.config,
                      layer_counts=o.split, top=max(1, o.candidates), compute=compute, target=o.target,
                      devices=o.devices, meshes=o.meshes, budget=o.budget, simulations=o.simulations, gap=o.gap)
    search = {"options": o.as_dict(), "status": rep.result.status.value, "method": rep.result.method,
              "bound": rep.result.bound, "gap": rep.result.gap, "objective": rep.best.time,
              "candidates": len(rep.result.solutions)}
    return rep, search


def compose_candidates(topology: Topology, model: ModelSpec, rep, search: dict, schedule: str, cross_mesh: str,
                       overlap: bool, options: SearchOptions, proof_timeout: float = 30.0,
                       progress: Callable[[str], None] | None = None, known: TrainingPlan | None = None
                       ) -> TrainingPlan:
    """Compose every candidate of the search ``rep`` with its real boundary schedules and
    return the fastest simulated one; ``search["composed"]`` says what each became.
    ``known``: a plan already composed for one of the candidates' partitions (``check``
    brings the one it verified), used instead of composing that candidate again."""
    say = progress or (lambda _t: None)
    best: TrainingPlan | None = None
    composed: list[dict] = []
    failure: InfeasibleError | None = None
    for n, cand in enumerate(rep.result.solutions):
        say(f"composing candidate {n + 1} of {len(rep.result.solutions)}")
        entry = {"stage_planner_time": cand.time, "mesh": mesh_list(cand.plan),
                 "microbatches": cand.plan.costs.microbatches}
        if known is not None and known.partition == cand.plan:
            out = known
            out.stage_planner_time, out.search = cand.time, search
        else:
            try:
                out = compose(topology, model, cand.plan, schedule, cross_mesh, overlap, options.time_limit,
                              options.seed, proof_timeout, progress, stage_planner_time=cand.time, search=search)
            except InfeasibleError as exc:    # its boundaries push every schedule out of memory
                failure = failure or exc
                composed.append({**entry, "iteration_time": None, "reason": str(exc)})
                continue
        composed.append({**entry, "iteration_time": out.iteration_time})
        if best is None or out.iteration_time < best.iteration_time:
            best = out
    if best is None:
        assert failure is not None
        raise failure
    search["composed"] = composed
    best.use = rep.use
    return best


def make_plan(topology: Topology, model: ModelSpec, schedule: str | None = "1f1b", method: str = "auto",
              cross_mesh: str = "broadcast", overlap: bool = True, stages: int | None = None,
              config: Config | None = None, layer_counts: tuple[int, ...] | None = None,
              time_limit: float = 10.0, seed: int = 0, proof_timeout: float = 30.0, candidates: int = 1,
              progress: Callable[[str], None] | None = None, compute: str = "efficiency",
              target: str = "native", devices: int | None = None, meshes: str = "equal",
              budget: int = DEFAULT_BUDGET, simulations: int = DEFAULT_SIMULATIONS,
              gap: float = DEFAULT_GAP) -> TrainingPlan:
    """Plan ``model`` on ``topology`` end to end.

    The stage planner lists its ``candidates`` fastest plans for the ``schedule`` family
    (``method``, ``stages``, ``config``, ``layer_counts`` as for ``solver-planner stages``;
    one per mesh shape and micro-batch count), each is composed with its real boundary
    schedules (:func:`compose`), and the fastest simulated one is the plan: the stage
    planner prices a boundary as point-to-point lanes, the plan as the broadcast schedule
    the resharding scheduler finds, and the two can rank plans differently.

    ``schedule`` None: eager-1F1B natively; under a framework ``target`` the schedule of the
    fastest plan of a search over every schedule the target runs, then planned as above (the
    plan file records that schedule, so ``check`` searches it again the same way).

    ``devices``: at most this many of the cluster's devices; the plan runs on the first ones
    the stage search uses (``plan.use`` says how many and why the rest idle).
    ``meshes="unequal"``: stages may take sub-meshes of different shapes (Alpa's space).
    ``budget``, ``simulations``, ``gap``: the stage search's limits (``stages --budget/--sim-budget/--gap``).
    """
    say = progress or (lambda _t: None)
    if schedule is None and target == "native":
        # what the command and the API pass when no schedule is given (this function's own
        # keyword default stays 1f1b): the resharding paper's eager-1F1B, whose family holds
        # 1F1B, so its plan is never slower than the best 1F1B plan
        schedule = "eager-1f1b"
    if schedule is None:
        say("searching every schedule the target runs")
        first = plan_stages(topology, model, None, method, time_limit, seed, stages=stages, config=config,
                            layer_counts=layer_counts, compute=compute, target=target, devices=devices,
                            budget=budget, simulations=simulations, gap=gap)
        schedule = first.best.schedule.kind
    if cross_mesh == "free" and not overlap:
        # a free transfer takes no time: synchronous or not, the iteration is the same
        raise OptionError("--no-overlap with --cross-mesh free: free transfers have nothing to overlap")
    options = SearchOptions(method, stages, config, None if layer_counts is None else tuple(layer_counts),
                            candidates, time_limit, seed, target, devices, meshes, budget, simulations, gap)
    t0 = time.perf_counter()
    say("searching stages")
    rep, search = search_stages(topology, model, schedule, options, compute)
    elapsed = time.perf_counter() - t0
    best = compose_candidates(rep.topology, model, rep, search, schedule, cross_mesh, overlap, options,
                              proof_timeout, progress)
    best.solve_times = {"stages": elapsed, **best.solve_times}
    return best


def compose(topology: Topology, model: ModelSpec, part: Partition, schedule: str = "1f1b",
            cross_mesh: str = "broadcast", overlap: bool = True, time_limit: float = 10.0, seed: int = 0,
            proof_timeout: float = 30.0, progress: Callable[[str], None] | None = None,
            stage_planner_time: float = 0.0, search: dict | None = None) -> TrainingPlan:
    """Place and prove every stage of ``part``, schedule every boundary, simulate the iteration.

    Parameters
    ----------
    schedule : the family the iteration runs ('1f1b', 'gpipe', 'eager-1f1b'); its fastest
        member that fits, with the boundaries' real schedules, is the plan's.
    cross_mesh : 'broadcast' (the resharding paper §3's schedules), 'send-recv' (Alpa's baseline) or
        'free' (cross-mesh communication costs nothing: the resharding paper's "Signal Send/Recv" bound).
    overlap : False makes each boundary transfer synchronous (it holds the compute streams
        of both stages while it runs: the resharding paper §5.3's "Broadcast" row); True runs it on the
        communication streams, overlapping computation ("Overlap", and eager-1F1B).
    """
    say = progress or (lambda _t: None)
    times: dict[str, float] = {}
    c = part.costs
    t0 = time.perf_counter()
    say("placing stages and proving their gradient programs")
    memory = [float(m) for m in part.memory([1] * len(part.stages))]
    parts = stage_parts(part, topology, memory, proof_timeout)
    times["placement_and_proofs"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    cost = CostModel(topology)
    bounds = solve_boundaries(part, parts, topology, cost, cross_mesh, time_limit=time_limit, seed=seed,
                              progress=say)
    times["resharding"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    say("simulating the iteration")
    transfers = transfers_of(bounds, part.mesh, synchronous=not overlap)
    run, tried = simulate_plan(part, members(schedule, part), transfers)
    free_time = iteration(part, run.schedule, {b.key: (0.0, ()) for b in bounds}).time
    times["simulation"] = time.perf_counter() - t0
    for stage in parts:
        stage.memory = run.peak_memory[stage.stage]
    return TrainingPlan(topology, model, part, run.schedule, schedule, parts, bounds, run, cross_mesh, times,
                        stage_planner_time=stage_planner_time, free_time=free_time, tried=tried,
                        search=search or {}, overlap=overlap)
