"""The link bound: two neighbouring stages and the channel between them, played out alone.

A channel sends its micro-batches one at a time and in order (each transfer of a channel
waits for the one before it, :mod:`.pipeline`), so when one micro-batch's activation takes
longer than the sender's forward, or its gradient longer than the receiver's chain op, the
*link* paces the pipeline, not the stages.  None of the other bounds sees that: each counts
one transfer per crossing (the cycle and neighbour bounds) or every transfer of a port with
the least head and tail (the port bound).  On random instances of 8 and 16 devices whose
cut crosses a 10 Gbps host link, they left the plans 15-25% under their simulated time.

For stages ``p`` and ``q = p + 1`` this module plays out the part of the iteration's task
graph that lies on the two stages and the channel: each stage's ops in its schedule's order
(``F``, the chain op ``B`` or ``BA``, and ``BW``, with their durations), the activations
``A(m)`` after ``F_p(m)`` and ``A(m - 1)``, ``F_q(m)`` after ``A(m)``, ``q``'s chain op of
``m`` after ``F_q(m)`` and the round trip through the later stages (``R_q``), the gradients
``G(m)`` after that chain op and ``G(m - 1)``, and ``p``'s chain op of ``m`` after ``G(m)``.
Every edge is a dependency of the real graph with the real duration, and ``F_p(0)`` starts
no earlier than the fill ``H_p``; waiting for anything left out (other channels, busy
ports, the earlier stages' forwards) only delays the real run.  So the last chain op of
either stage starts no earlier than it does here, and the iteration lasts at least::

    LK_p = H_p + max(end C_p(B - 1) + D_p,  end C_q(B - 1) + D_q)

with ``D`` the drain after a stage's last chain op (:mod:`.objective`).  Ordering every
event of the two stages is a fixed sequence of max-plus steps for given warm-ups, schedule
and weight delays (:func:`link_steps`), run once on numbers (a plan's objective) or on
arrays of cells (the relaxation's R5, :mod:`.problem`).

When the activation takes at most the sender's forward and the gradient at most the
receiver's chain op, a channel's transfers never wait for each other (each is done before
the next one is ready), and the bound adds little to the neighbour cycle; it is computed
only for links where one of them takes longer (:func:`paced`).
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np

from .schedule import Schedule, stage_order, warmup

__all__ = ["link_key", "link_steps", "link_time", "link_numbers", "paced", "backlog_counts",
           "LINK_MICROBATCHES"]

# The bound plays out about 4B steps per link; past this many micro-batches it is left out
# (still a lower bound without it): the small plans where a link paces the pipeline have
# few, and a 1 536-micro-batch plan of 128 stages would take seconds per plan.
LINK_MICROBATCHES = 512

# step codes: p's forward, chain op, weight part; q's forward, chain op, weight part
PF, PC, PW, QF, QC, QW = range(6)


def link_key(schedule: Schedule, stages: int, p: int, B: int, delay_p: bool, delay_q: bool) -> tuple:
    """What the two stages' orders depend on (members of an eager-1F1B family that agree on
    the two warm-ups share their steps)."""
    if schedule.kind == "zb-h1":
        return ("zb-h1", stages, p, B)
    split = schedule.split
    return (split, warmup(schedule, stages, p, B), warmup(schedule, stages, p + 1, B), B,
            split and delay_p, split and delay_q)


def link_steps(schedule: Schedule, stages: int, p: int, microbatches: int, delay_p: bool = False,
               delay_q: bool = False) -> tuple[tuple[int, int], ...] | None:
    """The max-plus steps of stages ``p`` and ``p + 1`` (module docstring) in an order that
    respects every edge; None for schedules with model chunks."""
    if schedule.virtual > 1 or p + 1 >= stages:
        return None
    key = link_key(schedule, stages, p, microbatches, delay_p, delay_q)
    hit = _STEPS.get(key)
    if hit is None:
        if len(_STEPS) >= 256:            # up to 2 048 steps (220 KB) each on 512 micro-batches
            del _STEPS[next(iter(_STEPS))]    # the oldest
        hit = _STEPS[key] = _steps(schedule, stages, p, microbatches, delay_p, delay_q)
    return hit


_STEPS: dict[tuple, tuple] = {}       # by link_key: the schedules that agree on it share the steps


def _steps(schedule: Schedule, stages: int, p: int, B: int, delay_p: bool,
           delay_q: bool) -> tuple[tuple[int, int], ...]:
    mine = stage_order(schedule, stages, p, B, delay_p)
    theirs = stage_order(schedule, stages, p + 1, B, delay_q)
    code_p = {"F": PF, "B": PC, "BA": PC, "BW": PW}
    code_q = {"F": QF, "B": QC, "BA": QC, "BW": QW}
    sent: set[int] = set()            # activations sent (p's forwards done)
    back: set[int] = set()            # gradients sent (q's chain ops done)
    out: list[tuple[int, int]] = []
    i = j = 0
    while i < len(mine) or j < len(theirs):
        moved = False
        while i < len(mine):
            op, m = mine[i]
            if code_p[op] == PC and m not in back:
                break
            out.append((code_p[op], m))
            if op == "F":
                sent.add(m)
            i += 1
            moved = True
        while j < len(theirs):
            op, m = theirs[j]
            if op == "F" and m not in sent:
                break
            out.append((code_q[op], m))
            if code_q[op] == QC:
                back.add(m)
            j += 1
            moved = True
        if not moved:
            raise ValueError(f"{schedule}: stages {p} and {p + 1} wait for each other")
    return tuple(out)


def link_numbers(schedule: Schedule, stages: int, p: int, microbatches: int, delay_p: bool = False,
                 delay_q: bool = False, uses: int = 1, ends: bool = False) -> Callable[..., tuple]:
    """:func:`link_time` of :func:`link_steps` on Python numbers, as one straight-line
    function of ``(fp, cp, wp, fq, cq, wq, xa, xg, rq)``: a plan's objective asks for it
    once per paced link and schedule, and R5 once per pair of cells, and the loop's dispatch
    took six sevenths of its time (50 us against 7.5 us on 64 micro-batches).  Compiled
    once per :func:`link_key` that is asked for often (``uses``: the runs the caller will
    make); tested equal to :func:`link_time`.  With ``ends``, a fifth value: the end of each
    of p's chain ops, by micro-batch (the backlog of :mod:`.objective`'s link bound)."""
    key = link_key(schedule, stages, p, microbatches, delay_p, delay_q) + (("ends",) if ends else ())
    hit = _NUMBERS.get(key)
    if hit is not None:
        return hit
    B = microbatches
    steps = link_steps(schedule, stages, p, B, delay_p, delay_q)
    # compiling costs about 60 loop runs: only orders asked for often are compiled, and
    # only on up to COMPILE_MICROBATCHES (the code takes about 2.4 KB per micro-batch)
    _ASKED[key] = _ASKED.get(key, 0) + uses
    if _ASKED[key] < COMPILE_AFTER or B > COMPILE_MICROBATCHES:
        return functools.partial(link_time, steps, B, ends=ends)
    lines = ["def run(fp, cp, wp, fq, cq, wq, xa, xg, rq):", "    tp = tq = la = lg = 0.0",
             "    sp = sq = -inf"]
    for code, m in steps:
        if code == PF:
            lines += ["    tp += fp", f"    a{m} = la = (tp if tp > la else la) + xa"]
        elif code == PC:
            lines += [f"    s = tp if tp > g{m} else g{m}", "    tp = s + cp"] + (["    sp = s"] if m == B - 1 else [])
            if ends:
                lines.append(f"    e{m} = tp")
        elif code == PW:
            lines.append("    tp += wp")
        elif code == QF:
            lines.append(f"    tq = q{m} = (tq if tq > a{m} else a{m}) + fq")
        elif code == QC:
            lines += [f"    s = q{m} + rq", "    s = tq if tq > s else s", "    tq = s + cq",
                      f"    g{m} = lg = (tq if tq > lg else lg) + xg"] + (["    sq = s"] if m == B - 1 else [])
        else:
            lines.append("    tq += wq")
    lines.append("    return sp + cp, sq + cq, tp, tq" + (", (" + "".join(f"e{m}, " for m in range(B)) + ")"
                                                            if ends else ""))
    scope: dict = {"inf": math.inf}
    exec(compile("\n".join(lines), "<link steps>", "exec"), scope)      # noqa: S102 (our own text)
    if len(_NUMBERS) >= 128:              # up to about 300 KB of code each
        del _NUMBERS[next(iter(_NUMBERS))]    # the oldest
    _NUMBERS[key] = scope["run"]
    return scope["run"]


_NUMBERS: dict = {}          # by link_key
_ASKED: dict = {}            # link_key -> runs asked for before compiling
COMPILE_AFTER = 64
COMPILE_MICROBATCHES = 128


def paced(xa, xg, fp, cq):
    """Whether a channel's transfers can wait for each other: an activation longer than the
    sender's forward or a gradient longer than the receiver's chain op (module docstring;
    on numbers, or element-wise on arrays)."""
    return (xa > fp) | (xg > cq)


def link_time(steps: tuple[tuple[int, int], ...], B: int, fp, cp, wp, fq, cq, wq, xa, xg, rq,
              mx: Callable = max, ends: bool = False) -> tuple:
    """The two stages played out (module docstring), from ``F_p(0)``'s start, for durations
    ``fp, cp, wp`` (p's forward, chain op and weight part), the same for q, the transfers
    ``xa`` and ``xg`` and q's round trip ``rq``: (end of p's last chain op, end of q's last
    chain op, end of p's last op, end of q's last op).  ``LK_p - H_p`` is the larger of the
    first two, each with its stage's drain.  Numbers with ``mx = max``, arrays with
    ``np.maximum``.  With ``ends``, a fifth value: the end of each of p's chain ops, by
    micro-batch."""
    tp = tq = last_a = last_g = 0.0
    # each time is read once, by the step that waits for it, and then let go: on arrays of
    # cells, only the micro-batches in flight between the two stages are held
    a_end: list = [None] * B
    g_end: list = [None] * B
    fq_end: list = [None] * B
    sp = sq = -math.inf
    chain_end: list = [None] * B
    for code, m in steps:
        if code == PF:
            tp = tp + fp
            last_a = a_end[m] = mx(tp, last_a) + xa
        elif code == PC:
            s = mx(tp, g_end[m])
            g_end[m] = None
            tp = chain_end[m] = s + cp
            if m == B - 1:
                sp = s
        elif code == PW:
            tp = tp + wp
        elif code == QF:
            tq = fq_end[m] = mx(tq, a_end[m]) + fq
            a_end[m] = None
        elif code == QC:
            s = mx(tq, fq_end[m] + rq)
            fq_end[m] = None
            tq = s + cq
            last_g = g_end[m] = mx(tq, last_g) + xg
            if m == B - 1:
                sq = s
        else:
            tq = tq + wq
    if ends:
        return sp + cp, sq + cq, tp, tq, tuple(chain_end)
    return sp + cp, sq + cq, tp, tq


@functools.lru_cache(maxsize=4096)      # int32: 6 KB a stage and schedule at 512 micro-batches
def backlog_counts(schedule: Schedule, stages: int, r: int, microbatches: int,
                   delay: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """By micro-batch ``m``: the forwards, chain ops and weight parts stage ``r`` runs from its
    chain op of ``m`` to its last chain op, both included (its backlog once ``m``'s gradient
    has come, :mod:`.objective`'s link bound); three arrays of ``microbatches`` counts."""
    order = stage_order(schedule, stages, r, microbatches, delay)
    last = max(i for i, (op, _) in enumerate(order) if op in ("B", "BA"))
    out = np.zeros((3, microbatches), dtype=np.int32)
    nf = nc = nw = 0
    for i in range(last, -1, -1):
        op, m = order[i]
        if op == "F":
            nf += 1
        elif op == "BW":
            nw += 1
        else:
            nc += 1
            out[:, m] = (nf, nc, nw)
    out.setflags(write=False)
    return out[0], out[1], out[2]
