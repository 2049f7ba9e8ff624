"""One training iteration of a plan as a simulator task graph: what "simulated time" means.

Tasks, all with the cost model's times of :mod:`.costs` (``Partition`` reads them):

* stage ``p`` runs its ops in the schedule's order (:func:`.schedule.stage_order`) on one
  exec resource: ``F`` (forward), ``B`` (backward), or ``BA`` then ``BW`` with weight delaying;
* every tensor from stage ``p`` to a later stage ``q`` (the next one, or a farther one for a
  skip connection) is one transfer per micro-batch after ``F`` of ``p``, holding the ports of
  the links between the two meshes; ``F`` of ``q`` waits for all of its inputs; the
  gradients go back the same way after ``q``'s ``B`` (or ``BA``) and ``p``'s backward waits for
  them.  A channel sends its micro-batches in order (one NCCL stream);
* gradient reduction (Wang's thesis ch. 5, DDP buckets): the stage's last backward (or its
  ``BW``) runs as one piece per layer, last layer first, and each layer's bucket is reduced
  over the data-parallel groups (holding their ports) when its piece is done, buckets one
  after another; without ``gradient_overlap``, one reduction after the last backward;
* a tied copy (GPT's logits sharing the embedding) is all-reduced with the shared layer's
  gradient after both stages have reduced theirs;
* the optimizer step of each stage follows its reductions and tied all-reduces, on its exec
  resource (:mod:`solver_planner.compute`; none under the peak compute model); with model
  chunks, one step per mesh after the mesh's last op and all its chunks' reductions.

The iteration ends with the last task.  The objective (:mod:`.objective`) is a proven lower
bound of this time; tests compare the two on random plans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..simulate import Simulation
from ..simulate.timeline import Timeline
from .partition import Partition
from .schedule import Schedule, live_peak, mesh_order, stage_order

__all__ = ["PipelineRun", "weight_delays", "stage_orders", "mesh_orders", "simulate_schedule", "exec_resource"]

_LATE = 1e15      # priority of gradient buckets: after any pipeline transfer ready at the same moment
_NO_WAIT = (None, None, ())


@dataclass
class PipelineRun:
    """A simulated iteration of one partition under one schedule."""

    schedule: Schedule
    timeline: Timeline
    iteration_time: float
    busy: list[float]
    peak_memory: list[float]
    in_flight: list[int]

    @property
    def bubble_ratio(self) -> float:
        """Share of stage-time idle: ``1 - sum busy / (S x iteration time)``."""
        if self.iteration_time <= 0:
            return 0.0
        return 1.0 - sum(self.busy) / (len(self.busy) * self.iteration_time)



def exec_resource(p: int) -> str:
    """The simulator resource of stage ``p``'s compute stream."""
    return f"stage[{p}].exec"


Transfers = Mapping[tuple[str, int, int], tuple[float, Sequence]]


def _transfer(plan: Partition, kind: str, src: int, dst: int, transfers: Transfers | None) -> tuple[float, Sequence]:
    """(time, ports) of one micro-batch's tensors from stage ``src`` to ``dst`` (``kind``
    'act' or 'grad'): the stage planner's lanes, or what ``transfers`` says (the end-to-end
    plan's broadcast schedules, :mod:`solver_planner.plan`)."""
    if transfers is not None and (kind, src, dst) in transfers:
        return transfers[kind, src, dst]
    c = plan.costs
    duration = plan.activation_time(src, dst) if kind == "act" else plan.gradient_time(src, dst)
    return duration, plan.transfer_ports(src, dst) if c.comm else ()


def weight_delays(plan: Partition, schedule: Schedule, transfers: Transfers | None = None) -> list[bool]:
    """The resharding paper §4, "delay the least to cover all communications": a stage's ``BW`` waits for
    the next forward only when its gradient transfers outlast ``BW``."""
    if not schedule.weight_delay:
        return [False] * len(plan.stages)
    out = []
    for p in range(len(plan.stages)):
        sends = sum(_transfer(plan, "grad", p, q, transfers)[0] for (q, r) in plan.channels if r == p)
        out.append(sends > plan.backward_weight[p])
    return out


def stage_orders(plan: Partition, schedule: Schedule, transfers: Transfers | None = None
                 ) -> list[list[tuple[str, int]]]:
    c = plan.costs
    delays = weight_delays(plan, schedule, transfers)
    return [stage_order(schedule, c.stages, p, c.microbatches, delays[p]) for p in range(c.stages)]


def mesh_orders(plan: Partition, schedule: Schedule, transfers: Transfers | None = None
                ) -> list[list[tuple[str, int, int]]]:
    """Each mesh's (op, chunk, micro-batch) sequence (the chunk is the mesh without chunks)."""
    c = plan.costs
    if schedule.virtual != plan.virtual:
        raise ValueError(f"{schedule} runs {schedule.virtual} chunks per stage; the plan has {plan.virtual}")
    if schedule.virtual > 1:
        return [mesh_order(schedule, c.stages, p, c.microbatches) for p in range(c.stages)]
    return [[(op, p, m) for op, m in o] for p, o in enumerate(stage_orders(plan, schedule, transfers))]


def simulate_schedule(plan: Partition, schedule: Schedule, transfers: Transfers | None = None) -> PipelineRun:
    """Build and run the task graph of one iteration of ``plan`` under ``schedule``.

    ``transfers[(kind, src, dst)] = (seconds, ports)`` replaces the stage planner's price of
    a channel's per-micro-batch transfer ('act' from ``src`` to a later ``dst``, 'grad' back).
    With model chunks, "stage" below is a chunk: its ops run on its mesh's exec resource, in
    the mesh's order; its transfers, buckets and optimizer step use its mesh's devices.
    """
    c = plan.costs
    model, S = c.model, c.stages
    K = len(plan.stages)                       # chunks (= stages without interleaving)
    mesh = plan.mesh
    orders = mesh_orders(plan, schedule, transfers)
    sim = Simulation()
    chans = plan.channels
    inputs = {p: [q for (q, r) in chans if r == p] for p in range(K)}     # chunks p reads from
    outputs = {p: [r for (q, r) in chans if q == p] for p in range(K)}    # chunks p feeds
    ids: dict[tuple[str, int, int], int] = {}
    last_send: dict[tuple[str, int, int], int] = {}
    sends: dict[tuple[str, int, int], int] = {}
    exec_res = [exec_resource(p) for p in range(S)]
    last_task: list[list[int]] = [[] for _ in range(K)]

    def send(kind: str, src: int, dst: int, m: int, after: int) -> int:
        key = (kind, src, dst, m)
        if key not in sends:
            duration, ports = _transfer(plan, kind, src, dst, transfers)
            deps = [after]
            prev = last_send.get((kind, src, dst))
            if prev is not None:
                deps.append(prev)
            tid = sim.add(f"{kind} {src}->{dst} mb{m}", duration, ports, deps, stream="comm",
                          category="activation" if kind == "act" else "gradient",
                          devices=(c.first_device(mesh[src]),))
            sends[key] = last_send[kind, src, dst] = tid
        return sends[key]

    op_time = [{"F": plan.forward[p], "B": plan.backward[p], "BA": plan.backward_act[p],
                "BW": plan.backward_weight[p]} for p in range(K)]
    # the kernels' share of each op (the rest is tensor-parallel and ZeRO-3 collectives),
    # recorded on its task for the plan's breakdown
    kernels = [c.of(mesh[p]).compute_times(st.config) for p, st in enumerate(plan.stages)]
    op_compute = []
    for p, st in enumerate(plan.stages):
        f, a, w = (float(x[st.first:st.last + 1].sum()) for x in kernels[p])
        op_compute.append({"F": f, "B": a + w, "BA": a, "BW": w})
    exec_of = [[exec_res[mesh[p]]] for p in range(K)]
    device_of = [(c.first_device(mesh[p]),) for p in range(K)]
    # each chunk's last op: its gradients are complete after it (the reductions follow it)
    final_at = {k: (r, i) for r, order in enumerate(orders) for i, (_, k, _) in enumerate(order)}

    gather_ready, gather_wait = plan.gather_ready, plan.gather_wait

    def op_task(p: int, op: str, m: int, deps: list[int], final: bool) -> int:
        duration = op_time[p][op]
        release = 0.0
        if op == "F" and m == 0:
            # its parameter gathers (--overlap-param-gather): the first done before it starts,
            # each next one during the layer before it (Partition.gather_ready, gather_wait)
            release, duration = gather_ready[p], duration + gather_wait[p]
        name = f"{op}{p} mb{m}"
        category = "forward" if op == "F" else "backward"
        args = {"compute": op_compute[p][op]}
        if op == "F" and m == 0 and (release or gather_wait[p]):
            args.update(gather_ready=release, gather_wait=gather_wait[p])     # the plan's breakdown
        if not final:
            return sim.add(name, duration, exec_of[p], deps, stream="compute", category=category,
                           devices=device_of[p], args=args, release=release)
        st = plan.stages[p]
        cc = plan.table(p)
        # the stage's last backward: with buckets to reduce while it runs, one piece per
        # layer (last layer first), each layer's buckets reduced behind its piece
        reduces = c.comm and cc.data > 1
        overlap = cc.overlaps(st.first) and reduces
        copy_layers = {b for _, b, q in plan.copies if q == p}
        res = c.reduction_resources(st.tensor, mesh[p]) if reduces else ()
        prev_red: int | None = None

        def reduce(times: list[float], after: int, label: str) -> None:
            nonlocal prev_red
            for n, duration in enumerate(times):
                # pipeline transfers go first when a bucket ends (DDP's buckets share the NICs)
                prev_red = sim.add(f"reduce {p} {label} bucket {n}", duration, res,
                                   [after] + ([prev_red] if prev_red is not None else []), stream="comm",
                                   category="gradient-reduction", devices=device_of[p], priority=_LATE + len(sim))

        if not overlap:
            tid = sim.add(name, duration, exec_of[p], deps, stream="compute", category=category,
                          devices=device_of[p], args={"compute": op_compute[p][op]})
            if reduces:
                reduce(cc.stage_buckets(st.first, st.last), tid, "stage")
        else:
            pieces = cc.layer_weight if op == "BW" else cc.layer_backward
            pieces_copy = cc.layer_weight_copy if op == "BW" else cc.layer_backward_copy
            _, act_k, weight_k = kernels[p]
            for layer in range(st.last, st.first - 1, -1):
                own = float(weight_k[layer]) + (0.0 if op == "BW" else float(act_k[layer]))
                piece = (pieces_copy if layer in copy_layers else pieces)[layer]
                tid = sim.add(f"{name} layer {layer}", float(piece), exec_of[p], deps, stream="compute",
                              category=category, devices=device_of[p], args={"compute": own})
                deps = [tid]
                reduce(cc.layer_buckets(layer, layer in copy_layers), tid, f"layer {layer}")
        # a tied copy's all-reduce waits for the stage's last op (which may compute the tied
        # layer's gradient after every bucket is done, e.g. a layer with nothing else to
        # reduce) and for its last bucket
        last_task[p] = [tid] + ([prev_red] if prev_red is not None else [])
        return tid

    waits = [{"F": ("act", "F", inputs[p]), "B": ("grad", "G", outputs[p]), "BA": ("grad", "G", outputs[p])}
             for p in range(K)]
    # the engine takes a task after its dependencies: add each mesh's ops in order, in
    # rounds, as far as the ops they wait for on other stages exist
    pos = [0] * S
    prev: list[int | None] = [None] * S
    pending = sum(len(o) for o in orders)
    while pending:
        progressed = False
        for r in range(S):
            order = orders[r]
            while pos[r] < len(order):
                op, p, m = order[pos[r]]
                # a forward waits for its inputs' activations, a backward for its outputs'
                # gradients (the last chunk's for its own forward); BW waits for nothing else
                kind, key, peers = waits[p].get(op, _NO_WAIT)
                srcs = [ids.get((key, q, m)) for q in peers]
                if None in srcs:
                    break                   # a peer has not added that op yet: next round
                deps = [send(kind, q, p, m, src) for q, src in zip(peers, srcs)]
                if op in ("B", "BA") and p == K - 1:
                    deps.append(ids["F", p, m])
                if prev[r] is not None:
                    deps.append(prev[r])
                final = final_at[p] == (r, pos[r])
                tid = op_task(p, op, m, deps, final)
                ids[op, p, m] = tid
                if op in ("B", "BA"):
                    ids["G", p, m] = tid          # what earlier stages' gradients wait for
                prev[r] = tid
                pos[r] += 1
                pending -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline order deadlocks")  # an order bug, never a user error
    ties: list[list[int]] = [[] for _ in range(K)]
    for a, b, q in plan.copies:
        p = plan.owner[a]
        duration, res = c.tie_sync(plan, a, b)
        tid = sim.add(f"tie {a}<->{b}", duration, res, last_task[p] + last_task[q], stream="comm",
                      category="gradient-reduction", devices=(c.first_device(mesh[p]), c.first_device(mesh[q])),
                      priority=_LATE + len(sim))
        ties[p].append(tid)
        ties[q].append(tid)
    for r in range(S):
        # the optimizer step: once per iteration and mesh, after the mesh's last op and after
        # every gradient of its chunks is reduced (tied copies too): a framework steps the
        # optimizer over all its model chunks together (Megatron-LM reduces every chunk's
        # gradients, then calls one optimizer step); one task per chunk, one after another
        after = [prev[r]] + [t for p in range(K) if mesh[p] == r for t in last_task[p] + ties[p]]
        for p, st in enumerate(plan.stages):
            duration = float(plan.table(p).optimizer[st.first, st.last])
            if mesh[p] == r and duration > 0:
                after = [sim.add(f"optimizer {p}", duration, exec_of[p], after, stream="compute",
                                 category="optimizer", devices=device_of[p])]
    timeline = sim.run()
    busy = [0.0] * S
    stage_of = {name: p for p, name in enumerate(exec_res)}
    for t in sim.tasks:
        if t.category in ("forward", "backward"):
            busy[stage_of[t.resources[0]]] += t.duration
    if plan.virtual > 1:
        memory, live = plan.mesh_memory(orders)
    else:
        live = [live_peak([(op, m) for op, _, m in o]) for o in orders]
        memory = plan.memory(live)
    return PipelineRun(schedule, timeline, timeline.makespan, busy, memory, live)
