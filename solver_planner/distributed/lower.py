"""Lowering: reduction programs and broadcast schedules -> per-rank torch.distributed calls.

Both functions are pure: they return a :class:`DistributedPlan` and touch no process.

Reduction programs (seed 000 §3.2).  Every rank starts with ``k`` chunks (the reduction
group size, as in :func:`~solver_planner.reduction.verify.verify_steps`, so every
hierarchical scatter divides).  The lowering tracks, rank by rank, which chunks it holds
and in which order, exactly as the semantics does:

* AllReduce -> ``all_reduce`` of the held chunks, in place;
* ReduceScatter -> ``reduce_scatter_tensor``: the member at position ``n`` of the group
  keeps the ``n``-th share of its held chunks (R-ReduceScatter);
* AllGather -> ``all_gather_into_tensor``: everyone ends with the members' chunks;
* Reduce -> ``reduce`` to the first member (the root, §3.2); the others hold nothing;
* Broadcast -> ``broadcast`` from the first member of the root's chunks.

torch orders a group's ranks ascending whatever order ``new_group`` gets, and hands the
``p``-th part of a ``reduce_scatter_tensor`` to the ``p``-th of them; so each rank lays out
its input with the share of the member at ascending position ``p`` in part ``p``, which
gives every member the chunks the semantics says it holds.  Calls whose members would
hand torch buffers of different sizes cannot run at all: lowering refuses them with
:class:`~solver_planner.errors.LoweringError` naming the step and the group.

Cross-mesh resharding (seed 002 §3): every unit task becomes one ``broadcast`` from its
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
    :class:`~solver_planner.reduction.ranking.StepCoster`).
    """
    if chunks < 1 or chunk_elems < 1:
        raise ValueError("a buffer needs at least one chunk of one element")
    chunk_bytes = chunk_elems * DTYPE_BYTES[CHUNK_DTYPE]
    held: list[tuple[int, ...]] = [tuple(range(chunks)) for _ in range(num_devices)]
    calls: list[list[Call]] = [[] for _ in range(num_devices)]
    groups = _Groups()
    plan_steps: list[PlanStep] = []
    clock = 0.0
    for s, (kind, step_groups) in enumerate(steps):
        kind = Collective.parse(kind)
        active = [list(g) for g in step_groups if len(g) > 1]
        sizes = [_lower_group(kind, g, s, held, calls, groups, chunk_bytes) for g in active]
        predicted = cost.collective(kind, active, sizes, algorithm).time if cost is not None and active else 0.0
        label = labels[s] if labels is not None else f"{COLLECTIVE_NAMES[kind]} on {[list(g) for g in step_groups]}"
        ranks = tuple(sorted(d for g in active for d in g))
        plan_steps.append(PlanStep(label, ranks, max(sizes, default=0.0), predicted, clock))
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


def _lower_group(kind: Collective, g: list[int], s: int, held: list[tuple[int, ...]], calls: list[list[Call]],
                 groups: _Groups, chunk_bytes: int) -> float:
    """Append the calls of one group to its members' lists; return the step's buffer bytes."""
    gi = groups(g)
    members = sorted(g)
    if kind is Collective.BROADCAST:
        root = g[0]
        rows = held[root]
        for d in g:
            calls[d].append(Call(s, "broadcast", gi, root, rows if d == root else None, None if d == root else rows))
            held[d] = rows
        return len(rows) * chunk_bytes
    sizes = {len(held[d]) for d in g}
    if len(sizes) > 1:
        counts = ", ".join(f"rank {d}: {len(held[d])}" for d in g)
        raise LoweringError(f"step {s + 1}: {kind.value} on group {g}: the members hold different numbers of chunks"
                            f" ({counts}), so torch.distributed would get buffers of different sizes")
    n = sizes.pop()
    if n == 0:
        return 0.0  # nothing held anywhere: no call at all (on every member alike)
    if kind is Collective.ALLREDUCE:
        for d in g:
            calls[d].append(Call(s, "all_reduce", gi, None, held[d], held[d]))
        return n * chunk_bytes
    if kind is Collective.REDUCE:
        root = g[0]
        for d in g:
            calls[d].append(Call(s, "reduce", gi, root, held[d], held[d] if d == root else None))
        for d in g[1:]:
            held[d] = ()
        return n * chunk_bytes
    if kind is Collective.REDUCESCATTER:
        if n % len(g):
            raise LoweringError(f"step {s + 1}: reducescatter on group {g}: {n} chunks do not split evenly over"
                                f" {len(g)} ranks")
        per = n // len(g)
        pos = {d: i for i, d in enumerate(g)}
        for d in g:
            mine = held[d]
            # Part p of torch's input goes to the p-th member in ascending order.
            send = tuple(r for m in members for r in mine[pos[m] * per:(pos[m] + 1) * per])
            keep = mine[pos[d] * per:(pos[d] + 1) * per]
            calls[d].append(Call(s, "reduce_scatter_tensor", gi, None, send, keep))
        for d in g:
            held[d] = held[d][pos[d] * per:(pos[d] + 1) * per]
        return n * chunk_bytes
    if kind is Collective.ALLGATHER:
        gathered = tuple(r for m in members for r in held[m])
        for d in g:
            calls[d].append(Call(s, "all_gather_into_tensor", gi, None, held[d], gathered))
        for d in g:
            held[d] = gathered
        return len(gathered) * chunk_bytes  # NCCL's convention: the all-gather's output
    raise ValueError(f"unknown collective {kind}")


def lower_resharding(plan: ReshardingPlan, title: str | None = None) -> DistributedPlan:
    """Per-rank ``broadcast`` calls of a broadcast schedule; ranks are the meshes' devices in order."""
    if plan.strategy != "broadcast":
        raise LoweringError(f"only broadcast schedules are lowered (seed 002 §3.1); this plan uses {plan.strategy}")
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
