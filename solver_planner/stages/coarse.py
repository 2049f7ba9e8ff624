"""Deep models: stages that start on block boundaries, and a bound over every cut.

The exact programs of :mod:`.problem` keep each stage's cells ``(first, last)``, about ``L^2``
over a pipeline.  A model of more than :data:`EXACT` layers is cut into :data:`UNITS` blocks of
about equal work, as Alpa clusters operators into layers before its stage DP (Alpa OSDI'22
§5.2, "operator clustering"), and its stages start on block boundaries only.  Every plan
searched is still a plan of the whole model, priced and simulated layer by layer; only the
plan space is smaller, so the search's bounds hold for block-aligned plans alone.

What every plan (any cut) can reach is bounded by :func:`fine_bound`: R1 of
:mod:`.problem` relaxed so that it can be minimised over every contiguous split exactly by
a greedy split, in ``O(S c log L)`` per threshold.  It is what the search reports as the
bound of a coarse pair's plans that it did not search.
"""

from __future__ import annotations

import bisect
import functools
import math

import numpy as np

from .objective import deferred_weights

__all__ = ["EXACT", "UNITS", "coarse_cuts", "fine_bound", "least_memory_floor"]

GRID = 8              # pieces of the first stage's possible ends fine_bound tests per threshold
RELAXED_PIECES = True  # fine_bound rules a threshold out for every piece with one relaxed test
                       # (False: piece by piece, as the tests compare)
EXACT = 256           # up to this many layers every layer may start a stage
UNITS = 128           # past it, the blocks stages may start on (at least one per stage): the
                      # programs' work grows as units^2 (each stage's first and last unit)


def _layer_work(costs) -> np.ndarray:
    """Per layer, the least time per micro-batch over the configurations (forward and backward)."""
    return np.min([f + a + w for f, a, w in (costs.layer_times(c) for c in costs.configs)], axis=0)


def coarse_cuts(costs, units: int) -> np.ndarray:
    """The first layers of ``units`` blocks of contiguous layers, about equal in work (and the
    end, ``L``): where the stages of a model of more than ``units`` layers may start."""
    L = costs.model.num_layers
    if L <= units or not costs.configs:
        return np.arange(L + 1)
    work = _layer_work(costs)
    cum = np.concatenate([[0.0], np.cumsum(np.maximum(work, 0.0))])
    total = cum[-1]
    if total <= 0:
        cuts = np.linspace(0, L, units + 1)
    else:
        # the layer boundary nearest each multiple of total / units
        targets = total * np.arange(1, units) / units
        cuts = np.searchsorted(cum, targets)
    cuts = np.unique(np.concatenate([[0], np.clip(np.round(cuts).astype(int), 1, L - 1), [L]]))
    cuts = cuts.tolist()
    while len(cuts) - 1 < units:
        # equal work left some boundaries on the same layer (a heavy layer): cut the widest
        # block (the first of the widest) at its middle until the count is what was asked;
        # each cut may split a block made by the one before (L > units: always room)
        widths = np.diff(cuts)
        k = int(np.argmax(widths))
        cuts.insert(k + 1, cuts[k] + int(widths[k]) // 2)
    return np.asarray(cuts)


def _last_fitting(term, k: int, hi: int, tau: float) -> int:
    """The last i in k..hi with ``term(i) <= tau`` (k - 1: none), ``term`` growing with i:
    every greedy split below asks this of each stage."""
    if term(hi) <= tau:
        return hi
    lo, top = k - 1, hi                 # term(lo) fits (or none), term(top) does not
    while top - lo > 1:
        mid = (lo + top) // 2
        if term(mid) <= tau:
            lo = mid
        else:
            top = mid
    return lo


def _memory_floor(costs, cfg):
    """(static prefix, prefix of one micro-batch's activations, transient) of
    :meth:`.StageCosts.memory_floor` as plain numbers, for scalar reads (a range table's read
    costs tens of microseconds; the greedy splits make millions): a stage keeping ``n``
    micro-batches holds ``n`` times the activations; the transient is the sum of two range
    maxima."""
    from .ranges import _SparseMax

    static, act, _ = costs.memory_floor(cfg, 1)
    layers = np.arange(costs.model.num_layers)
    prefix = [np.concatenate([[0.0], np.cumsum(np.asarray(t[layers, layers], dtype=float))]).tolist()
              for t in (static, act)]
    tables = [_SparseMax(part).table for part in costs.transient_parts(cfg)]

    def transient(k: int, i: int) -> float:
        level = (i - k + 1).bit_length() - 1
        j = i - (1 << level) + 1
        return sum(max(float(t[level, k]), float(t[level, j])) for t in tables)

    return prefix[0], prefix[1], transient


def fine_bound(pair, upper: float, tol: float = 1e-3, phase: bool = True) -> float:
    """A lower bound of ``R`` (hence of the objective and the simulated time) over *every*
    plan of ``pair``, whatever layers its stages start at; ``upper``: where to stop looking
    (a time some plan reaches).

    The relaxation, ``max_p max(B w_p, [p > 0] (FC_p + B w_p - r_p))``:

    * ``B w_p + G_p``: R1's ``T2``, the stage's own work for every micro-batch and its
      gradient tail (the tail only without tied layers; the tied all-reduce dropped);
    * ``FC_p + XA_p + B w_p - r_p``: R1's fill, the forward and chain of every earlier stage,
      at each layer's least over the configurations (``FC_p``), and its transfers both ways
      at their least (``XA_p``, which grows with p and depends on nothing else), then the
      stage's ``T1`` (its work less the weight gradients a split schedule leaves after the
      chain, ``r_p``);
    * the first stage's drain (``u0``) in every later fill, read at the least end of each of
      :data:`GRID` pieces of the first stage's ends (the later stages then start at the
      latest end of the piece), since it grows with the first stage while the rest shrinks;
    * memory with the fewest micro-batches each stage keeps under the family (in 1F1B the
      first stage keeps S, the last one), tied copies left out;
    * with ``phase``, the phase of the 1F1B family (the resharding paper's eager-1F1B and
      GPipe too; not ZB-H1, whose R has no R3 to imply it): stage p's first backward waits
      for micro-batch 0's forward through the stages before it and itself, ``H_p + f_p``,
      and its round trip through every later stage, ``Y_p``; after it the stage still runs
      all B chain ops, and under a schedule that splits backward every weight part but the
      ``k`` it leaves after its last chain op (``k = 1`` under weight delaying,
      :func:`.objective.deferred_weights`); then the last micro-batch's gradient goes back
      through every earlier stage's chain op, ``D_p`` (the first stage's own drain, under
      its configuration): ``H_p + f_p + B c_p + (B - k) w_p + Y_p + D_p`` (the weight parts
      took the gap of 1 024 equal layers under the eager-1F1B family from 22.4% to 17.4%);
      with fewer warm-up forwards ``W`` than micro-batches, also ``H_p + (1 + B - W)(f_p +
      c_p) + 2 Y_p + D_p`` (the last chain op waits for the last round trip too).  ``H``,
      ``Y`` and ``D`` are at each layer's least forward (and chain) over the configurations,
      each transfer at its least over p and the later stages, ``W`` the family's most at p
      or later.  R1 does not see the later stages at all.  With the tail in ``T2`` (and
      single-stage pairs searched exactly), the phase took the gap of 1 024 equal layers on
      1 024 GPUs from 53.6% to 20.4%; with the drain, the second round trip and the cycle
      below, to 10.0%;
    * with ``phase`` (R3 on: not under ZB-H1), the objective's cycle bound (:mod:`.objective`):
      ``H_p + (q + 1)(f_p + Y_p + c_p) + D_p`` with ``q = (B - 1) // W``: every ``W``
      micro-batches the stage's forward waits for a round trip through the later stages.

    Each part grows when a stage takes more layers (a layer added in front adds at least
    its forward and chain to the stage, and takes its least out of ``FC``, ``H`` or ``D``);
    and every part but memory is never easier at a later stage index.  So the greedy split
    (each stage as long as it can be, leaving a layer to each later stage) ends the model
    whenever some split has every term at most ``tau``: after stage p it has placed at least
    the layers that split has, since what that split's next stage holds contains what is
    left of it to the greedy one's, and what a later stage of the split holds the greedy
    one's next stage could hold too.  Memory is the exception (a later stage keeps fewer
    micro-batches): a stage whose time terms let it take the next layer but whose memory
    does not is left empty, and the split goes on.  Bisection on ``tau`` then finds a bound.
    """
    c = pair.costs
    L, S, B = pair.L, pair.S, pair.B
    if not pair.configs:
        return math.inf
    live = [pair.live_min(p) for p in range(S)]
    rows, phases = [], []
    forwards = []
    for cfg in pair.configs:
        f, a, w = c.layer_times(cfg)
        split_part = w if pair.has_split else np.zeros_like(w)
        chain = f + a + (w - split_part)              # forward and chain of one layer
        work = np.concatenate([[0.0], np.cumsum(f + a + w)])
        late = np.concatenate([[0.0], np.cumsum(B * (f + a + w) - split_part)])
        rows.append((chain, work.tolist(), late.tolist()) + _memory_floor(c, cfg))
        forwards.append(f)
        # the phase term's own parts: forwards, chain ops and split-off weight parts, as
        # prefix sums
        phases.append((np.concatenate([[0.0], np.cumsum(f)]), np.concatenate([[0.0], np.cumsum(chain - f)]),
                       np.concatenate([[0.0], np.cumsum(split_part)])))
    least_chain = np.min([r[0] for r in rows], axis=0)
    FC = np.concatenate([[0.0], np.cumsum(least_chain)])
    # R1's T2 with the gradient tail, which grows with the stage unless tied copies (a tail
    # of more buckets) leave it when it takes the layer they share: then without the tail
    tails = None if c.model.ties() else [pair._config_arrays(j)["T2"] for j in range(len(pair.configs))]
    # the phase term (see the docstring): the fill of forwards before a stage, and the round
    # trip through the layers after it, each layer at its least; the forwards a stage still
    # runs after its first backward, with the family's most warm-up forwards at this stage
    # or any later one (so a later stage's test is never easier)
    FW = np.concatenate([[0.0], np.cumsum(np.min(forwards, axis=0))])
    # and the drain after the stage's last chain op: the last micro-batch's gradient back
    # through the chain ops of every earlier layer, each at its least (the objective's D)
    CL = np.concatenate([[0.0], np.cumsum(np.min([r[0] - f for r, f in zip(rows, forwards)], axis=0))])
    ahead = np.array([max(pair.warmups(p)) for p in range(S)])
    # the most weight parts a member of the family leaves after a stage's last chain op (its
    # own: 1 under weight delaying; ZB-H1 has no phase term); the others run before it
    late_weights = max((max(deferred_weights(s, S, B)) for s in pair.schedules if s.split), default=0)
    ahead = np.minimum(np.maximum.accumulate(ahead[::-1])[::-1], B)
    # the transfers of R1's fill, each at its least over the configurations and the cut's
    # layer: XA[p] = x(0->1) + x(1->0) + ... + x(p-1->p) + x(p->p-1), growing with p
    act = float(np.min(c.model.column("activations"))) if L else 0.0

    def least(src: int, dst: int) -> float:
        out = math.inf
        for cfg in pair.configs:
            a, b = c.transfer(cfg.tensor, src, dst)
            out = min(out, a + b * act * c.samples(cfg.tensor))
        return out

    ahead_x = [least(q, q + 1) for q in range(S - 1)]          # x(q -> q+1)
    back_x = [least(q + 1, q) for q in range(S - 1)]           # x(q+1 -> q)
    steps = [0.0] + [ahead_x[q - 1] + back_x[q - 1] for q in range(1, S)]
    XA = np.cumsum(steps)
    # the phase and cycle terms' transfers: forward before stage p, both ways after it
    before = np.concatenate([[0.0], np.cumsum(ahead_x)])
    after = np.concatenate([np.cumsum((np.asarray(ahead_x) + np.asarray(back_x))[::-1])[::-1], [0.0]])
    back_before = np.concatenate([[0.0], np.cumsum(back_x)])      # the drain's transfers
    # the phase and cycle terms' transfers (forward before p, its drain's back, both ways
    # after it), at their least over p and every later stage: never falling with p
    XPD = np.minimum.accumulate((before + back_before + after)[::-1])[::-1]
    # plain lists: the greedy splits below read these one number at a time, millions of times
    FC, XA, FW, CL, XPD = (np.asarray(x, dtype=float).tolist() for x in (FC, XA, FW, CL, XPD))
    phases = [tuple(x.tolist() for x in ph) for ph in phases]
    mem = c.device_memory
    if pair.deferred is not None:
        # ZB-H1 defers weight parts past the chain by a stage-dependent count: drop the term
        rows = [(ch, work, None, st, ac, tr) for ch, work, _, st, ac, tr in rows]

    # the first stage's drain (R1's u0: its gradient reduction and optimizer step) delays
    # every later stage's fill; it grows with the layers the first stage holds
    drains = [pair._config_arrays(j)["u0"] for j in range(len(pair.configs))]

    def drain(i: int, j: int | None = None) -> float:
        """The first stage's drain when it ends at layer i, under configuration j (or the
        least over them)."""
        if j is not None:
            return float(drains[j][0, i])
        return min(float(t[0, i]) for t in drains)

    def own_drain(p: int, j: int):
        """Stage p's own drain in its phase and cycle terms: the first stage's, under its
        configuration (later stages count it in ``off``)."""
        if p == 0 and drains:
            return lambda i: drain(i, j)
        return lambda i: 0.0

    def tail_end(j: int, k: int, hi: int, tau: float) -> int:
        """The last layer i <= hi with ``T2 = B w + G`` at most tau (G: the gradient tail,
        which B w outgrows when the stage takes a layer more, :mod:`.costs`)."""
        return _last_fitting(functools.partial(tails[j].at, k), k, hi, tau)     # cells k <= i

    def phase_end(p: int, j: int, k: int, hi: int, tau: float, off: float) -> int:
        """The last layer i <= hi with stage p's phase term at most tau (k - 1: none).  The
        objective's phase (:func:`.objective.phase_time`) is at least ``f + B c + (B - k) w +
        R`` (``w`` the weight parts a split schedule runs apart, ``k`` of them after) and,
        with fewer warm-up forwards ``W`` than micro-batches, ``(1 + B - W)(f + c) + 2 R``
        (the first and the last chain op each after a round trip); with ``W`` the family's
        most at p or later, and the transfers at their least at p or later, so that a later
        stage's test is never easier.  It grows with i (a layer taken in adds at least its
        forward and chain twice and takes its least out of each round trip)."""
        F, C, WP = phases[j]
        fill = FW[k] + CL[k] + XPD[p] + off
        own = own_drain(p, j)
        W = int(ahead[p])
        m = 1 + B - W

        def term(i: int) -> float:
            f, cc, R = F[i + 1] - F[k], C[i + 1] - C[k], FC[L] - FC[i + 1]
            # between the first chain op and the end of the last one the stage also runs every
            # weight part it splits off but the ``late`` ones it leaves after the last
            one = f + B * cc + R + (B - late_weights) * (WP[i + 1] - WP[k])
            return fill + (max(one, m * (f + cc) + 2 * R) if W < B else one) + own(i)

        return _last_fitting(term, k, hi, tau)

    def cycle_end(p: int, j: int, k: int, hi: int, tau: float, off: float) -> int:
        """The last layer i <= hi with stage p's cycle term at most tau (k - 1: none).  The
        objective's cycle bound is at least ``H + (q + 1)(f + R + c) + D`` with ``q = (B - 1)
        // W`` (every W micro-batches a forward waits for a round trip through the later
        stages), each part at its least over every cut, W the family's most at p or later
        (fewest cycles) and the transfers at their least at p or later.  It grows with i (a
        layer taken in adds its own forward and chain q + 1 times and takes its least out of
        each round trip)."""
        F, C, _ = phases[j]
        fill = FW[k] + CL[k] + XPD[p] + off
        own = own_drain(p, j)
        q = (B - 1) // int(ahead[p])

        def term(i: int) -> float:
            return fill + (q + 1) * (F[i + 1] - F[k] + C[i + 1] - C[k] + FC[L] - FC[i + 1]) + own(i)

        return _last_fitting(term, k, hi, tau)

    def end(p: int, k: int, tau: float, off: float) -> tuple[int, bool]:
        """The last layer stage p starting at k can hold with its terms at most tau, leaving
        a layer to each later stage (a plan has S stages, so its stage p ends there too); and
        whether its time terms alone let it hold layer k (if not, no later stage can either:
        each of them is never easier at a later stage)."""
        best, timely = k - 1, False
        for j, (chain, work, late, static, act, trans) in enumerate(rows):
            # the last layer i with B (work[i+1] - work[k]) <= tau, and the fill term (bisect
            # on lists: numpy's searchsorted costs ten times as much for one value)
            hi = bisect.bisect_right(work, work[k] + tau / B) - 2
            if p > 0 and late is not None:
                hi = min(hi, bisect.bisect_right(late, late[k] + tau - FC[k] - XA[p] - off) - 2)
            hi = min(hi, L - 1 - (S - 1 - p))
            if tails is not None and hi >= k and hi > best:
                hi = tail_end(j, k, hi, tau)
            # the phase and cycle terms are R3's, which ZB-H1 pairs leave out (pair.r3): there
            # the round trip bounds the objective but not R, so no plan's R need reach them
            if phase and pair.r3 and hi >= k and hi > best:
                hi = phase_end(p, j, k, hi, tau, off)
            if phase and pair.r3 and hi >= k and hi > best:
                hi = cycle_end(p, j, k, hi, tau, off)
            if hi < k or hi <= best:
                continue
            timely = True
            # memory grows with the stage too
            best = max(best, _last_fitting(
                lambda i: static[i + 1] - static[k] + live[p] * (act[i + 1] - act[k]) + trans(k, i), k, hi, mem))
        return best, timely

    def rest(k: int, tau: float, off: float) -> bool:
        """Do stages 1.. reach the end from layer k (a later k only helps)?"""
        for p in range(1, S):
            if k >= L:
                return True
            i, timely = end(p, k, tau, off)
            if i < k:
                if not timely:
                    return False
                # only memory keeps layer k off stage p: a later stage, keeping fewer
                # micro-batches, may hold it, so this one stays empty
                continue
            k = i + 1
        return k >= L

    def reach(tau: float) -> bool:
        last, _ = end(0, 0, tau, 0.0)
        if last < 0:
            return False
        if last >= L - 1:
            return True
        if not drains or S == 1:
            return rest(last + 1, tau, 0.0)
        # the first stage ends in [a, b]: its drain is at least the drain at a and the others
        # start at b + 1 at the latest, so one test per piece covers every end in it
        ends = np.unique(np.linspace(0, last, min(GRID, last + 1) + 1).astype(int))
        pieces = [(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:])] or [(0, last)]
        (a, b), others = pieces[0], pieces[1:]
        if rest(b + 1, tau, drain(a)):
            return True             # most thresholds that pass do on the first piece
        # every piece at once, relaxed: the latest start of any and the least drain (a later
        # start and a smaller drain only help).  A threshold that fails it fails every piece,
        # so it is not tested piece by piece (a failing threshold tested all of them; on
        # 3 000 layers at --budget 100 this took the stage search from 109 s to 83 s, on
        # 10 000 at the default budget from 124 s to 119 s, the same output)
        if not others or (RELAXED_PIECES and not rest(last + 1, tau, drain(0))):
            return False
        return any(rest(b + 1, tau, drain(a)) for a, b in others)

    if not math.isfinite(upper):
        # grow a threshold until the greedy split passes: past every term only memory can
        # stop it, and then no plan fits at all
        upper = 2 * (B * max(r[1][-1] for r in rows) + FC[-1]) + 1.0
        while not reach(upper):
            upper *= 4
            if upper > 1e30:
                return math.inf
    lo, hi = 0.0, upper
    if not reach(hi):
        return hi
    from .problem import cheap_bound        # here: problem imports this module

    floor = cheap_bound(c)                  # a bound of every plan too (the search starts there)
    if floor < hi and not reach(floor):
        lo = floor
    return _threshold(reach, lo, hi, tol)


def least_memory_floor(pair, tol: float = 1e-3) -> float:
    """A lower bound of the peak bytes per device of every plan of ``pair`` (any cut): the
    least over splits into S stages of the fullest stage, stage p with the fewest
    micro-batches it keeps under any schedule of the family (``live_min(p)``: in 1F1B the
    first stage keeps S) and without tied copies (:meth:`.StageCosts.memory_floor`).  A
    stage's bytes grow with the layers it holds, so a greedy split (each stage as long as it
    fits, a stage that cannot take the next layer left empty) passes every threshold some
    split meets: after stage p the greedy one has placed at least the layers that split has
    (what that split's stage p + 1 holds contains what is left of it to the greedy one's).
    Empty stages make it a relaxation: a later stage, keeping fewer micro-batches, may hold
    a layer an earlier one cannot."""
    c, L, S = pair.costs, pair.L, pair.S
    live = [pair.live_min(p) for p in range(S)]
    tables = [_memory_floor(c, cfg) for cfg in pair.configs]
    if not tables:
        return math.inf

    def peak(t, n, k, i):
        static, act, trans = t
        return static[i + 1] - static[k] + n * (act[i + 1] - act[k]) + trans(k, i)

    def reach(thr: float) -> bool:
        k = 0
        for p in range(S):
            best = k - 1
            cap = L - 1 - (S - 1 - p)         # a layer left to each later stage
            for t in tables:
                best = max(best, min(_last_fitting(lambda i: peak(t, live[p], k, i), k, L - 1, thr), cap))
            if best < k:
                # no room for layer k at this stage's count: a later stage (keeping fewer
                # micro-batches) may hold it, so leave this one empty (a relaxation)
                continue
            k = best + 1
            if k >= L:
                return True
        return False

    whole = float(max(peak(t, max(live), 0, L - 1) for t in tables))
    if not reach(whole):
        return math.inf
    return _threshold(reach, 0.0, whole, tol)


def _threshold(reach, lo: float, hi: float, tol: float) -> float:
    """Bisection between a threshold ``reach`` refuses (``lo``) and one it passes (``hi``):
    the last refused one, a lower bound of the least that passes, within ``tol`` of it."""
    for _ in range(60):
        if hi - lo <= tol * hi:
            break
        mid = (lo + hi) / 2
        if reach(mid):
            hi = mid
        else:
            lo = mid
    return lo
