"""The neighbour cycle: a slow link between two stages paces them both, whatever the rest.

Seed 002 §4 (why eager-1F1B exists): under 1F1B a stage cannot send micro-batch ``m + 1``'s
activation before the gradient of an earlier micro-batch has come back, so the link between
two stages is crossed twice per cycle.  The cycle bound of :mod:`.objective` reads that cycle
through every later stage, ``W_p`` micro-batches apart; between neighbours it is shorter and
comes more often.  For stages ``p`` and ``q = p + 1`` joined by a channel, let ``a(m)`` be the
last forward ``q`` runs before its chain op (``B``, or ``BA``) of micro-batch ``m``, and
``n(m)`` the first forward ``p`` runs after its own chain op of ``m``.  Then, from the task
graph of :mod:`.pipeline` (its dependencies and each stage's op order, nothing else)::

    start F_p(n(m)) >= start F_p(a(m)) + J,   J = f_p + x(p->q) + f_q + c_q + x(q->p) + c_p

(``F_p(a(m))``, its activation, ``F_q(a(m))``, ``q``'s chain op of ``m``, its gradient,
``p``'s chain op of ``m``); and ``start F_p(k + 1) >= start F_p(k) + f_p + e_k c_p`` with
``e_k`` the chain ops ``p`` runs between the two forwards.  Any path of such edges from
``F_p(0)`` (not before the fill ``H_p``) to ``F_p(B - 1)``, then the last forward, the last
chain op (after the round trip ``R_p`` and the ``r - 1`` chain ops before it) and the drain
``D_p``, is a lower bound of the iteration::

    NB_p = H_p + (forwards) f_p + (chain ops) c_p + (jumps) J + f_p + max(R_p, (r - 1) c_p) + c_p + D_p

Under 1F1B ``a(m) = m + W_q - 1`` and ``n(m) = m + W_p``: a jump every 2 micro-batches (3 or
more under eager-1F1B, which is how it hides the link).  On a plan whose cut crosses a slow
host link this is what the simulation shows (on a random 8-GPU instance, 8.9 ms per
micro-batch against 6.7 ms of transfer each way), and what neither the cycle bound nor the
port bound saw: they left the plan 25% under its simulated time.

:func:`neighbor_path` reads the counts of the path with the most jumps off the two stages'
op orders (weight parts ``BW`` are left out: they only lengthen the path), so every schedule
without model chunks is handled the same way.
"""

from __future__ import annotations

import functools

import numpy as np

from .schedule import Schedule, mesh_order

__all__ = ["neighbor_path", "neighbor_bound"]


def _chain_sequence(schedule: Schedule, stages: int, p: int, microbatches: int) -> tuple | None:
    """Stage p's forwards and chain ops in order (``BW`` dropped), the same with and without
    weight delaying (None otherwise: the path would depend on the plan)."""
    seqs = [tuple((op, m) for op, _, m in mesh_order(schedule, stages, p, microbatches, delay) if op != "BW")
            for delay in (False, True)]
    return seqs[0] if seqs[0] == seqs[1] else None


@functools.lru_cache(maxsize=8192)
def neighbor_path(schedule: Schedule, stages: int, p: int, microbatches: int) -> tuple[int, int, int, int] | None:
    """(forwards, chain ops, jumps, chain ops after the last forward) of the path with the
    most jumps (then the most forwards, then chain ops) from stage p's first forward to its
    last (module docstring); None when it has no jump, or the schedule runs model chunks."""
    B = microbatches
    if schedule.virtual > 1 or p + 1 >= stages or B < 2:
        return None
    mine = _chain_sequence(schedule, stages, p, B)
    nxt = _chain_sequence(schedule, stages, p + 1, B)
    if mine is None or nxt is None:
        return None
    # q: the last forward before each chain op
    a: dict[int, int] = {}
    last = None
    for op, m in nxt:
        if op == "F":
            last = m
        elif last is not None:
            a[m] = last
    # p: forwards must come in micro-batch order (they do in every schedule without chunks)
    forwards = [m for op, m in mine if op == "F"]
    if forwards != list(range(B)):
        return None
    between = [0] * B                 # chain ops between F(k) and F(k + 1); after F(B - 1) at B - 1
    after: dict[int, int] = {}        # chain op of m -> the next forward (if any)
    k = -1
    pending: list[int] = []
    for op, m in mine:
        if op == "F":
            for x in pending:
                after[x] = m
            pending = []
            k = m
        else:
            if k < 0:
                return None
            between[k] += 1
            pending.append(m)
    jumps_into: dict[int, list[int]] = {}
    for m, n in after.items():
        src = a.get(m)
        if src is not None and src < n:
            jumps_into.setdefault(n, []).append(src)
    best: list[tuple[int, int, int]] = [(0, 0, 0)] * B
    for node in range(1, B):
        j, f, c = best[node - 1]
        cand = (j, f + 1, c + between[node - 1])
        for src in jumps_into.get(node, ()):
            js, fs, cs = best[src]
            cand = max(cand, (js + 1, fs, cs))
        best[node] = cand
    jumps, fwd, chains = best[B - 1]
    rest = between[B - 1]
    if jumps == 0 or rest == 0:
        return None
    return fwd, chains, jumps, rest


def neighbor_bound(path: tuple[int, int, int, int], fill: float, f: float, c: float, jump: float,
                   round_trip: float, drain: float) -> float:
    """``NB_p`` of the module docstring for the counts :func:`neighbor_path` gave (element-wise
    on arrays)."""
    fwd, chains, jumps, rest = path
    return fill + fwd * f + chains * c + jumps * jump + f + np.maximum(round_trip, (rest - 1) * c) + c + drain
