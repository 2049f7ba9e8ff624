"""The objective: a closed-form, proven lower bound of a plan's simulated iteration time.

Notation for a plan of ``S`` stages and ``B`` micro-batches under one schedule (stage ``p``):
``f`` forward, ``b = bA + bW`` backward, ``w = f + b`` per micro-batch; ``c`` the *chain op*
the previous stage waits for (``bA`` with weight delaying, else ``b``); ``g`` what the
gradient reduction adds after the stage's last op (:mod:`.costs`, the tail of Wang's thesis);
``x(p->q)`` a micro-batch's transfer on the real links between the two meshes (skips
included), ``x(q->p)`` its gradients back.  Every bound below holds for any run of the task
graph of :mod:`.pipeline`, because that run respects every dependency and duration used;
waiting for a busy port only delays tasks.

* **Stage bound** (fill, work, drain).  Stage ``p``'s first forward cannot start before
  micro-batch 0 has gone through every path into it, ``H_p = max over inputs (H_q + f_q +
  x(q->p))``; its exec then does ``B w`` of work; after its last chain op (micro-batch
  ``B - 1``, since every schedule runs backwards in micro-batch order) only its last ``BW``
  may remain, and the iteration lasts at least ``D_p = max(u_p, max over earlier stages q
  it feeds (x(p->q) + c_q + D_q))`` more, ``u_p = (bW if split) + g_p`` (with a tied copy: its
  reductions, the copy's all-reduce, then the longer optimizer step of the two stages the
  tie joins, both of which wait for it)::

      LB_p = H_p + B w_p - (b_p - c_p) + D_p

* **Cycle bound** (1F1B cannot hide communication, the resharding paper §4).  Stage ``p`` runs forward
  ``m + W_p`` right after backward ``m`` (``W_p`` its warm-up forwards), and backward ``m``
  waits for micro-batch ``m``'s round trip ``R_p`` through the later stages, transfers
  included.  So forwards ``0, W, 2W, ...`` are ``C_p = f + R_p + c + (bW if BW precedes
  the forward)`` apart, and with ``j = floor((B - 1) / W_p)``::

      CB_p = H_p + j C_p + f_p + R_p + (B - j W_p) b_p - (b_p - c_p) + D_p

  **Phase bound**: the same order read as phases: the first chain op waits for the ``W``
  warm-up forwards and the first round trip, ``B - W`` forwards and backwards alternate,
  the last chain op waits for the last round trip and the backwards before it
  (:func:`phase_time`); exact for equal stages.

  **Neighbour cycle** (:mod:`.neighbor`): the same reading between two neighbouring stages
  only, whose cycle comes every 2 micro-batches under 1F1B (more under eager-1F1B): a slow
  link between them paces both; and its *windows*, the same cycle through ``h`` later stages
  at once, every ``h + 1`` micro-batches under 1F1B (both counted with the cycle bound).

  Under GPipe a channel ``p -> q`` carries all ``B`` activations, then ``q``'s last forward
  and a round trip pass before its first backward, then all ``B`` gradients::

      GB_pq = H_p + f_p + B x(p->q) + f_q + R_q + c_q + B x(q->p) + c_p + D_p

* **Link bound** (:mod:`.link`, counted with the cycle bound): a channel's transfers run one
  after another, so where they outlast the stages' ops, two neighbouring stages and the
  channel between them are played out alone, each stage's ops in its order, from the fill
  ``H_p`` to the last chain op of either stage and its drain; and the *backlog* behind the
  link: each micro-batch's gradient, from the end of its chain op in that playout, reaches
  each earlier stage, which still has its ops from that micro-batch's chain op to its last
  one and its drain to run.

* **Playout bound** (:func:`_playout_bound`, counted with the cycle bound): each stage's own
  ops played out in its order, its forwards released no earlier than the earlier stages' own
  forwards allow and its chain ops after their round trips; and the backlog the playout
  leaves on the earlier stages, as the link bound's: a slow stage behind faster later ones
  has their gradients queued in front of it.

* **Port bound**.  The tasks holding one port (transfers, gradient reductions, tied
  all-reduces) run one at a time: ``PB_r = earliest start + sum of durations + least tail``.
  A channel sends its micro-batches in order, so the last of its transfers a port serves is
  micro-batch ``B - 1``'s, whose tail is the last micro-batch's drain (``D``, tied
  all-reduces included).

``objective = max(LB, CB, phase, PB)``, for the schedule simulated; over a family of schedules
the least over its members that fit in memory.  It equals the simulated time when the
critical path is one of the bounds and no task waits for a port (one stage; equal stages
without communication; tested), and is below it otherwise (tested on random plans).

**Relaxation R1** (one of the parts a dynamic program over contiguous stages minimises
exactly, :meth:`.problem.PairProblem.relaxation`; the tests check it against this formula): the
stage bound with ``H_p`` and ``D_p`` taken along neighbouring stages only, each transfer
carrying only the tensor that crosses the cut (the last layer's output), and the drain
ending at the first stage (or the stage itself)::

      R = max_p max( B w_p + g_p,  A_p + x(p->p-1) + B w_p - (b_p - c_p) )
      A_0 = u_0,   A_{p+1} = A_p + f_p + x(p->p+1) + c_p + x(p->p-1)

so ``R1 <= objective <= simulated`` for every plan; the search enumerates plans by
``R = max(R1, R2, R3)`` and stops when ``R`` reaches the best simulated time (:mod:`.search`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from .link import LINK_MICROBATCHES, backlog_counts, link_key, link_numbers, paced
from .neighbor import neighbor_bound, neighbor_path, window_bound
from .partition import Partition
from .pipeline import mesh_orders, weight_delays
from .ports import port_classes
from .schedule import Schedule, live_count, mesh_order, stage_order, warmup

__all__ = ["Bounds", "bounds", "fits", "peak_memory", "family_split", "phase_time", "deferred_weights"]


@dataclass(frozen=True)
class Bounds:
    """The bounds of one plan under one schedule, and which is largest."""

    stage: float
    cycle: float
    port: float
    phase: float = 0.0

    @property
    def value(self) -> float:
        return max(self.stage, self.cycle, self.port, self.phase)

    @property
    def partial(self) -> bool:
        """The port bound was not computed (``bounds(..., enough)``)."""
        return self.port == -math.inf

    @property
    def binding(self) -> str:
        return max((self.stage, "stage"), (self.cycle, "cycle"), (self.port, "port"), (self.phase, "phase"))[1]


def _chain(plan: Partition, split: bool) -> list[float]:
    return plan.backward_act if split else plan.backward


def bounds(plan: Partition, schedule: Schedule, enough: float = math.inf, memo: dict | None = None) -> Bounds:
    """The stage, cycle and port bounds of ``plan`` under ``schedule`` (module docstring).

    ``enough``: a caller that drops every plan whose bound reaches it; when the stage, cycle
    or phase bound does, the port bound (the costliest) is not computed and left at -inf
    (:attr:`Bounds.partial`) -- the value is still a lower bound, and at least ``enough``.

    With model chunks (interleaved 1F1B, ZB-V) the stage bound holds per chunk (its own ops
    are a chain) and per mesh (all its chunks' work on one exec resource); the cycle and
    phase bounds, which read 1F1B's order, are not used.  Under ZB-H1 the weight parts a
    stage defers to the cool-down (``k_p`` after its last ``BA``) move from before its last
    chain op to after it, and the phase bound is not used.

    ``memo``: a dict kept across the schedules of one plan.  The fill, the drains, the round
    trips, the stage bound and the port bound depend on the schedule only through whether
    it splits backward and how many weight parts it defers, so schedules that agree on those
    share them (an eager-1F1B family prices 9 schedules of 2 or 3 such kinds)."""
    c = plan.costs
    B = c.microbatches
    S = len(plan.stages)               # chunks: the stages without interleaving
    split = schedule.split
    f, b, bw = plan.forward, plan.backward, plan.backward_weight
    ch = _chain(plan, split)
    w = [x + y for x, y in zip(f, b)]
    chans = plan.channels
    kk = deferred_weights(schedule, c.stages, B) if split else (0,) * S
    key = (split, kk)
    if memo is not None and key in memo:
        act, grad, tie, g, ins, outs_of, H, D, stage, R = memo[key]
    else:
        act = {(p, q): plan.activation_time(p, q) for p, q in chans}
        grad = {(p, q): plan.gradient_time(q, p) for p, q in chans}      # keyed by the forward pair
        tie = [0.0] * S                # a tied copy's all-reduce follows both stages' reductions
        g = plan.tail_weight if split else plan.tail_full
        u = [kk[p] * bw[p] + g[p] for p in range(S)]
        if plan.copies:
            opt = plan.optimizer
            for a, bb, q in plan.copies:
                t = c.tie_sync(plan, a, bb)[0]
                for p, other in ((plan.owner[a], q), (q, plan.owner[a])):
                    tie[p] = max(tie[p], t)
                    # the all-reduce waits for this stage's reductions, and both stages'
                    # optimizer steps wait for it: the other's may be the longer one
                    u[p] = max(u[p], kk[p] * bw[p] + g[p] - opt[p] + t + max(opt[p], opt[other]))
        # fill: earliest start of each stage's first forward
        ins = [[] for _ in range(S)]
        outs_of = [[] for _ in range(S)]
        for p, q in chans:
            ins[q].append(p)
            outs_of[p].append(q)
        # (no earlier than its parameter gathers allow, and the first forward is longer by
        # what it waits for the next ones: Partition.gather_ready, gather_wait)
        ready, wait = plan.gather_ready, plan.gather_wait
        H = [0.0] * S
        H[0] = ready[0]
        for q in range(1, S):
            H[q] = max([ready[q]] + [H[p] + f[p] + wait[p] + act[p, q] for p in ins[q]])
        # drain after the last chain op, for the last micro-batch
        D = [0.0] * S
        for p in range(S):
            D[p] = max([u[p]] + [grad[q, p] + ch[q] + D[q] for q in ins[p]])
        stage = max(H[p] + wait[p] + B * w[p] - kk[p] * bw[p] + D[p] for p in range(S))
        R = [_round_trip(p, S, f, ch, act, grad, ins, outs_of) for p in range(S)]
        if memo is not None:
            memo[key] = (act, grad, tie, g, ins, outs_of, H, D, stage, R)
    cycle = phase = 0.0
    if plan.virtual > 1:
        for m in range(c.stages):
            mine = [k for k in range(S) if plan.mesh[k] == m]
            stage = max(stage, min(H[k] for k in mine) + B * sum(w[k] for k in mine)
                        + min(g[k] + tie[k] for k in mine))
    else:
        # round trips and the cycle bound
        delays = _delays(plan, schedule, memo)
        for p in range(S):
            W = warmup(schedule, S, p, B)
            j = (B - 1) // W
            if schedule.kind == "zb-h1":
                # the chain ops from micro-batch jW on, and those of their weight parts that
                # precede the last chain op; the deferred ones are in D
                C = f[p] + R[p] + ch[p]
                rest = (B - j * W) * ch[p] + max(0, B - j * W - kk[p]) * bw[p]
                cycle = max(cycle, H[p] + j * C + f[p] + R[p] + rest + D[p])
                continue
            before_f = bw[p] if split and not delays[p] else 0.0
            C = f[p] + R[p] + ch[p] + before_f
            cycle = max(cycle, H[p] + j * C + f[p] + R[p] + (B - j * W) * b[p] - (b[p] - ch[p]) + D[p])
            phase = max(phase, H[p] + phase_time(f[p], b[p], ch[p], R[p], W, B) + D[p])
        # the neighbour cycle (neighbor.py): a slow link paces the two stages it joins
        for p in range(S - 1):
            path = neighbor_path(schedule, S, p, B) if (p, p + 1) in act else None
            if path is not None:
                jump = f[p] + act[p, p + 1] + f[p + 1] + ch[p + 1] + grad[p, p + 1] + ch[p]
                cycle = max(cycle, float(neighbor_bound(path, H[p], f[p], ch[p], jump, R[p], D[p])))
        # windows (neighbor.py): the same cycle through h later stages at once
        links = [act[p, p + 1] + grad[p, p + 1] if (p, p + 1) in act else math.nan for p in range(S - 1)]
        cycle = max(cycle, window_bound(schedule, B, f, ch, links, H, R, D))
    if schedule.kind == "gpipe":
        # every forward before any backward: a channel carries all its activations, the
        # receiver's last forward and a round trip pass, then it carries all the gradients
        for p, q in chans:
            cycle = max(cycle, H[p] + f[p] + B * act[p, q] + f[q] + R[q] + ch[q] + B * grad[p, q] + ch[p] + D[p])
    if max(stage, cycle, phase) >= enough:
        return Bounds(stage, cycle, -math.inf, phase)
    if plan.virtual == 1:
        # the link bound (link.py), counted with the cycle bound: a channel whose transfers
        # outlast the stages' ops paces both stages
        cycle = max(cycle, _link_bound(plan, schedule, key, memo, f, ch, act, grad, H, R, D))
        if max(stage, cycle, phase) >= enough:
            return Bounds(stage, cycle, -math.inf, phase)
        # a stage's own playout and the backlog it leaves behind (counted with the cycle bound)
        cycle = max(cycle, _playout_bound(plan, schedule, memo, f, ch, act, grad, H, R, D))
        if max(stage, cycle, phase) >= enough:
            return Bounds(stage, cycle, -math.inf, phase)
    if memo is not None and (key, "port") in memo:
        port = memo[key, "port"]
    else:
        port = _port_bound(plan, B, H, R, f, w, ch, D, act, grad)
        if memo is not None:
            memo[key, "port"] = port
    return Bounds(stage, cycle, port, phase)


def _link_bound(plan: Partition, schedule: Schedule, key: tuple, memo: dict | None, f, ch, act, grad, H, R,
                D) -> float:
    """The largest link bound (:mod:`.link`) over the channels between neighbouring stages
    whose transfers can wait for each other; -inf when none applies."""
    B = plan.costs.microbatches
    S = len(plan.stages)
    if B > LINK_MICROBATCHES or not plan.costs.comm:
        return -math.inf
    split = schedule.split
    bw = plan.backward_weight
    delays = None
    best = -math.inf
    for p in range(S - 1):
        q = p + 1
        if (p, q) not in act or not paced(act[p, q], grad[p, q], f[p], ch[q]):
            continue
        if delays is None:           # read only when some link paces (it scans every channel)
            delays = _delays(plan, schedule, memo)
        # the two stages' orders are all the playout reads of the schedule (link_key)
        at = (key, "link", p, link_key(schedule, S, p, B, delays[p], delays[q]))
        if memo is not None and at in memo:
            out = memo[at]
        else:
            run = link_numbers(schedule, S, p, B, delays[p], delays[q], ends=p > 0)
            out = run(f[p], ch[p], bw[p] if split else 0.0, f[q], ch[q], bw[q] if split else 0.0,
                      act[p, q], grad[p, q], R[q])
            if memo is not None:
                memo[at] = out
        best = max(best, H[p] + max(out[0] + D[p], out[1] + D[q]))
        if p > 0:
            # the backlog also reads the earlier stages' orders: not shared through the key
            best = max(best, _backlog(schedule, S, p, B, H[p] + np.asarray(out[4]), f, ch,
                                      bw if split else [0.0] * S, act, grad, D, delays))
    return best


# the playout bound's backlog cells (stages x stages x micro-batches) at most: past it (deep or
# long pipelines) the term is left out, which only weakens the objective
PLAYOUT_CELLS = 1 << 20


def _playout_bound(plan: Partition, schedule: Schedule, memo: dict | None, f, ch, act, grad, H, R, D) -> float:
    """**Playout bound**: each stage's own ops played out in its order, and the backlog each
    leaves on the earlier stages; -inf when it does not apply.

    Stage p's forward of micro-batch k starts no earlier than ``G_p(k) = max(H_p + k f_p,
    G_{p-1}(k) + f_{p-1} + x(p-1->p))`` (every stage runs its forwards in micro-batch order,
    after the fill); its chain op of m no earlier than the end of its forward of m and the
    round trip ``R_p``; its ops one at a time, in its order.  That gives ``e_p(m)``, a lower
    bound of the end of its chain op of m, and the iteration lasts at least ``e_p(B - 1) +
    D_p``.  Micro-batch m's gradient then goes back through the stages before p (their chain
    ops and transfers, each at its least) and reaches stage r, which still has every op from
    its chain op of m to its last chain op and its drain ``D_r`` to run (the link bound's
    backlog, :func:`_backlog`, from this playout instead of a link's).  Where a slow stage sits
    behind faster later ones, the gradients queue up in front of it: on GPT-3 175B on 16 384
    GPUs under eager-1F1B (32 stages of 2-4 layers, 24 micro-batches) that queue is on the
    critical path, 5% above the stage bound."""
    c = plan.costs
    B = c.microbatches
    S = len(plan.stages)
    if S < 2 or S * S * B > PLAYOUT_CELLS or not c.comm:
        return -math.inf
    split = schedule.split
    delays = _delays(plan, schedule, memo)
    bw = plan.backward_weight if split else [0.0] * S
    k = np.arange(B, dtype=float)
    ends = np.empty((S, B))
    work = np.empty((S, B))
    release = None
    best = -math.inf
    for p in range(S):
        own = H[p] + k * f[p]
        linked = p > 0 and (p - 1, p) in act and release is not None
        release = np.maximum(own, release + f[p - 1] + act[p - 1, p]) if linked else own
        rel = release.tolist()
        fp, cp, wp, rp = f[p], ch[p], bw[p], R[p]
        t = H[p]
        done = [0.0] * B
        e = [0.0] * B
        for op, m in stage_order(schedule, S, p, B, delays[p]):
            if op == "F":
                t = (t if t > rel[m] else rel[m]) + fp
                done[m] = t
            elif op == "BW":
                t += wp
            else:
                ready = done[m] + rp
                t = (t if t > ready else ready) + cp
                e[m] = t
        ends[p] = e
        best = max(best, e[-1] + D[p])
        nf, nc, nw = backlog_counts(schedule, S, p, B, delays[p])
        work[p] = nf * fp + nc * cp + nw * wp
    return max(best, float(_backlogs(ends, work, ch, grad, D).max()))


def _backlogs(ends: np.ndarray, work: np.ndarray, ch, grad, D) -> np.ndarray:
    """:func:`_backlog` of every stage at once, without its depth limit: ``[p, r]``, the
    backlog stage p's chain ops ending at ``ends[p]`` (by micro-batch) leave on stage r < p
    (``work[r]``: r's ops from its chain op of m to its last, by m; -inf where none)."""
    S = len(ends)
    # back from stage p to stage r < p: m's gradient reaches r at e_p(m) + x(p->p-1) + the
    # chain ops and transfers of the stages in between (Q), where every neighbour is joined
    joined = [True] + [(i - 1, i) in grad for i in range(1, S)]
    gap = np.array([grad[i - 1, i] if joined[i] and i else 0.0 for i in range(S)])
    Q = np.concatenate([[0.0], np.cumsum([ch[i] + gap[i] for i in range(1, S)])])   # Q[i]: stages 1..i
    broken = np.cumsum([not x for x in joined])         # stages i, j joined all along: same count
    pp, rr = np.arange(S)[:, None], np.arange(S)[None, :]
    ok = (rr < pp) & (broken[pp] == broken[rr])
    lead = np.where(ok, Q[np.maximum(pp - 1, 0)] - Q[rr] + gap[pp], -np.inf)
    reach = (ends[:, None, :] + work[None, :, :]).max(axis=2)        # [p, r]: max over m
    return reach + lead + np.asarray(D)[None, :]


# stages back from a paced link the backlog is followed through (each costs O(B) per plan
# and schedule); fewer is still a bound, and the critical paths seen end within a few
BACKLOG_STAGES = 16


def _backlog(schedule: Schedule, S: int, p: int, B: int, ends: np.ndarray, f, ch, bw, act, grad, D,
             delays) -> float:
    """The link bound's backlog: ``ends[m]``, when stage p's chain op of micro-batch m ends at
    the earliest (the link played out), is followed by m's gradient going back through each
    earlier stage r joined to the next (up to :data:`BACKLOG_STAGES` of them); r then still
    has every op from its chain op of m to its last chain op (:func:`.link.backlog_counts`),
    and its drain ``D_r``.  Where the link has held the activations back, the gradients come
    late and an earlier stage slower than the link has all of its backward passes still to
    run (GPT-like blocks on two hosts joined by 10 Gbps: the critical path of such plans,
    6-7% above the bounds before)."""
    total = -math.inf
    arrive = ends
    for r in range(p - 1, max(p - 1 - BACKLOG_STAGES, -1), -1):
        if (r, r + 1) not in act:
            break
        nf, nc, nw = backlog_counts(schedule, S, r, B, delays[r])
        arrive = arrive + grad[r, r + 1]
        total = max(total, float((arrive + (nf * f[r] + nc * ch[r] + nw * bw[r])).max()) + D[r])
        arrive = arrive + ch[r]
    return total


@functools.lru_cache(maxsize=4096)
def deferred_weights(schedule: Schedule, stages: int, microbatches: int) -> tuple[int, ...]:
    """Per chunk, the ``BW`` its stage runs after the chunk's last ``BA`` (1 under weight
    delaying: its own; more under the zero-bubble schedules)."""
    out: dict[int, int] = {}
    for p in range(stages):
        order = mesh_order(schedule, stages, p, microbatches)
        for k in {k for _, k, _ in order}:
            last = max(i for i, (op, kk, _) in enumerate(order) if kk == k and op == "BA")
            out[k] = sum(1 for op, kk, _ in order[last + 1:] if kk == k and op == "BW")
    return tuple(out[k] for k in range(len(out)))


def phase_time(f: float, b: float, c: float, R: float, W: int, B: int) -> float:
    """Least time from a stage's first forward to the end of its last chain op (phase bound).

    With ``B > W``: the first chain op waits for the ``W`` warm-up forwards and for the first
    round trip; up to the last forward come ``B - W`` forwards and chain ops (and the weight
    parts in between); the last chain op waits for the last round trip and the ``W - 1``
    backwards before it.  With ``B <= W`` (every forward first): the backwards follow the
    forwards, and the last one waits for the last forward's round trip."""
    if B > W:
        return (max(f + R, W * f) + (B - W) * (f + c) + max(0, B - W - 1) * (b - c)
                + max(R, (W - 1) * b) + c)
    return max(max(f + R, B * f) + (B - 1) * b + c, B * f + R + c)


def _port_bound(plan: Partition, B: int, H, R, f, w, ch, D, act, grad) -> float:
    c = plan.costs
    if not c.comm:
        return 0.0
    calls = []

    def add(resources, duration: float, start: float, tail: float) -> None:
        calls.append((resources, duration, start, tail))

    for p, q in plan.channels:
        # a channel sends its micro-batches in order, so of its B transfers the last one a
        # port serves is micro-batch B - 1's, after which the last micro-batch's drain (D,
        # tied all-reduces and gradient tails included) is still to come
        add(plan.transfer_ports(p, q), B * act[p, q], H[p] + f[p], f[q] + R[q] + ch[q] + D[q])
        add(plan.transfer_ports(q, p), B * grad[p, q], H[q] + f[q] + R[q] + ch[q], ch[p] + D[p])
    for p, st in enumerate(plan.stages):
        cc = plan.table(p)
        if cc.data == 1:
            continue
        if cc.overlaps(st.first):
            red = cc.layer_reduction[st.first:st.last + 1].sum()
            for a, bb, q in plan.copies:
                if q == p:
                    red += cc.layer_reduction_copy[bb] - cc.layer_reduction[bb]
        else:
            red = cc.reduction_all[st.first, st.last]
        add(c.reduction_resources(st.tensor, plan.mesh[p]), float(red), H[p] + B * w[p] - plan.backward[p], 0.0)
    for a, bb, q in plan.copies:
        duration, res = c.tie_sync(plan, a, bb)
        add(res, duration, 0.0, 0.0)
    # the tasks holding exactly the same ports form one class (as in the simulator's engine):
    # the bound per class equals the bound per port, with far fewer sums.  Calls share their
    # port lists (the cost tables hand out one list per route), so classes are found over
    # the distinct lists (:mod:`.ports`).
    lists: list = []
    calls_of: list[list[int]] = []
    index: dict[int, int] = {}
    for k, x in enumerate(calls):
        if x[0]:
            i = index.setdefault(id(x[0]), len(lists))
            if i == len(lists):
                lists.append(x[0])
                calls_of.append([])
            calls_of[i].append(k)
    groups = port_classes(c, lists)[2]
    best = -math.inf
    for g in groups:
        tot, s0, t0 = 0.0, math.inf, math.inf
        for i in g:
            for k in calls_of[i]:
                _, duration, start, tail = calls[k]
                tot, s0, t0 = tot + duration, min(s0, start), min(t0, tail)
        v = tot + s0 + t0
        if v > best:
            best = v
    return best if groups else 0.0


def fits(plan: Partition, schedule: Schedule, memo: dict | None = None) -> bool:
    """Every stage's peak memory, with the micro-batches the schedule keeps, fits (``memo``:
    as in :func:`bounds`; schedules keeping as many micro-batches on every stage share it)."""
    c = plan.costs
    if plan.virtual > 1:
        return all(m <= c.device_memory for m in plan.mesh_memory(mesh_orders(plan, schedule))[0])
    live = _live(plan, schedule, memo)
    if memo is not None and ("fits", live) in memo:
        return memo["fits", live]
    out = all(m <= c.device_memory for m in plan.memory(list(live)))
    if memo is not None:
        memo["fits", live] = out
    return out


def peak_memory(plan: Partition, schedule: Schedule) -> float:
    """The fullest device's bytes under ``schedule``: what :func:`fits` compares with the
    device memory (for the shortfall of a space where nothing fits)."""
    if plan.virtual > 1:
        return max(plan.mesh_memory(mesh_orders(plan, schedule))[0])
    return max(plan.memory(list(_live(plan, schedule, None))))


def _live(plan: Partition, schedule: Schedule, memo: dict | None) -> tuple[int, ...]:
    """Micro-batches each stage keeps at its peak under ``schedule`` (no model chunks)."""
    c = plan.costs
    delays = _delays(plan, schedule, memo)
    return tuple(live_count(schedule, c.stages, p, c.microbatches, delays[p]) for p in range(c.stages))


def _delays(plan: Partition, schedule: Schedule, memo: dict | None) -> list[bool]:
    """:func:`.pipeline.weight_delays`, once per plan (``memo``): it depends on the schedule
    only through whether it delays weight parts, and it reads every channel."""
    if memo is None or not schedule.weight_delay:
        return weight_delays(plan, schedule)
    if "delays" not in memo:
        memo["delays"] = weight_delays(plan, schedule)
    return memo["delays"]


def family_split(schedules: list[Schedule]) -> tuple[bool, bool]:
    """(some member splits backward, some member does not)."""
    return any(s.split for s in schedules), any(not s.split for s in schedules)


def _round_trip(p: int, S: int, f, ch, act, grad, ins, outs) -> float:
    """Least time from the end of a forward on stage p to the start of its chain op for the
    same micro-batch: through every later stage it reaches, and back."""
    # ins[q] / outs[q]: the stages q reads from / feeds, so each stage looks only at its channels
    E = [None] * S
    E[p] = 0.0
    for q in range(p + 1, S):
        best = None
        for r in ins[q]:
            if r >= p and E[r] is not None:
                v = E[r] + act[r, q]
                if best is None or v > best:
                    best = v
        if best is not None:
            E[q] = best + f[q]
    Z = [None] * S
    for q in range(S - 1, p, -1):
        if E[q] is None:
            continue
        m = E[q]
        for r in outs[q]:
            if Z[r] is not None:
                v = Z[r] + grad[q, r]
                if v > m:
                    m = v
        Z[q] = m + ch[q]
    m = 0.0
    for r in outs[p]:
        if Z[r] is not None:
            v = Z[r] + grad[p, r]
            if v > m:
                m = v
    return m
