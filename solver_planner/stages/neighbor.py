"""The neighbour cycle: a slow link between two stages paces them both, whatever the rest.

The resharding paper §4 (why eager-1F1B exists): under 1F1B a stage cannot send micro-batch ``m + 1``'s
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

**Windows** (:func:`window_bound`).  The same jump reads through ``h`` later stages at once:
``F_p(a)``, its activation through stages ``p + 1 .. q = p + h``, ``q``'s chain op of ``m``,
the gradients back to ``p``'s chain op of ``m``, then ``F_p(n(m))``::

    J_h = sum_{i=p..q} (f_i + c_i) + sum_{i=p..q-1} (x(i->i+1) + x(i+1->i))

Under a *steady order* (``W`` forwards, then chain op ``m`` and forward ``m + W`` in turn,
then the last ``W`` chain ops: 1F1B, and eager-1F1B with its larger ``W``) with ``V = W_q``,
``a(m) = m + V - 1`` and ``n(m) = m + W``: a jump every ``d = W - V + 1`` micro-batches
(``h + 1`` under 1F1B).  Two paths are read: from ``F_p(0)`` through the warm-up to
``F_p(V - 1)``, then jumps; and from ``F_p(W)``, which waits for micro-batch 0's whole round
trip ``R_p`` (its chain op is the one before ``F_p(W)``), then jumps.  Forward steps left
over cost ``f + c``.  The mean per micro-batch of a window, ``J_h / (h + 1)``, tends to
``w + 2x`` on a run of equal stages, which neither the neighbour cycle (``h = 1``) nor the
cycle bound (the whole pipeline, fast stages included) reaches: on Megatron-LM's 1T model on
1 024 A100s (128 stages, 1 536 micro-batches) the plan's bound rose from 217.0 s (phase) to
224.1 s, against 224.2 s simulated.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .schedule import Schedule, mesh_order, warmup

__all__ = ["neighbor_path", "neighbor_bound", "steady_warmup", "steady_warmup_of_orders", "jumps_after_trip",
           "window_bound"]


STEADY_KINDS = ("1f1b", "eager-1f1b", "zb-h1")     # schedules that build the steady order


@functools.lru_cache(maxsize=64)     # stages are read in order, p and p + 1 per family member
def _chain_sequence(schedule: Schedule, stages: int, p: int, microbatches: int) -> tuple | None:
    """Stage p's forwards and chain ops in order (``BW`` dropped), the same with and without
    weight delaying (None otherwise: the path would depend on the plan).  Kept a while: each
    stage's is read for its own path and its predecessor's (on the 1T model's 128 stages of
    1 536 micro-batches, building them took a third of the search); a few dozen only, as each
    holds about 3B ops."""
    # weight delaying moves BW parts only: a schedule without them has one order
    delays = (False, True) if schedule.split else (False,)
    seqs = [tuple((op, m) for op, _, m in mesh_order(schedule, stages, p, microbatches, delay) if op != "BW")
            for delay in delays]
    return seqs[0] if all(x == seqs[0] for x in seqs) else None


def neighbor_path(schedule: Schedule, stages: int, p: int, microbatches: int) -> tuple[int, int, int, int] | None:
    """(forwards, chain ops, jumps, chain ops after the last forward) of the path with the
    most jumps (then the most forwards, then chain ops) from stage p's first forward to its
    last (module docstring); None when it has no jump, or the schedule runs model chunks.

    Where stages p and p + 1 both run the steady order (:func:`steady_warmup`), the path
    depends on their warm-ups and B only, and is found from those: reading the orders of
    every stage of every member of an eager-1F1B family took half of `plan`'s time on a
    1 024-layer model (the tests check the two agree)."""
    B = microbatches
    if schedule.virtual > 1 or p + 1 >= stages or B < 2:
        return None
    W, V = steady_warmup(schedule, stages, p, B), steady_warmup(schedule, stages, p + 1, B)
    if W is not None and V is not None:
        return _steady_path(W, V, B)
    if W is None and schedule.kind in STEADY_KINDS:
        # stage p warms up all B forwards (its schedule builds the steady order, so None
        # means W >= B): no forward follows a chain op, hence no jump.  Reading the orders to
        # find that out was a fifth of an eager-1F1B search on a 1 024-layer model under the
        # profiler: its 128-stage pairs of fewer micro-batches hold many such stages
        return None
    return path_of_orders(schedule, stages, p, B)


def _steady(W: int, B: int) -> tuple:
    """The steady order's forwards and chain ops (``C``) with ``W`` warm-up forwards."""
    out = [("F", m) for m in range(W)]
    for m in range(B - W):
        out += [("C", m), ("F", m + W)]
    return tuple(out + [("C", m) for m in range(B - W, B)])


@functools.lru_cache(maxsize=1 << 16)     # a few numbers each
def _steady_path(W: int, V: int, B: int) -> tuple[int, int, int, int] | None:
    """:func:`_path` of two steady orders in closed form (walking the orders took 1.2 s of
    the 1T model's 10 s search on 1 024 GPUs, 1 536 micro-batches each; a test checks the
    two agree).  Stage p's chain op ``m`` precedes ``F_p(m + W)`` and the next stage's
    follows ``F_q(m + V - 1)``: jumps of ``d = W - V + 1`` forwards, from ``F_p(V - 1)`` on
    to ``F_p(B - W + V - 2)``, and none when ``V > W``.  The most jumps run back to back
    from the first; the forward steps left are then ``B - 1 - J d`` wherever the jumps sit,
    and the jumps skip fewest chain ops placed first: ``p`` runs one chain op after each of
    ``F_p(W - 1) .. F_p(B - 2)``, and ``W`` after the last forward."""
    if V > W or B - W - 1 < 0:
        return None
    d = W - V + 1
    jumps = (B - W - 1) // d + 1
    return B - 1 - jumps * d, (B - W) - (jumps * d - d + 1), jumps, W


@functools.lru_cache(maxsize=8192)
def path_of_orders(schedule: Schedule, stages: int, p: int, microbatches: int) -> tuple[int, int, int, int] | None:
    """:func:`neighbor_path` read off the two stages' op orders (any schedule without chunks)."""
    B = microbatches
    if schedule.virtual > 1 or p + 1 >= stages or B < 2:
        return None
    mine = _chain_sequence(schedule, stages, p, B)
    nxt = _chain_sequence(schedule, stages, p + 1, B)
    if mine is None or nxt is None:
        return None
    return _path(mine, nxt, B)


def _path(mine: tuple, nxt: tuple, B: int) -> tuple[int, int, int, int] | None:
    """:func:`neighbor_path` of stage p's and stage p + 1's forwards and chain ops."""
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


@functools.lru_cache(maxsize=8192)
def steady_warmup(schedule: Schedule, stages: int, p: int, microbatches: int) -> int | None:
    """``W`` when stage p runs its forwards and chain ops (``BW`` dropped) in a steady order
    (module docstring) with ``W < B`` warm-up forwards, the same with and without weight
    delaying; None otherwise.

    1F1B, eager-1F1B and ZB-H1 (``schedule.stage_order``) build their orders that way, so
    their ``W`` is read off the schedule (reading the orders took 4 of the 10 s of the 1T
    model's search on 1 024 GPUs); :func:`steady_warmup_of_orders` reads them, and the tests
    check the two agree."""
    B = microbatches
    if schedule.virtual > 1 or schedule.kind not in STEADY_KINDS:
        return None if schedule.virtual > 1 else steady_warmup_of_orders(schedule, stages, p, B)
    if schedule.kind == "zb-h1":
        W = min(stages - p, B)
    else:
        W = warmup(schedule, stages, p, B)
    return W if W < B else None


def steady_warmup_of_orders(schedule: Schedule, stages: int, p: int, microbatches: int) -> int | None:
    """:func:`steady_warmup` read off stage p's op orders (any schedule without chunks)."""
    B = microbatches
    if schedule.virtual > 1:
        return None
    seq = _chain_sequence(schedule, stages, p, B)
    if seq is None:
        return None
    W = 0
    while W < len(seq) and seq[W][0] == "F":
        W += 1
    if not 0 < W < B or len(seq) != 2 * B:
        return None
    if tuple(("F" if op == "F" else "C", m) for op, m in seq) != _steady(W, B):
        return None
    return W


def jumps_after_trip(W, V, microbatches: int):
    """(jumps, forward steps left) of a window's path from ``F_p(W)`` to ``F_p(B - 1)``
    (module docstring): a jump every ``d = W - V + 1`` micro-batches, ``W``, ``V`` the steady
    warm-ups of the window's first and last stages (element-wise on arrays, ``d >= 1``)."""
    d = W - V + 1
    n = microbatches - 1 - W
    j = n // d
    return j, n - j * d


_ROWS = 64      # stages per block: memory stays O(rows x stages) on deep pipelines


def window_bound(schedule: Schedule, microbatches: int, f, c, links, fill, round_trip, drain) -> float:
    """The largest window bound (module docstring) over every stage ``p`` and depth ``h``.

    ``f``, ``c``, ``fill`` (``H``), ``round_trip`` (``R``), ``drain`` (``D``): per stage;
    ``links[i]``: ``x(i->i+1) + x(i+1->i)``, NaN where stages ``i`` and ``i + 1`` share no
    channel (no window crosses it).  -inf when no window applies."""
    B = microbatches
    f, c = np.asarray(f, dtype=float), np.asarray(c, dtype=float)
    S = len(f)
    if S < 2:
        return -math.inf
    Ws = np.array([steady_warmup(schedule, S, p, B) or 0 for p in range(S)], dtype=np.int64)
    links = np.asarray(links, dtype=float)
    bad_link = np.concatenate([[0], np.cumsum(np.isnan(links))])            # bad links before i
    bad_stage = np.concatenate([[0], np.cumsum(Ws == 0)])
    w = f + c
    cw = np.concatenate([[0.0], np.cumsum(w)])
    cl = np.concatenate([[0.0], np.cumsum(np.nan_to_num(links))])
    H, R, D = (np.asarray(x, dtype=float) for x in (fill, round_trip, drain))
    q = np.arange(S)[None, :]
    best = -math.inf
    for lo in range(0, S - 1, _ROWS):
        p = np.arange(lo, min(lo + _ROWS, S - 1))[:, None]
        W, V = Ws[p], Ws[q]
        d = W - V + 1
        ok = ((q > p) & (W > 0) & (d >= 1) & (bad_link[q] == bad_link[p])
              & (bad_stage[q + 1] == bad_stage[p]))
        if not ok.any():
            continue
        d = np.where(ok, d, 1)
        J = cw[q + 1] - cw[p] + cl[q] - cl[p]
        fp, cp, wp = f[p], c[p], w[p]
        # from F(W), after micro-batch 0's round trip
        j2, r2 = jumps_after_trip(W, np.where(ok, V, W), B)
        after_trip = fp + R[p] + cp + j2 * J + r2 * wp
        # from F(0) through the warm-up to F(V - 1), when at least one jump fits
        n1 = B - V
        j1 = n1 // d
        from_start = np.where(j1 >= 1, (V - 1) * fp + j1 * J + (n1 - j1 * d) * wp, -np.inf)
        end = fp + np.maximum(R[p], (W - 1) * cp) + cp + D[p]
        v = np.where(ok, H[p] + np.maximum(after_trip, from_start) + end, -np.inf)
        best = max(best, float(v.max()))
    return best
