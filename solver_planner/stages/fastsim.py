"""The iteration time of a plan, exactly as :func:`.pipeline.simulate_schedule` and the engine
give it, without building the task graph: what the stage search simulates its plans with.

Same tasks, same durations, same rule; only the bookkeeping differs.  In the task graph of
:mod:`.pipeline` a stage's ops (forwards, backwards, the last backward's per-layer pieces,
the optimizer step) form one chain on the stage's own exec resource, so they never wait for
a resource: each starts when the last of its dependencies ends, and is computed as soon as
that is known.  Only the tasks holding ports (a channel's per-micro-batch transfers, a
stage's gradient buckets, tied all-reduces) can wait for one another, and they are played
out in time order by the engine's greedy rule (:mod:`solver_planner.simulate.engine`): at
each instant, among the tasks ready then, the one with the smaller ``(priority, id)`` whose
ports are all free starts first; a task blocked by a busy port is tried again when that
port frees.  Ids and priorities are those the engine would give (the same construction
order, replayed only when two tasks competing for a port are ready at the same instant).
A chain whose ports no other task holds never waits and is not played out either.

Where this bookkeeping could order an instant differently from the engine (a zero-length
task, or one too short to advance the clock, while tasks compete for ports), the plan is
simulated with :func:`.pipeline.simulate_schedule` instead.  A differential test
(``tests/test_stages_speed.py``) compares the two on random plans: iteration time, busy
time and task count bit for bit.

:func:`pipeline_run` returns a :class:`.pipeline.PipelineRun` whose timeline is built (by
:func:`.pipeline.simulate_schedule`) only when it is read.
"""

from __future__ import annotations

import heapq
import weakref
from typing import Callable

from ..errors import PlannerError
from ..simulate.timeline import Record, Timeline
from .partition import Partition
from .ports import port_classes
from .pipeline import (PipelineRun, Transfers, _transfer, exec_resource, mesh_orders, simulate_schedule,
                       stage_orders, weight_delays)
from .schedule import Schedule, live_peak

__all__ = ["pipeline_run", "iteration", "Iteration"]

# the order in which simulate_schedule adds the tasks, per StageCosts (so within one search)
# and per (schedule, weight delays, channels): it depends on nothing else
_ORDERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Fallback(Exception):
    """This plan needs the engine (see the module docstring)."""


class Iteration(tuple):
    """(iteration time, busy time per stage, number of tasks, used the engine)."""

    __slots__ = ()

    @property
    def time(self) -> float:
        return self[0]

    @property
    def busy(self) -> list[float]:
        return self[1]

    @property
    def tasks(self) -> int:
        return self[2]

    @property
    def engine(self) -> bool:
        return self[3]


def iteration(plan: Partition, schedule: Schedule, transfers: Transfers | None = None) -> Iteration:
    """The simulated iteration time of ``plan`` under ``schedule`` (what
    ``simulate_schedule(plan, schedule, transfers).iteration_time`` is), its busy time per
    stage and the number of tasks of its graph.  ``transfers``: the end-to-end plan's
    boundary schedules in place of the stage planner's lanes (:func:`.pipeline._transfer`)."""
    try:
        return Iteration(_simulate(plan, schedule, transfers) + (False,))
    except _Fallback:
        run = simulate_schedule(plan, schedule, transfers)
        return Iteration((run.iteration_time, run.busy, len(run.timeline), True))


def pipeline_run(plan: Partition, schedule: Schedule, transfers: Transfers | None = None) -> tuple[PipelineRun, int]:
    """``simulate_schedule(plan, schedule, transfers)`` with its timeline built on first use,
    and the number of tasks of the graph."""
    it = iteration(plan, schedule, transfers)
    if plan.virtual > 1:
        memory, live = plan.mesh_memory(mesh_orders(plan, schedule, transfers))
    else:
        live = [live_peak(o) for o in stage_orders(plan, schedule, transfers)]
        memory = plan.memory(live)
    timeline = _LazyTimeline(lambda: simulate_schedule(plan, schedule, transfers).timeline, it.time, it.tasks, plan)
    return PipelineRun(schedule, timeline, it.time, it.busy, memory, live), it.tasks


class _LazyTimeline(Timeline):
    """A :class:`Timeline` simulated with the engine when its records are first read."""

    def __init__(self, build: Callable[[], Timeline], makespan: float, tasks: int, plan: Partition):
        self._build, self._makespan, self._count, self._plan = build, makespan, tasks, plan
        self._real: Timeline | None = None

    @property
    def records(self) -> list[Record]:
        if self._real is None:
            real = self._build()
            if real.makespan != self._makespan or len(real) != self._count:
                raise PlannerError(f"fast simulation {self._makespan!r} ({self._count} tasks) differs from the engine's"
                                   f" {real.makespan!r} ({len(real)} tasks) for {self._plan}: please report")
            self._real = real
        return self._real.records

    def __len__(self) -> int:
        return self._count

    def __getattr__(self, name: str):
        # what a Timeline holds besides its records (its tasks, read by the critical path):
        # from the engine's, built on first use like the records
        if name in ("_build", "_makespan", "_count", "_plan", "_real"):
            raise AttributeError(name)
        self.records
        return getattr(self._real, name)

    @property
    def makespan(self) -> float:
        return self._makespan


def _simulate(plan: Partition, schedule: Schedule, transfers: Transfers | None = None
              ) -> tuple[float, list[float], int]:
    """With model chunks, a mesh's chain holds the ops of all its chunks in the mesh's order;
    transfers, buckets and tied all-reduces belong to chunks (``K`` of them)."""
    c = plan.costs
    model, S, B = c.model, c.stages, c.microbatches
    K = len(plan.stages)
    mesh = plan.mesh
    delays = weight_delays(plan, schedule, transfers)
    orders = mesh_orders(plan, schedule, transfers)
    chans = list(plan.channels)
    nch = len(chans)
    # each chunk's last op: its position in its mesh's order
    final_pos = [0] * K
    for r, order in enumerate(orders):
        for i, (_, k, _) in enumerate(order):
            final_pos[k] = i
    # channels: act j carries chans[j] = (q, r) forward, grad nch + j carries it back
    inputs = [[q for (q, r) in chans if r == p] for p in range(K)]
    outputs = [[r for (q, r) in chans if q == p] for p in range(K)]
    in_act = [[j for j, (q, r) in enumerate(chans) if r == p] for p in range(K)]
    in_grad = [[nch + j for j, (q, r) in enumerate(chans) if q == p] for p in range(K)]
    out_act = [[j for j, (q, r) in enumerate(chans) if q == p] for p in range(K)]
    out_grad = [[nch + j for j, (q, r) in enumerate(chans) if r == p] for p in range(K)]
    ch_dst = [mesh[r] for (q, r) in chans] + [mesh[q] for (q, r) in chans]     # the mesh to advance
    ch_dur: list[float] = []
    raw: list = []                              # the ports of each port-task type, as handed out
    for q, r in chans:
        d, ports = _transfer(plan, "act", q, r, transfers)
        ch_dur.append(float(d))
        raw.append(ports)
    for q, r in chans:
        d, ports = _transfer(plan, "grad", r, q, transfers)
        ch_dur.append(float(d))
        raw.append(ports)
    execs = {exec_resource(m) for m in range(S)} if transfers is not None else set()
    if any(x in execs for ports in raw for x in ports):
        # transfers without overlap hold both stages' compute streams (plan --no-overlap):
        # the stages' chains then wait for ports, which this bookkeeping does not play out
        raise _Fallback

    # each chunk's last op: pieces (one, or one per layer, last layer first) and the buckets
    # reduced behind each piece; the chunk's buckets are port-task type 2 nch + k
    f, b, ba, bw = plan.forward, plan.backward, plan.backward_act, plan.backward_weight
    op_dur = [{"F": f[p], "B": b[p], "BA": ba[p], "BW": bw[p]} for p in range(K)]
    gather_ready, gather_wait = plan.gather_ready, plan.gather_wait
    pieces: list[list[float]] = []
    piece_buckets: list[list[list[float]]] = []
    for p, st in enumerate(plan.stages):
        cc = plan.table(p)
        reduces = c.comm and cc.data > 1
        overlap = cc.overlaps(st.first) and reduces
        last_op = orders[mesh[p]][final_pos[p]][0]
        if not overlap:
            pieces.append([float(op_dur[p][last_op])])
            piece_buckets.append([cc.stage_buckets(st.first, st.last) if reduces else []])
        else:
            copy_layers = {bb for _, bb, q in plan.copies if q == p}
            arr = cc.layer_weight if last_op == "BW" else cc.layer_backward
            arr_copy = cc.layer_weight_copy if last_op == "BW" else cc.layer_backward_copy
            layers = range(st.last, st.first - 1, -1)
            pieces.append([float((arr_copy if layer in copy_layers else arr)[layer]) for layer in layers])
            piece_buckets.append([cc.layer_buckets(layer, layer in copy_layers) for layer in layers])
        raw.append(c.reduction_resources(st.tensor, mesh[p]) if reduces else ())
    copies = plan.copies
    tie_dur: list[float] = []
    tie_stages: list[tuple[int, int]] = []
    for a, bb, q in copies:
        d, res = c.tie_sync(plan, a, bb)
        tie_dur.append(float(d))
        tie_stages.append((plan.owner[a], q))
        raw.append(res)
    opt_dur = [float(plan.table(p).optimizer[st.first, st.last]) for p, st in enumerate(plan.stages)]
    mesh_chunks = [[k for k in range(K) if mesh[k] == r] for r in range(S)]

    classes, shared, groups = port_classes(c, raw)
    nclass = len(groups)
    contended = any(shared)
    busy_until = [0.0] * nclass
    nbuckets = [sum(len(x) for x in pb) for pb in piece_buckets]
    BIG = max([B] + nbuckets) + 1
    TIE0 = 2 * nch + K

    # state
    UNK = -1.0
    send_end = [[UNK] * B for _ in range(2 * nch)]
    trig = [[UNK] * B for _ in range(2 * nch)]
    bucket_dur = [[x for pb in piece_buckets[p] for x in pb] for p in range(K)]
    bucket_trig = [[UNK] * n for n in nbuckets]
    bucket_end = [[UNK] * n for n in nbuckets]
    pos = [0] * S
    prev_end = [0.0] * S
    busy = [0.0] * S
    mesh_end = [UNK] * S               # the mesh's last op
    final_end = [UNK] * K              # the chunk's last piece
    red_end = [UNK if n else 0.0 for n in nbuckets]   # the chunk's last bucket
    tie_end = [UNK] * len(copies)
    stage_ties = [[k for k, (p, q) in enumerate(tie_stages) if s in (p, q)] for s in range(K)]
    mesh_ties = [sorted({j for k in mesh_chunks[r] for j in stage_ties[k]}) for r in range(S)]
    done = [False] * S                 # optimizer steps placed
    heap: list[tuple[float, int]] = []
    heappush, heappop = heapq.heappush, heapq.heappop
    work: list[int] = []
    end_max = 0.0

    def ready(typ: int, k: int, at: float) -> None:
        """A port task whose dependencies are done at ``at``: start it, or queue it."""
        if shared[typ]:
            heappush(heap, (at, typ * BIG + k))
        else:
            start(typ, k, at)

    def start(typ: int, k: int, t: float) -> None:
        nonlocal end_max
        while True:
            if typ < 2 * nch:
                e = t + ch_dur[typ]
            elif typ < TIE0:
                e = t + bucket_dur[typ - 2 * nch][k]
            else:
                e = t + tie_dur[typ - TIE0]
            if e <= t and contended and classes[typ]:
                raise _Fallback      # (a task holding no port competes with nothing)
            for cl in classes[typ]:
                busy_until[cl] = e
            if e > end_max:
                end_max = e
            if typ < 2 * nch:
                send_end[typ][k] = e
                work.append(ch_dst[typ])
                k += 1
                if k < B:
                    tr = trig[typ][k]
                    if tr >= 0.0:
                        t = tr if tr > e else e
                        if not shared[typ]:
                            continue
                        heappush(heap, (t, typ * BIG + k))
                return
            if typ < TIE0:
                p = typ - 2 * nch
                bucket_end[p][k] = e
                k += 1
                if k == nbuckets[p]:
                    red_end[p] = e
                    stage_done(p)
                    return
                tr = bucket_trig[p][k]
                if tr >= 0.0:
                    t = tr if tr > e else e
                    if not shared[typ]:
                        continue
                    heappush(heap, (t, typ * BIG + k))
                return
            j = typ - TIE0
            tie_end[j] = e
            for s in tie_stages[j]:
                optimizer(mesh[s])
            return

    def stage_done(p: int) -> None:
        """Chunk ``p``'s last piece and last bucket are placed: its tied all-reduces may go."""
        if final_end[p] < 0.0 or red_end[p] < 0.0:
            return
        for j in stage_ties[p]:
            s, q = tie_stages[j]
            if tie_end[j] == UNK and final_end[s] >= 0.0 and red_end[s] >= 0.0 and final_end[q] >= 0.0 \
                    and red_end[q] >= 0.0:
                at = max(final_end[s], red_end[s], final_end[q], red_end[q])
                tie_end[j] = -2.0          # queued
                ready(TIE0 + j, 0, at)
        optimizer(mesh[p])

    def optimizer(r: int) -> None:
        """Mesh ``r``'s optimizer steps, one after another once everything they wait for is
        placed (pipeline.simulate_schedule adds them last, as a chain)."""
        nonlocal end_max
        if done[r] or mesh_end[r] < 0.0 or any(tie_end[j] < 0.0 for j in mesh_ties[r]):
            return
        at = mesh_end[r]
        for k in mesh_chunks[r]:
            if final_end[k] < 0.0 or red_end[k] < 0.0:
                return
            at = max(at, final_end[k], red_end[k])
        done[r] = True
        for j in mesh_ties[r]:
            at = max(at, tie_end[j])
        e = at
        for k in mesh_chunks[r]:
            if opt_dur[k] > 0:
                e = e + opt_dur[k]
        if e > end_max:
            end_max = e

    def advance(r: int) -> None:
        """Place mesh ``r``'s ops in order while their inputs are known."""
        nonlocal end_max
        order = orders[r]
        i, n = pos[r], len(order)
        t_prev = prev_end[r]
        acc = busy[r]
        while i < n:
            op, p, m = order[i]
            st = t_prev
            if op == "F":
                for ch in in_act[p]:
                    e = send_end[ch][m]
                    if e < 0.0:
                        break
                    if e > st:
                        st = e
                else:
                    e = None
                if e is not None:
                    break
            elif op != "BW":
                for ch in in_grad[p]:
                    e = send_end[ch][m]
                    if e < 0.0:
                        break
                    if e > st:
                        st = e
                else:
                    e = None
                if e is not None:
                    break
            final = i == final_pos[p]
            if not final:
                d = op_dur[p][op]
                if m == 0 and op == "F":
                    # its parameter gathers (pipeline.simulate_schedule)
                    if gather_ready[p] > st:
                        st = gather_ready[p]
                    d += gather_wait[p]
                end = st + d
                acc += d
                if end <= st and contended:
                    raise _Fallback
            else:
                # the chunk's last op: its pieces, each followed by its buckets
                end = st
                typ = 2 * nch + p
                kb = 0
                for d, bks in zip(pieces[p], piece_buckets[p]):
                    nxt = end + d
                    acc += d
                    if nxt <= end and contended:
                        raise _Fallback
                    end = nxt
                    for _ in bks:
                        bucket_trig[p][kb] = end
                        if kb == 0 or bucket_end[p][kb - 1] >= 0.0:
                            prev = bucket_end[p][kb - 1] if kb else end
                            ready(typ, kb, end if end > prev else prev)
                        kb += 1
            t_prev = end
            if end > end_max:
                end_max = end
            if op == "F":
                for ch in out_act[p]:
                    trig[ch][m] = end
                    if m == 0:
                        ready(ch, 0, end)
                    else:
                        pe = send_end[ch][m - 1]
                        if pe >= 0.0:
                            ready(ch, m, end if end > pe else pe)
            elif op != "BW":
                for ch in out_grad[p]:
                    trig[ch][m] = end
                    if m == 0:
                        ready(ch, 0, end)
                    else:
                        pe = send_end[ch][m - 1]
                        if pe >= 0.0:
                            ready(ch, m, end if end > pe else pe)
            i += 1
            if final:
                final_end[p] = end
                pos[r], prev_end[r], busy[r] = i, t_prev, acc
                if i == n:
                    mesh_end[r] = end
                stage_done(p)
                if i == n:
                    optimizer(r)
                    return
                i, t_prev, acc = pos[r], prev_end[r], busy[r]
                continue
        pos[r], prev_end[r], busy[r] = i, t_prev, acc

    ranks: tuple | None = None
    nsends = 2 * nch * B

    def priority(code: int) -> int:
        """The engine's (priority, id) order: transfers by id, then buckets and tied
        all-reduces (priority ``pipeline._LATE + id``) by id; ids follow simulate_schedule's order of adding."""
        nonlocal ranks
        if ranks is None:
            memo = _ORDERS.setdefault(c, {})
            key = (schedule, tuple(delays), tuple(chans), mesh)
            if key not in memo:
                memo[key] = _creation_order(K, B, orders, inputs, outputs, in_act, in_grad)
            ranks = memo[key]
        typ, k = divmod(code, BIG)
        if typ < 2 * nch:
            return ranks[0][typ][k]
        if typ < TIE0:
            return nsends + ranks[1][typ - 2 * nch] * BIG + k
        return nsends + K * BIG + typ - TIE0

    work.extend(range(S - 1, -1, -1))
    while True:
        while work:
            advance(work.pop())
        if not heap:
            break
        t, code = heappop(heap)
        if not heap or heap[0][0] != t:
            cands = [code]
        else:
            cands = [code]
            while heap and heap[0][0] == t:
                cands.append(heappop(heap)[1])
            seen: set = set()
            clash = False
            for x in cands:
                for cl in classes[x // BIG]:
                    if cl in seen:
                        clash = True
                    seen.add(cl)
            if clash:
                cands.sort(key=priority)
        for code in cands:
            typ = code // BIG
            until = t
            for cl in classes[typ]:
                u = busy_until[cl]
                if u > until:
                    until = u
            if until > t:
                heappush(heap, (until, code))        # tried again when its last busy port frees
            else:
                start(typ, code % BIG, t)
    if any(i < len(o) for i, o in zip(pos, orders)) or not all(done):
        raise RuntimeError("pipeline order deadlocks")     # an order bug, never a user error
    n_tasks = (sum(len(o) for o in orders) - K + sum(len(pc) for pc in pieces) + 2 * nch * B + sum(nbuckets)
               + len(copies) + sum(1 for x in opt_dur if x > 0))
    return end_max, busy, n_tasks


def _creation_order(K, B, orders, inputs, outputs, in_act, in_grad) -> tuple[list[list[int]], list[int]]:
    """The order in which simulate_schedule adds the transfers (replaying its rounds over the
    meshes: a transfer is added just before the op that waits for it): ``[channel][m]``, and
    the order in which it adds the chunks' last ops (whose buckets follow them).  It depends
    on the op orders and the channels only."""
    send_rank = [[0] * B for _ in range(sum(len(x) for x in in_act) + sum(len(x) for x in in_grad))]
    final_pos = [0] * K
    for order in orders:
        for i, (_, k, _) in enumerate(order):
            final_pos[k] = i
    final_rank = [0] * K
    sends = finals = 0
    pos = [0] * len(orders)
    fcnt = [0] * K                     # forwards added per chunk (they are added in micro-batch order)
    gcnt = [0] * K                     # backwards (B or BA) added per chunk
    pending = sum(len(o) for o in orders)
    while pending:
        progressed = False
        for r, order in enumerate(orders):
            i, n = pos[r], len(order)
            first = i
            while i < n:
                op, p, m = order[i]
                if op == "F":
                    blocked = False
                    for q in inputs[p]:
                        if fcnt[q] <= m:
                            blocked = True
                            break
                    if blocked:
                        break
                    for ch in in_act[p]:
                        send_rank[ch][m] = sends
                        sends += 1
                    fcnt[p] += 1
                elif op != "BW":
                    blocked = False
                    for q in outputs[p]:
                        if gcnt[q] <= m:
                            blocked = True
                            break
                    if blocked:
                        break
                    for ch in in_grad[p]:
                        send_rank[ch][m] = sends
                        sends += 1
                    gcnt[p] += 1
                if i == final_pos[p]:
                    final_rank[p] = finals
                    finals += 1
                i += 1
            if i > first:
                pending -= i - first
                progressed = True
                pos[r] = i
        if not progressed:
            raise RuntimeError("pipeline order deadlocks")
    return send_rank, final_rank
