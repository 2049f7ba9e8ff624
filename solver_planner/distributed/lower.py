"""Lowering: reduction programs and broadcast schedules -> per-rank torch.distributed calls.

Both functions are pure: they return a :class:`DistributedPlan` and touch no process.

Reduction programs (P² §3.2) follow the one meaning of :mod:`..reduction.layout`:
every rank's buffer is ``k`` chunks, chunk ``c`` at row ``c``; a call hands torch each
member's held chunks in ascending order and writes what comes back at each chunk's own
row.  :func:`..reduction.layout.buffers` says, member by member, which rows go in and come
out in the order torch reads and writes them (torch orders a group's ranks ascending, so
a ReduceScatter whose group is written in another order hands each rank its block of the
program's order by laying its input out in torch's); the collectives are

* AllReduce -> ``all_reduce``;  Reduce -> ``reduce`` to the first member (§3.2);
* ReduceScatter -> ``reduce_scatter_tensor``;  AllGather -> ``all_gather_into_tensor``;
* Broadcast -> ``broadcast`` from the first member of the root's chunks.

A group in which nobody holds anything (or a Broadcast whose root holds nothing) issues
no call.  Where a member's rows are not one contiguous ascending run, the call needs a
local copy before (pack) or after (unpack) it: the plan lists those ranks with each
step, and the cost model charges them (:meth:`CostModel.copy_time`).  A call torch cannot
run (members with buffers of different sizes, a scatter that does not divide, an
all-gather of overlapping chunks) raises :class:`~solver_planner.errors.LoweringError`
naming the step and the group.

Cross-mesh resharding (the resharding paper §3): every unit task becomes one ``broadcast`` from its
chosen sender over the group {sender} + receivers, carrying the task's slice: the sender
cuts it out of its source tile, each receiver writes it into its destination tile.  Every
rank issues its broadcasts in the schedule's global order (start time, then task index),
which cannot deadlock: the earliest unfinished broadcast has all its members waiting on it.
"""

from __future__ import annotations

from typing import Sequence

from ..cost import Collective, CostModel
from ..errors import LoweringError
from ..reduction.dsl import COLLECTIVE_NAMES
from ..reduction.layout import buffers, contiguous, trace
from ..resharding.mesh import Box
from ..resharding.plan import ReshardingPlan
from ..resharding.schedule import TIME_UNIT
from ..spec.model import DTYPE_BYTES
from .plan import Call, DistributedPlan, PlanStep

__all__ = ["lower_reduction", "lower_resharding", "CHUNK_DTYPE"]

# Reductions run on float32 buffers holding small integers: sums of up to 2^14 values of
# magnitude <= 1000 are exact, so "the exact sum" can be checked with ==.
CHUNK_DTYPE = "float32"

Steps = Sequence[tuple[Collective, Sequence[Sequence[int]]]]
OPS = {Collective.ALLREDUCE: "all_reduce", Collective.REDUCE: "reduce", Collective.BROADCAST: "broadcast",
       Collective.REDUCESCATTER: "reduce_scatter_tensor", Collective.ALLGATHER: "all_gather_into_tensor"}


class _Groups:
    """Process groups in first-use order, each a sorted tuple of ranks."""

    def __init__(self) -> None:
        self.index: dict[tuple[int, ...], int] = {}

    def __call__(self, members: Sequence[int]) -> int:
        key = tuple(sorted(members))
        return self.index.setdefault(key, len(self.index))

    def all(self) -> tuple[tuple[int, ...], ...]:
        return tuple(sorted(self.index, key=self.index.__getitem__))


def lower_reduction(steps: Steps, num_devices: int, chunks: int, reduction_groups: Sequence[Sequence[int]],
                    chunk_elems: int, cost: CostModel | None = None, algorithm: str = "ring",
                    labels: Sequence[str] | None = None, title: str = "reduction program") -> DistributedPlan:
    """Per-rank calls of ``steps`` (device groups over ranks ``0..num_devices-1``).

    ``chunk_elems`` elements of float32 per chunk; with ``cost`` every step carries the
    cost model's prediction for its buffers (NCCL's size convention, as in
    :class:`~solver_planner.reduction.ranking.StepCoster`), local copies included.
    """
    if chunks < 1 or chunk_elems < 1:
        raise ValueError("a buffer needs at least one chunk of one element")
    chunk_bytes = chunk_elems * DTYPE_BYTES[CHUNK_DTYPE]
    steps = [(Collective.parse(kind), groups) for kind, groups in steps]
    tr = trace(num_devices, chunks, steps)
    if tr.problem is not None:
        raise LoweringError(f"{tr.problem}; torch.distributed cannot run that call")
    calls: list[list[Call]] = [[] for _ in range(num_devices)]
    groups = _Groups()
    plan_steps: list[PlanStep] = []
    clock = 0.0
    for s, (kind, step_groups) in enumerate(steps):
        active, sizes, copying, copied = [], [], [], 0
        for call in tr.calls[s]:
            bufs = buffers(call)
            if not bufs or not call.before[0]:
                continue  # nothing held, or a broadcast root holding nothing: no call
            gi, root = groups(call.group), call.group[0]
            for d in call.group:
                send, recv = bufs[d]
                keeps = kind is not Collective.REDUCE or d == root
                calls[d].append(Call(s, OPS[kind], gi, root if kind in (Collective.REDUCE, Collective.BROADCAST)
                                     else None, send if send else None, recv if keeps and recv else None))
                # A buffer torch cannot read or write in place is copied: read from the
                # buffers here, independently of layout.copies (which the ranking uses; a
                # test compares the two predictions).
                staged = len(send) * (not contiguous(send)) + len(recv) * (not contiguous(recv))
                if staged:
                    copying.append(d)
                    copied = max(copied, staged)
            active.append(list(call.group))
            moved = len(bufs[root][1]) if kind is Collective.ALLGATHER else max(len(bufs[root][0]), len(bufs[root][1]))
            sizes.append(moved * chunk_bytes)  # NCCL's convention: the all-gather's output
        predicted = 0.0
        if cost is not None and active:
            predicted = cost.collective(kind, active, sizes, algorithm).time + cost.copy_time(copied * chunk_bytes)
        label = labels[s] if labels is not None else f"{COLLECTIVE_NAMES[kind]} on {[list(g) for g in step_groups]}"
        ranks = tuple(sorted(d for g in active for d in g))
        plan_steps.append(PlanStep(label, ranks, max(sizes, default=0.0), predicted, clock, tuple(sorted(copying))))
        clock += predicted
    sum_over: list[list[int] | None] = [None] * num_devices
    for g in reduction_groups:
        for d in g:
            sum_over[d] = sorted(g)
    missing = [d for d, g in enumerate(sum_over) if g is None]
    if missing:
        raise ValueError(f"devices {missing} are in no reduction group")
    return DistributedPlan(title, "reduction", "chunks", CHUNK_DTYPE, tuple(range(num_devices)), groups.all(),
                           tuple(plan_steps), tuple(tuple(c) for c in calls),
                           {"chunks": chunks, "chunk_elems": chunk_elems, "sum_over": sum_over}, barriers=True)


def lower_resharding(plan: ReshardingPlan, title: str | None = None) -> DistributedPlan:
    """Per-rank ``broadcast`` calls of a broadcast schedule; ranks are the meshes' devices in order."""
    if plan.strategy != "broadcast":
        raise LoweringError("only broadcast schedules are lowered (the resharding paper §3.1); "
                            f"this plan uses {plan.strategy}")
    prob = plan.problem
    devices = tuple(sorted(set(prob.src.mesh.flat) | set(prob.dst.mesh.flat)))
    rank = {d: r for r, d in enumerate(devices)}
    src_box: list[Box | None] = [None] * len(devices)
    dst_box: list[Box | None] = [None] * len(devices)
    for layout, boxes in ((prob.src, src_box), (prob.dst, dst_box)):
        for i, row in enumerate(layout.mesh.devices):
            for j, d in enumerate(row):
                boxes[rank[d]] = layout.box_of(i, j)
    groups = _Groups()
    calls: list[list[Call]] = [[] for _ in devices]
    steps = []
    for s, i in enumerate(plan.schedule.order()):
        task, sender = plan.tasks[i], plan.sender(i).device
        members = sorted({rank[sender]} | {rank[r] for r in task.receivers})
        gi = groups(members)
        root = rank[sender]
        for r in members:
            if r == root:
                calls[r].append(Call(s, "broadcast", gi, root, _local(task.slice, src_box[r]), None))
            else:
                calls[r].append(Call(s, "broadcast", gi, root, None, _local(task.slice, dst_box[r])))
        label = (f"task {i}: {prob.describe_slice(task.slice)} from device {sender}"
                 f" to {list(task.receivers)}")
        start, end = plan.schedule.start[i], plan.schedule.end[i]
        steps.append(PlanStep(label, tuple(members), float(task.nbytes), (end - start) * TIME_UNIT, start * TIME_UNIT))
    as_lists = lambda boxes: [None if b is None else [list(x) for x in b] for b in boxes]  # noqa: E731
    return DistributedPlan(title or f"resharding '{prob.name}': {prob.src.spec} on {prob.src.mesh} -> {prob.dst.spec}"
                           f" on {prob.dst.mesh}", "reshard", "tiles", prob.dtype, devices, groups.all(), tuple(steps),
                           tuple(tuple(c) for c in calls),
                           {"shape": list(prob.shape), "src": as_lists(src_box), "dst": as_lists(dst_box)},
                           barriers=False)


def _local(part: Box, tile: Box | None) -> Box:
    """``part`` (global coordinates) inside ``tile`` (a rank's own box), in the tile's coordinates."""
    if tile is None:
        raise LoweringError(f"slice {part} is sent from or to a rank that holds no tile")
    out = []
    for (a, b), (lo, hi) in zip(part, tile):
        if not (lo <= a and b <= hi):
            raise LoweringError(f"slice {part} is not inside the rank's tile {tile}")
        out.append((a - lo, b - lo))
    return tuple(out)
