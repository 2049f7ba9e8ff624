"""A verified plan as plain data every rank runs: :class:`RunJob` (no torch, picklable).

Built from the plan ``check`` re-derived (:attr:`solver_planner.plan.check.CheckReport.plan`),
so nothing a file claims is used unverified:

* each stage's layers, its rank grid (the ``DeviceMesh`` of ``launch.stages[p].mesh``: rows
  data replicas, columns tensor positions), recomputation, and its gradient program lowered
  to calls over its data groups (:func:`solver_planner.distributed.lower.lower_reduction`
  of the proven program on the stage's synthesis hierarchy);
* each boundary's broadcast schedule lowered to per-rank ``broadcast`` calls
  (:func:`solver_planner.distributed.lower.lower_resharding`), in global ranks, with the
  tile each rank sends from or receives into (a ``[samples, elements]`` view of the
  micro-batch's activation or gradient);
* the pipeline schedule: torch's ``ScheduleGPipe`` / ``Schedule1F1B``, or for eager-1F1B
  (and weight delaying) each stage's action list (``F``, ``B``, ``I`` input gradients, ``W``
  weight gradients) from :func:`solver_planner.stages.pipeline.stage_orders`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import OptionError
from ..reduction.dsl import parse_program
from ..reduction.verify import system_steps
from ..spec.layers import FLOAT_DTYPES
from ..spec.model import ModelSpec
from .model import ModelShape, model_shape

__all__ = ["StageJob", "BoundaryJob", "RunJob", "run_job", "ACTION_NAMES", "FsdpMode", "FSDP_MODES"]

# the stage planner's ops -> torch pipelining's computation types (F, full B, input / weight gradient)
ACTION_NAMES = {"F": "F", "B": "B", "BA": "I", "BW": "W"}


@dataclass(frozen=True)
class FsdpMode:
    """How FSDP2 runs one ZeRO stage (ZeRO §5.1; the memory and traffic ``stages/memory.py``
    prices).  torch's pipelining alone turns FSDP's gradient sync and post-backward resharding
    off for every backward and reduces after the stage's last (``PipelineStage.
    backward_maybe_with_nosync``, ``perform_reduce_grad``): gradients accumulate unsharded and
    parameters stay gathered, which is ZeRO-1's memory.  ZeRO-2
    and ZeRO-3 instead reduce-scatter every micro-batch's gradients into the shards, as DeepSpeed
    and FSDP2 without pipelining do, and ZeRO-3 frees the gathered parameters after every
    forward and backward."""

    reshard_after_forward: bool
    sync_every_backward: bool
    reshard_after_backward: bool
    text: str


_WHOLE = ("parameters and gradients whole until the stage's last backward, one reduce-scatter per step,"
          " optimizer state sharded")

FSDP_MODES = {
    "zero-1": FsdpMode(False, False, False, f"{_WHOLE} (ZeRO-1)"),
    "distributed": FsdpMode(False, False, False, f"{_WHOLE} (Megatron-LM's distributed optimizer)"),
    "zero-2": FsdpMode(False, True, False, "parameters whole, every micro-batch's gradients reduce-scattered into"
                       " the shards (ZeRO-2)"),
    "zero-3": FsdpMode(True, True, True, "parameters gathered before every forward and backward and freed after,"
                       " every micro-batch's gradients reduce-scattered into the shards (ZeRO-3)"),
}


@dataclass
class StageJob:
    index: int
    first: int
    last: int
    grid: list[list[int]]                   # ranks: grid[data][tensor]
    recompute: str                          # none | selective | full | selective-op
    program: dict[str, Any] | None          # lowered gradient program in global ranks (calls by rank), or None
    program_text: str = "none"

    @property
    def ranks(self) -> list[int]:
        return [r for row in self.grid for r in row]

    @property
    def data(self) -> int:
        return len(self.grid)

    @property
    def tensor(self) -> int:
        return len(self.grid[0])


@dataclass
class BoundaryJob:
    """One direction of the boundary between stage ``p`` and ``p + 1``: 'act' forward,
    'grad' back.  ``calls[rank]`` lists ``(members, root, box)`` in issue order: ``box``
    is the rank's rows and columns ``((r0, r1), (c0, c1))`` of its ``[samples, elements]``
    tile that it sends (root) or receives into."""

    kind: str
    stage: int                              # the earlier stage of the pair
    shape: tuple[int, int]                  # one micro-batch's tensor: samples x elements per sample
    groups: list[list[int]]                 # member sets, in first-use order
    calls: dict[int, list[tuple[list[int], int, tuple]]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.kind} {self.stage}"


@dataclass
class RunJob:
    shape: ModelShape
    world: int
    stages: list[StageJob]
    boundaries: dict[str, BoundaryJob]
    microbatches: int
    microbatch_size: int
    schedule: str                           # gpipe | 1f1b | actions
    orders: dict[int, list[tuple[str, int]]] | None
    schedule_name: str
    optimizer: str                          # adam | sgd
    sharding: str                           # optimizer sharding (none, zero-1/2/3, distributed): FSDP2 over each stage's data dimension
    sequence_parallel: bool
    predicted_iteration_time: float
    lanes: bool = False                     # every boundary is rank k -> rank k, whole tiles: torch's P2P runs it
    overlap: bool = False                   # the program runs per bucket during the last backward (gradient_overlap)
    bucket_elements: int = 0                # a bucket's elements: gradient_bucket bytes in the reduction's type
    steps: int = 3
    seed: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def sharded(self) -> bool:
        return self.sharding != "none"

    @property
    def global_batch(self) -> int:
        return self.microbatches * self.microbatch_size

    def stage_of(self, rank: int) -> StageJob:
        return next(s for s in self.stages if rank in s.ranks)


def _program(part, level_names) -> dict[str, Any] | None:
    """The stage's proven gradient program, lowered (:func:`lower_reduction`) and moved to
    global ranks: ``groups`` of global ranks, ``calls[rank]`` with global roots, in the
    interpreter's call format, so :func:`solver_planner.distributed.interpreter.do_call`
    runs it as it is (local device ``j`` of the stage is ``part.devices[j]``)."""
    from ..distributed.lower import lower_reduction
    from ..plan.parts import stage_lowering

    if part.program == "none" or part.proof == "not an all-reduce":
        return None
    lowering = stage_lowering(part.matrix, part.mesh, level_names)
    steps = system_steps(lowering, parse_program(part.program))
    plan = lower_reduction(steps, len(part.devices), lowering.hierarchy.size, lowering.reduction_groups(), 1,
                           title=part.program).as_dict()
    devices = part.devices
    plan["groups"] = [[devices[r] for r in g] for g in plan["groups"]]
    plan["calls"] = {devices[local]: [[st, op, g, None if root is None else devices[root], send, recv]
                                      for st, op, g, root, send, recv in calls]
                     for local, calls in enumerate(plan["calls"])}
    return plan


def _boundary(b, stage: int) -> BoundaryJob:
    from ..distributed.lower import lower_resharding

    lowered = lower_resharding(b.plan)
    devices = lowered.devices
    groups = [[devices[r] for r in g] for g in lowered.groups]
    job = BoundaryJob(b.kind, stage, tuple(b.problem.shape), groups)
    for local, calls in enumerate(lowered.calls):
        rank = devices[local]
        out = []
        for c in calls:
            box = c.send if c.send is not None else c.recv
            out.append((groups[c.group], devices[c.root], tuple(tuple(x) for x in box)))
        if out:
            job.calls[rank] = out
    return job


def _pairwise(b: BoundaryJob, stages: list[StageJob]) -> bool:
    """Whether the boundary's schedule is: the k-th rank of one stage sends its whole tile to
    the k-th rank of the other, and nothing else -- what torch's point-to-point pipeline
    lanes do, so they can run it."""
    src, dst = (stages[b.stage], stages[b.stage + 1]) if b.kind == "act" else (stages[b.stage + 1], stages[b.stage])
    if len(src.ranks) != len(dst.ranks) or src.data != dst.data:
        return False
    whole = ((0, b.shape[0] // src.data), (0, b.shape[1]))
    for a, z in zip(src.ranks, dst.ranks):
        want = [(sorted([a, z]), a, whole)]
        if [(sorted(m), r, box) for m, r, box in b.calls.get(a, [])] != want or \
                [(sorted(m), r, box) for m, r, box in b.calls.get(z, [])] != want:
            return False
    return True


def run_job(plan, model: ModelSpec, steps: int = 3, seed: int = 0) -> RunJob:
    """What every rank runs for ``plan`` (a re-derived, verified
    :class:`~solver_planner.plan.compose.TrainingPlan`); :class:`OptionError` when ``run``
    cannot run it, saying why."""
    from ..plan.boundaries import transfers_of
    from ..stages.pipeline import stage_orders

    shape = model_shape(model)
    if plan.cross_mesh == "free":
        raise OptionError("the plan prices cross-mesh communication as free (an upper bound on speed, not a plan to"
                          " run): plan it with --cross-mesh broadcast")
    if plan.cross_mesh != "broadcast":
        raise OptionError(f"the plan moves its boundaries with {plan.cross_mesh}; run executes broadcast schedules"
                          " (plan with --cross-mesh broadcast)")
    part = plan.partition
    if part.virtual > 1:
        raise OptionError(f"the plan runs {part.virtual} model chunks per stage ({plan.schedule}); run executes one"
                          " chunk per stage so far: plan, check and the pictures take such plans, run does not")
    S = part.costs.stages
    far = [(p, q) for (p, q) in part.channels if q != p + 1]
    if far:
        raise OptionError(f"stage {far[0][0]} feeds stage {far[0][1]} directly (a skip connection); torch's pipeline"
                          " runtime passes tensors only to the next stage")
    training = model.training
    names = plan.topology.level_names
    stages = []
    for s in plan.parts:
        grid = s.grid()
        if shape.kind == "gpt" and s.tensor > 1 and shape.heads % s.tensor:
            raise OptionError(f"stage {s.index}: {shape.heads} attention heads do not split over tensor degree"
                              f" {s.tensor}")
        stages.append(StageJob(s.index, s.first, s.last, grid, s.recompute, _program(s, names), s.program))
    boundaries = {}
    for b in plan.boundaries:
        lo = min(b.src, b.dst)
        job = _boundary(b, lo)
        want = shape.boundary_elements(plan.parts[lo].last)
        if job.shape != (part.costs.micro_size, want):
            # the schedule's tiles are boxes of this tensor: a different size would move wrong data
            raise OptionError(f"boundary {b.kind} {b.src}->{b.dst}: the plan moves a {job.shape[0]} x {job.shape[1]}"
                              f" tensor, the model's is {part.costs.micro_size} x {want} (samples x elements);"
                              " plan with the same model spec")
        boundaries[job.key] = job
    lanes = all(_pairwise(job, stages) for job in boundaries.values())
    sched = plan.schedule
    if sched.kind in ("eager-1f1b", "zb-h1"):       # torch's action lists run either order
        transfers = transfers_of(plan.boundaries, plan.partition.mesh, synchronous=not plan.overlap)
        orders = {p: [(ACTION_NAMES[op], m) for op, m in order]
                  for p, order in enumerate(stage_orders(part, sched, transfers))}
        kind = "actions"
    else:
        orders, kind = None, sched.kind
    sharding = training.optimizer_sharding if training is not None else "none"
    notes = [f"model: {shape.describe()}", "every tensor is float32 (the plan's dtype sets its times, not the run's)"]
    target = (plan.search.get("options") or {}).get("target", "native") if plan.search else "native"
    if target != "native":
        # the plan is priced as the framework runs it (its buckets, reduction type, gathers);
        # run executes it on torch.distributed, so its prediction is the framework's
        notes.append(f"planned for {target}: the prediction prices {target}'s own runtime (its gradient buckets and"
                     " defaults); run executes the plan's stages and programs on torch.distributed")
    if sharding != "none" and orders is not None and any(op == "I" for order in orders.values() for op, _ in order):
        # FSDP2 under torch's split backward (input-gradient, then weight-gradient actions)
        # reduces the gradients before the weight half has run: silently wrong sums (torch 2.13)
        orders = {p: [("B", m) if op == "I" else (op, m) for op, m in order if op != "W"]
                  for p, order in orders.items()}
        notes.append("optimizer sharding with weight delaying: each backward runs whole (B at its input-gradient"
                     " slot), since FSDP2 reduces gradients before a delayed weight gradient has run; the numbers"
                     " are the plan's, the weight-gradient timing is not")
    overlap = bool(training is None or training.gradient_overlap) and sharding == "none"
    bucket_elements = 0
    if overlap:
        reduce_type = (training.gradient_reduce_dtype or training.dtype) if training else "float32"
        cap = training.gradient_bucket if training else 25 * 2**20
        bucket_elements = max(1, int(cap // FLOAT_DTYPES[reduce_type]))
        split = orders is not None and any(op == "W" for order in orders.values() for op, _ in order)
        notes.append(f"gradient program per bucket of {cap / 2**20:g} MiB of {reduce_type} ({bucket_elements} elements),"
                     + (" each layer's after the stage's last weight-gradient pass (torch's split backward sets the"
                        " weight gradients itself, after no hook)" if split else
                        " each layer's as soon as the stage's last backward has produced them"))
    if sharding != "none":
        notes.append(f"optimizer sharding {sharding}: FSDP2 over each stage's data-parallel ranks, {FSDP_MODES[sharding].text};"
                     " its reduce-scatter replaces the gradient program")
    return RunJob(shape=shape, world=plan.use.used if plan.use is not None else plan.topology.num_devices, stages=stages, boundaries=boundaries,
                  microbatches=part.costs.microbatches, microbatch_size=part.costs.micro_size, schedule=kind,
                  orders=orders, schedule_name=str(sched), optimizer=training.optimizer if training else "adam",
                  sharding=sharding, sequence_parallel=bool(training and training.sequence_parallel),
                  predicted_iteration_time=plan.iteration_time, lanes=lanes, overlap=overlap,
                  bucket_elements=bucket_elements, steps=steps, seed=seed, notes=notes)
