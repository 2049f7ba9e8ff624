"""Pipeline schedules as simulator task graphs: GPipe, 1F1B and eager-1F1B.

Each stage runs its forward (F) and backward (B) tasks in a fixed order (a chain of
dependencies on the stage's compute stream):

* GPipe (Huang et al. 2019): all forwards, then all backwards;
* 1F1B (seed 004 §5, Narayanan et al. 2021): stage ``p`` of ``S`` runs ``S - p`` forwards,
  then alternates one backward and one forward, then drains its backwards;
* eager-1F1B (seed 002 §4): like 1F1B but stage ``p`` runs up to ``e`` more forwards before
  its first backward (``e = S - p - 1`` in the paper: ``2 (S - p) - 1`` in all), so that a
  forward of another micro-batch sits between two dependent tasks and hides the transfer.

Every tensor between stages is a transfer task on the ports of the links between the two
meshes (replica j of the sender to the same position of the receiver, all lanes at once,
:meth:`CostModel.transfers_time`), so transfers overlap compute whenever the order lets
them; a port carries one transfer at a time.  After its last backward a stage reduces its
gradients (the time :mod:`.costs` gives).  With every communication term zero and equal
stage times, 1F1B takes exactly ``(S + B - 1) t`` = Alpa's ``sum t_i + (B - 1) max t_j``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..cost import CostModel
from ..simulate import Simulation
from ..simulate.timeline import Timeline
from ..topology import Resource
from .costs import SCHEDULES
from .partition import Partition

__all__ = ["stage_order", "PipelineRun", "simulate_pipeline", "simulate_schedule"]


def stage_order(schedule: str, stages: int, p: int, microbatches: int, eagerness: int = 0) -> list[tuple[str, int]]:
    """The (``"F"``/``"B"``, micro-batch) sequence stage ``p`` runs."""
    B = microbatches
    if schedule == "gpipe":
        return [("F", m) for m in range(B)] + [("B", m) for m in range(B)]
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule '{schedule}'; expected one of: {', '.join(SCHEDULES)}")
    extra = min(eagerness, stages - p - 1) if schedule == "eager-1f1b" else 0
    warm = max(1, min(stages - p + extra, B))
    order = [("F", m) for m in range(warm)]
    nf = warm
    for m in range(B):
        order.append(("B", m))
        if nf < B:
            order.append(("F", nf))
            nf += 1
    return order


@dataclass
class PipelineRun:
    """A simulated iteration of one partition under one schedule."""

    schedule: str
    eagerness: int
    timeline: Timeline
    iteration_time: float
    busy: list[float]
    peak_memory: list[float]
    in_flight: list[int]
    transfer_time: float = 0.0
    info: dict = field(default_factory=dict)

    @property
    def bubble_ratio(self) -> float:
        """Share of stage-time idle: ``1 - sum busy / (S x iteration time)``."""
        if self.iteration_time <= 0:
            return 0.0
        return 1.0 - sum(self.busy) / (len(self.busy) * self.iteration_time)


def _stage_of(partition: Partition) -> list[int]:
    owner = []
    for p, st in enumerate(partition.stages):
        owner += [p] * (st.last - st.first + 1)
    return owner


def simulate_schedule(partition: Partition, cost: CostModel, schedule: str = "1f1b", eagerness: int = 0) -> PipelineRun:
    """Build and run the task graph of one iteration."""
    c = partition.costs
    model, S, B = c.model, c.stages, c.microbatches
    owner = _stage_of(partition)
    comm: dict[tuple[int, int], float] = {}
    for a, b, nbytes in model.edges():
        if owner[a] != owner[b]:
            comm[owner[a], owner[b]] = comm.get((owner[a], owner[b]), 0.0) + nbytes
    sim = Simulation()
    fwd_t, bwd_t = [], []
    for p, st in enumerate(partition.stages):
        f, b = c.compute(st.tensor)
        fwd_t.append(float(f[st.first, st.last]))
        bwd_t.append(float(b[st.first, st.last]))
    ids: dict[tuple[str, int, int], int] = {}
    sends: dict[tuple[str, int, int], tuple[float, list]] = {}
    for (p, q), per_sample in comm.items():
        for kind, src, dst in (("act", p, q), ("grad", q, p)):
            lanes = c.tables[partition.stages[src].tensor].lane_pairs(src, dst)
            nbytes = per_sample * c.samples(partition.stages[src].tensor)
            duration = cost.transfers_time(lanes, nbytes) if c.comm else 0.0
            res = sorted({r for a, d in lanes for r in cost.route(a, d).resources})
            sends[kind, src, dst] = (duration, res)
    orders = [stage_order(schedule, S, p, B, eagerness) for p in range(S)]
    # the engine takes a task after its dependencies: add each stage's tasks in order, in
    # rounds, as far as the tasks they wait for on other stages exist
    pos = [0] * S
    prev: list[int | None] = [None] * S
    transfer_ids: dict[tuple[str, int, int, int], int] = {}
    pending = sum(len(o) for o in orders)
    while pending:
        progressed = False
        for p in range(S):
            while pos[p] < len(orders[p]):
                op, m = orders[p][pos[p]]
                if op == "F":
                    need = [(q, "act") for (q, r) in comm if r == p]
                else:
                    need = [(r, "grad") for (q, r) in comm if q == p]
                deps = []
                ok = True
                for other, kind in need:
                    src_task = ids.get(("F" if kind == "act" else "B", other, m))
                    if src_task is None:
                        ok = False
                        break
                    key = (kind, other, p, m)
                    if key not in transfer_ids:
                        duration, res = sends[kind, other, p]
                        transfer_ids[key] = sim.add(
                            f"{kind} {other}->{p} mb{m}", duration, res, [src_task], stream="comm",
                            category="activation" if kind == "act" else "gradient",
                            devices=(other * c.shape.size,))
                    deps.append(transfer_ids[key])
                if not ok:
                    break
                if op == "B" and p == S - 1:
                    deps.append(ids["F", p, m])
                if prev[p] is not None:
                    deps.append(prev[p])
                tid = sim.add(f"{op}{p} mb{m}", fwd_t[p] if op == "F" else bwd_t[p], [Resource("stage", p, "exec")],
                              deps, stream="compute", category="forward" if op == "F" else "backward",
                              devices=(p * c.shape.size,))
                ids[op, p, m] = tid
                prev[p] = tid
                pos[p] += 1
                pending -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline order deadlocks")  # an order bug, never a user error
    for p in range(S):
        sim.add(f"grad-sync {p}", partition.gradient[p], [Resource("stage", p, "exec")], [prev[p]],
                stream="compute", category="gradient-reduction", devices=(p * c.shape.size,))
    timeline = sim.run()
    busy = [0.0] * S
    for r in timeline.records:
        if r.category in ("forward", "backward"):
            busy[r.resources[0].instance] += r.duration
    peaks, counts = [], []
    for p, st in enumerate(partition.stages):
        live = peak = 0
        for op, _ in orders[p]:
            live += 1 if op == "F" else -1
            peak = max(peak, live)
        counts.append(peak)
        peaks.append(float(c.memory(p, st.tensor, peak)[st.first, st.last]))
    transfer = sum(r.duration for r in timeline.records if r.category in ("activation", "gradient"))
    return PipelineRun(schedule, eagerness, timeline, timeline.makespan, busy, peaks, counts, transfer)


def simulate_pipeline(partition: Partition, cost: CostModel, schedule: str = "1f1b") -> tuple[PipelineRun, PipelineRun | None]:
    """Simulate ``schedule``; for eager-1F1B also 1F1B, and the eagerness that is fastest.

    Eagerness ``e`` (extra warm-up forwards) is tried from the paper's full value down to 0
    (which is 1F1B), so the eager schedule reported is never slower than 1F1B; the second
    value returned is the 1F1B run it is compared with.
    """
    if schedule != "eager-1f1b":
        return simulate_schedule(partition, cost, schedule), None
    S = partition.costs.stages
    base = simulate_schedule(partition, cost, "1f1b")
    best = base
    levels = sorted({S - 1, (S - 1) // 2, 1} - {0}, reverse=True)
    for e in levels:
        run = simulate_schedule(partition, cost, "eager-1f1b", e)
        if run.iteration_time < best.iteration_time - 1e-12:
            best = run
    return (replace(base, schedule="eager-1f1b") if best is base else best), base
