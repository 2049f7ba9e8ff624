"""The stage search over unequal sub-meshes (Alpa's space, Alpa §5.2): each stage takes its own
shape from Alpa's set -- ``(1, 2^k)`` inside a host or ``(n, M)`` for ``n = 1..hosts`` -- with the
sizes summing to at most the cluster (:mod:`.meshes` places and prices such plans).

A lower bound valid for every plan of the space, equal meshes included.  It is the
relaxation R1 of :mod:`.problem` without its transfer and tie terms, which depend on where
neighbouring meshes sit (both are >= 0, so dropping them keeps a lower bound).  Every stage
``p`` of a plan has

    A_p = B w_p + g_p                    (its own ops, then its gradient tail)
    a_p + sum_{q < p} s_q                (the fill through earlier stages, its ops, and the
                                          last micro-batch's chain back through them)

with ``w = f + b``, ``s = f + c`` (``c`` the chain op: ``BA`` when the schedule splits the
backward, else ``B``), ``a = B w - (b - c)`` and ``g`` the least gradient tail of the
family's schedules.  The simulated time is at least the largest of them (tested against the
simulator on random plans).  Two dynamic programs over (first layer of the rest, devices
left, stages in the rest ``s``) give the least largest ``A`` and the least largest second
term over every plan:

    X(k, n, s) = min over stages k..i on shape m:  max(A, X(i + 1, n - |m|, s - 1))
    Y(k, n, s) = min over stages k..i on shape m:  max(a, s + Y(i + 1, n - |m|, s - 1))

(``X(L, n, 0) = Y(L, n, 0) = -inf``; max-plus recurrences are monotone in the rest, so its
least value is the one to extend).  A stage heading ``s`` stages keeps the activations of
the fewest micro-batches any schedule of the family keeps there (1F1B: ``min(s, B)``,
Alpa's ``max_n_succ_stages`` rule), and only configurations that fit with them count.  In
``Y`` the least ``a`` and the least ``s`` over those configurations are used apart (a
relaxation).  The bound is ``max(min_s X(0, N, s), min_s Y(0, N, s))``.

The equal-mesh search runs first, and its (much stronger) bound holds over its pairs: every
stage on one shape, as many stages as tile its devices.  So the programs carry a flag --
every stage of the rest on one tracked shape, or anything else -- and the bound over the
unequal space leaves those pairs' cells out; the bound reported is the least of the two.

Candidates: the plans both programs pick for every stage count, and the few plans with
the least Alpa objective (``sum t + (B - 1) max t``, :meth:`UnequalSpace.alpa_plans`), each
placed by :func:`.meshes.pack` and simulated with the family's schedules that fit.  Neither
program aims at Alpa's trade of a stage's latency against the bubble: without its plans,
GPT-3 15B on two p2 A100 hosts at 128 micro-batches stopped at 16.62 s against Alpa's
16.33 s.
"""

from __future__ import annotations

from dataclasses import dataclass

import math

import numpy as np

from ..errors import RefusedError
from .costs import MeshShape, StageCosts, host_parts
from .meshes import MeshCosts, pack
from .objective import family_split
from .partition import Partition, StagePlan
from .schedule import Schedule, family, live_count

__all__ = ["alpa_shapes", "UnequalSpace", "MAX_CELLS", "check_size", "search_unequal"]

MAX_CELLS = 400_000_000   # layers^2 x devices x stages x shapes one dynamic program may touch
CAP_STEP = 0.005          # Alpa's caps on the stage latency closer than this (relative) are merged
ALPA_PROGRAMS = 12        # programs of Alpa's objective from the least cap with a plan on
ALPA_KEEP = 4             # plans of Alpa's objective kept as candidates, least objective first


def alpa_shapes(hosts: int, devices_per_host: int) -> list[MeshShape]:
    """Alpa's shapes (``get_submesh_choices``, space "all"): ``(1, 2^k)`` dividing a host, then
    ``(n, M)`` for every ``n`` up to the hosts."""
    return host_parts(devices_per_host) + [MeshShape(n, devices_per_host) for n in range(1, hosts + 1)]


def cells_of(layers: int, devices: int, shapes: int) -> int:
    """Cells one dynamic program touches: (first, last layer) pairs x devices left x stages x shapes."""
    return layers * layers * (devices + 1) * (min(layers, devices) + 1) * shapes // 2


def check_size(layers: int, topology, shapes=None, devices: int | None = None) -> list[MeshShape]:
    """The shapes searched (on at most ``devices`` devices), or a refusal when the dynamic
    programs would touch more than :data:`MAX_CELLS` cells (made before any table is built:
    their memory grows with the shapes)."""
    N = topology.num_devices if devices is None else min(devices, topology.num_devices)
    candidates = [x for x in shapes or alpa_shapes(topology.num_hosts, topology.devices_per_host) if x.size <= N]
    cells = cells_of(layers, N, len(candidates))
    if cells > MAX_CELLS:
        raise RefusedError(f"unequal meshes: the dynamic program over {layers} layers, {N} devices, up to"
                           f" {min(layers, N)} stages and {len(candidates)} mesh shapes would touch {cells:,} cells"
                           f" (limit {MAX_CELLS:,}); search equal meshes instead")
    return candidates


@dataclass
class _Shape:
    """One shape's tables: configurations stacked on axis 0 (``[c, k, i]``), and per stage
    count ``s`` heading the rest (``[k, i, s]``) the least ``A``, ``a`` and ``s`` over the
    configurations that fit with the micro-batches such a stage keeps."""

    shape: MeshShape
    costs: StageCosts
    configs: list
    A: np.ndarray
    a: np.ndarray
    s: np.ndarray
    fit: np.ndarray           # [c, k, i, s]
    A_min: np.ndarray
    a_min: np.ndarray
    s_min: np.ndarray
    w: np.ndarray             # [c, k, i]: a micro-batch's forward and backward (Alpa's stage latency)
    w_min: np.ndarray         # [k, i, s]: the least over the configurations that fit


class UnequalSpace:
    """Plans on unequal meshes for one micro-batch count and schedule family (module docstring)."""

    def __init__(self, model, topology, B: int, kind: str, tables, comm: bool = True, shapes=None,
                 devices: int | None = None, stages: int | None = None):
        """``devices``: at most this many of the cluster's devices (its first ones); ``stages``:
        only plans with this many stages."""
        if kind not in ("1f1b", "gpipe", "eager-1f1b"):
            raise ValueError(f"unequal meshes are searched under 1f1b, eager-1f1b and gpipe, not {kind}")
        self.model, self.topology, self.B, self.kind = model, topology, B, kind
        self.L = model.num_layers
        self.N = topology.num_devices if devices is None else min(devices, topology.num_devices)
        self.S = min(self.L, self.N)
        self.stages = stages
        candidates = check_size(self.L, topology, shapes, self.N)
        # whether some member splits the backward does not depend on the stage count
        has_split, has_whole = family_split(family(kind, 2))
        # the fewest micro-batches any member keeps on a stage heading s stages
        live = np.array([0] + [min(live_count(sch, s, 0, B) for sch in family(kind, s)) for s in range(1, self.S + 1)])
        self.shapes: list[_Shape] = []
        upper = np.triu(np.ones((self.L, self.L), dtype=bool))
        for shape in candidates:
            costs = StageCosts(model, topology, shape, B, tables(shape), comm)
            cfgs, As, as_, ss, fits, ws = [], [], [], [], [], []
            for cfg in costs.configs:
                cc = costs[cfg]
                f, b, ba = cc.forward, cc.backward_act + cc.backward_weight, cc.backward_act
                ch = ba if has_split else b
                g = np.minimum(cc.tail_full if has_whole else np.inf, cc.tail_weight if has_split else np.inf)
                static, act, transient = costs.memory_parts(cfg)
                fit = (static + transient)[:, :, None] + act[:, :, None] * live[None, None, :] <= costs.device_memory
                fit &= upper[:, :, None]
                fit[:, :, 0] = False
                w = f + b
                As.append(B * w + g)
                as_.append(B * w - (b - ch))
                ss.append(f + ch)
                ws.append(w)
                fits.append(fit)
                cfgs.append(cfg)
            if not cfgs:
                continue
            A, a, sv, fit, w = np.array(As), np.array(as_), np.array(ss), np.array(fits), np.array(ws)

            def least(x):
                # the least over the configurations that fit, one configuration at a time (a
                # [c, k, i, s] array of candidates cost as much again to build as to reduce)
                out = np.full(fit.shape[1:], np.inf)
                for c in range(len(x)):
                    np.minimum(out, x[c][:, :, None], out=out, where=fit[c])
                return out

            self.shapes.append(_Shape(shape, costs, cfgs, A, a, sv, fit, least(A), least(a), least(sv), w, least(w)))

    @property
    def cells(self) -> int:
        return cells_of(self.L, self.N, len(self.shapes))

    def _dp(self, which: str, tracked=()):
        """X (``which="A"``) or Y (``"a"``) of the module docstring, ``[k, n, s, flag]``, and each
        cell's choice (last layer, shape, flag of the rest).  ``flag`` ``t`` (below ``T =
        len(tracked)``): every stage of the rest is on shape ``tracked[t]``; ``T``: any other
        rest (several shapes, or one shape not tracked); ``T + 1``: no stage (only at ``k = L``).
        The bound can then leave out plans of one tracked shape that the equal-mesh search has
        bounded already."""
        L, N, S = self.L, self.N, self.S
        T = len(tracked)
        MIX, EMPTY = T, T + 1
        flag_of = {j: t for t, j in enumerate(tracked)}
        W = np.full((L + 1, N + 1, S + 1, T + 2), np.inf)
        W[L, :, 0, EMPTY] = -1e300      # -inf, without inf - inf where no configuration fits
        pick = np.full((L, N + 1, S + 1, T + 2, 3), -1, dtype=np.int32)
        # the moves from each finished row i of W, made once per row (they were made again for
        # every stage ending before it: 2.2x the time of the whole unequal search of GPT-3 175B
        # on 64 GPUs): (rest, flag of the rest) of an "other" plan after a stage on an
        # untracked shape (any rest, or none), and for each tracked flag t the same shape (or
        # nothing) after it, or any rest of another flag.  m1, a1 (m2, a2): the least (second
        # least) over the row's non-empty flags, and where it is.
        tables = 1 + 2 * T
        rests = np.empty((tables, L + 1, N + 1, S + 1))
        flags = np.empty((tables, L + 1, N + 1, S + 1), dtype=np.int32)

        def moves_from(i: int) -> None:
            row, empty = W[i], W[i][..., EMPTY]
            if T:
                two = np.argsort(row[..., :EMPTY], axis=-1, kind="stable")[..., :2]
                a1, a2 = two[..., 0], two[..., 1]
                m2 = np.take_along_axis(row, a2[..., None], axis=-1)[..., 0]
            else:
                a1 = np.full((N + 1, S + 1), MIX)
            m1 = np.take_along_axis(row, a1[..., None], axis=-1)[..., 0]
            rests[0, i] = np.minimum(m1, empty)
            flags[0, i] = np.where(m1 <= empty, a1, EMPTY)
            for t in range(T):
                rests[1 + 2 * t, i] = np.minimum(row[..., t], empty)
                flags[1 + 2 * t, i] = np.where(row[..., t] <= empty, t, EMPTY)
                rests[2 + 2 * t, i] = np.where(a1 == t, m2, m1)
                flags[2 + 2 * t, i] = np.where(a1 == t, a2, a1)

        moves_from(L)
        for k in range(L - 1, -1, -1):
            best = np.full((N + 1, S + 1, T + 2), np.inf)
            for j, sh in enumerate(self.shapes):
                n0 = sh.shape.size
                t = flag_of.get(j)
                moves = [(MIX, 0)] if t is None else [(t, 1 + 2 * t), (MIX, 2 + 2 * t)]
                for target, m in moves:
                    # the rest after a stage k..i (rows i + 1), for the cells (n, s) with n at
                    # least the shape's size and s >= 1 only (the others have no rest:
                    # infinite): W(i + 1, n - size, s - 1)
                    shifted = rests[m, k + 1:, :N + 1 - n0, :S]
                    if which == "A":
                        cand = np.maximum(sh.A_min[k, k:, None, 1:], shifted)
                    else:
                        cand = np.maximum(sh.a_min[k, k:, None, 1:], sh.s_min[k, k:, None, 1:] + shifted)
                    # the least over the stage's last layer, then where it is only for the cells
                    # it improves (numpy's min along the first axis runs on whole rows; its
                    # argmin there took a quarter of the program)
                    val = cand.min(axis=0)
                    cur = best[n0:, 1:, target]                  # a view: written in place
                    better = val < cur
                    np.copyto(cur, val, where=better)
                    nn, ss = np.nonzero(better)
                    ii = np.argmin(cand[:, nn, ss], axis=0)
                    pick[k, nn + n0, ss + 1, target] = np.stack(
                        [k + ii, np.full_like(ii, j), flags[m, k + 1 + ii, nn, ss]], axis=-1)
            W[k] = best
            moves_from(k)
        return W, pick

    def bound(self, leave_out=()) -> float:
        """A lower bound of the simulated time of every plan with this micro-batch count, on
        unequal or equal meshes, but those of ``leave_out`` ((shape, stage count) pairs: all
        stages on that shape; module docstring)."""
        tracked = self._tracked(leave_out)
        return self._bound(self._dp("A", tracked)[0], self._dp("a", tracked)[0], tracked, leave_out)

    def _tracked(self, leave_out) -> tuple[int, ...]:
        shapes = {shape for shape, stages in leave_out if stages <= self.S}
        return tuple(j for j, sh in enumerate(self.shapes) if sh.shape in shapes)

    def _bound(self, X, Y, tracked, leave_out) -> float:
        keep = self._keep(tracked, leave_out)
        x = float(np.min(np.where(keep, X[0, self.N], np.inf)))
        y = float(np.min(np.where(keep, Y[0, self.N], np.inf)))
        return max(x, y)

    def _keep(self, tracked, leave_out) -> np.ndarray:
        """``[s, flag]``: the cells the bound counts (not left out, of the stage count asked)."""
        keep = np.ones((self.S + 1, len(tracked) + 2), dtype=bool)
        if self.stages is not None:           # only plans of that many stages
            keep[np.arange(self.S + 1) != self.stages] = False
        flag = {self.shapes[j].shape: t for t, j in enumerate(tracked)}
        for shape, stages in leave_out:
            if shape in flag and stages <= self.S:
                keep[stages, flag[shape]] = False
        return keep

    def _walk(self, which: str, W, pick, stages: int, flag: int) -> list[tuple[int, int, int, int]] | None:
        """(first, last, shape index, config index) of each stage of the plan the program picked
        for ``stages`` stages and ``flag``; each stage's configuration: the one fitting that
        minimises its own term given the rest."""
        out, k, n, s, f = [], 0, self.N, stages, flag
        while k < self.L:
            i, j, g = (int(x) for x in pick[k, n, s, f])
            if i < 0:
                return None
            sh = self.shapes[j]
            rest = W[i + 1, n - sh.shape.size, s - 1, g]
            ok = sh.fit[:, k, i, s]
            term = sh.A[:, k, i] if which == "A" else np.maximum(sh.a[:, k, i], sh.s[:, k, i] + rest)
            # ties: the cheaper stage (A) first, then the configuration order
            c = int(np.lexsort((np.arange(len(ok)), sh.A[:, k, i], np.where(ok, term, np.inf)))[0])
            if not ok[c]:
                return None
            out.append((k, i, j, c))
            k, n, s, f = i + 1, n - sh.shape.size, s - 1, g
        return out

    def plans(self, leave_out=()) -> tuple[float, list[Partition]]:
        """The bound (see :meth:`bound`) and the plans both programs pick for every stage count,
        placed and priced."""
        out, seen, tables = [], set(), {}
        tracked = self._tracked(leave_out)
        keep = self._keep(tracked, leave_out)
        for which in ("A", "a"):
            W, pick = tables[which] = self._dp(which, tracked)
            for stages in range(1, self.S + 1):
                if self.stages is not None and stages != self.stages:
                    continue
                row = W[0, self.N, stages]
                # a plan the equal search has not covered first (it has simulated those)
                kept = np.where(keep[stages], row, np.inf)
                flag = int(np.argmin(kept if np.isfinite(kept).any() else row))
                if not np.isfinite(row[flag]):
                    continue
                plan = self._walk(which, W, pick, stages, flag)
                if plan is None or tuple(plan) in seen:
                    continue
                seen.add(tuple(plan))
                shapes = [self.shapes[j] for _, _, j, _ in plan]
                layout = pack([sh.shape for sh in shapes], self.topology)
                costs = MeshCosts([sh.costs for sh in shapes], layout)
                out.append(Partition(costs, [StagePlan(k, i, sh.configs[c])
                                             for (k, i, _, c), sh in zip(plan, shapes)]))
        return self._bound(tables["A"][0], tables["a"][0], tracked, leave_out), out

    def alpa_plans(self, most: int = ALPA_PROGRAMS, keep: int = ALPA_KEEP) -> list[Partition]:
        """Candidates by Alpa's own objective (Alpa §5.2, eq. 2): a stage's latency ``t`` is a
        micro-batch's forward and backward, and a plan costs ``sum t + (B - 1) max t``.  For
        each cap ``t_max`` on the latencies, ascending, a program gives the least sum
        ``Z(k, n, s)`` (first layer ``k`` of the rest, devices left ``n``, ``s`` stages):
        Alpa's loop over ``t_max``, stopped once ``B`` times the cap below reaches the best
        objective found (a plan of a larger cap costs more).  The caps are the cells' own
        latencies, those within ``CAP_STEP`` (relative) of each other merged, the first one
        with a plan found by bisection, then at most ``most`` programs from it.  These plans are
        candidates, priced and simulated like the others, never a bound: the placement and
        the transfers Alpa's objective leaves out are the simulator's to judge."""
        if not self.shapes:
            return []
        values = np.unique(np.concatenate([sh.w_min[np.isfinite(sh.w_min)] for sh in self.shapes]))
        values = values[values > 0]
        if not len(values):
            return []
        group = np.floor(np.log(values / values[0]) / math.log1p(CAP_STEP)).astype(np.int64)
        caps = values[np.r_[np.flatnonzero(group[1:] != group[:-1]), len(values) - 1]]   # each group's largest
        if not self._sums(caps[-1])[1]:
            return []
        lo, hi = 0, len(caps) - 1
        while lo < hi:                      # the least cap with a plan (a lower cap has fewer cells)
            mid = (lo + hi) // 2
            if self._sums(caps[mid])[1]:
                hi = mid
            else:
                lo = mid + 1
        found: dict[tuple, float] = {}
        best, below = math.inf, 0.0
        for cap in caps[lo:lo + most]:
            if self.B * below >= best:
                break
            (Z, pick), counts = self._sums(cap)
            for s in counts:
                plan = self._walk_sums(Z, pick, s, cap)
                if plan is None:
                    continue
                t = [float(self.shapes[j].w[c, k, i]) for k, i, j, c in plan]
                cost = sum(t) + (self.B - 1) * max(t)
                found[tuple(plan)] = cost
                best = min(best, cost)
            below = cap
        out = []
        for plan, _ in sorted(found.items(), key=lambda x: (x[1], x[0]))[:keep]:
            shapes = [self.shapes[j] for _, _, j, _ in plan]
            costs = MeshCosts([sh.costs for sh in shapes], pack([sh.shape for sh in shapes], self.topology))
            out.append(Partition(costs, [StagePlan(k, i, sh.configs[c]) for (k, i, _, c), sh in zip(plan, shapes)]))
        return out

    def _sums(self, cap: float):
        """Alpa's program at one cap: ``(Z, pick)`` and the stage counts with a plan on all
        ``N`` devices or fewer (the allowed count only, under ``stages``)."""
        L, N, S = self.L, self.N, self.S
        Z = np.full((L + 1, N + 1, S + 1), np.inf)
        Z[L, :, 0] = 0.0                    # devices may stay idle
        pick = np.full((L, N + 1, S + 1, 2), -1, dtype=np.int32)
        for k in range(L - 1, -1, -1):
            best = np.full((N + 1, S + 1), np.inf)
            rest = Z[k + 1:]                # rows i: the rest after a stage k..i
            for j, sh in enumerate(self.shapes):
                n0 = sh.shape.size
                t = sh.w_min[k, k:, 1:]
                t = np.where(t <= cap, t, np.inf)
                # Z(i + 1, n - size, s - 1), for the cells with n >= size and s >= 1 only (the
                # others have no rest: infinite)
                cand = t[:, None, :] + rest[:, :N + 1 - n0, :S]
                arg = np.argmin(cand, axis=0)
                val = np.take_along_axis(cand, arg[None], axis=0)[0]
                cur = best[n0:, 1:]                             # a view: written in place
                better = val < cur
                np.copyto(cur, val, where=better)
                pick[k, n0:, 1:][better] = np.stack([k + arg, np.full_like(arg, j)], axis=-1)[better]
            Z[k] = best
        counts = [s for s in range(1, S + 1) if np.isfinite(Z[0, N, s]) and self.stages in (None, s)]
        return (Z, pick), counts

    def _walk_sums(self, Z, pick, stages: int, cap: float) -> list[tuple[int, int, int, int]] | None:
        """(first, last, shape index, config index) of each stage of the plan :meth:`_sums`
        picked for ``stages`` stages; each stage's configuration: the quickest that fits
        under the cap (then the configuration order)."""
        out, k, n, s = [], 0, self.N, stages
        while k < self.L:
            i, j = (int(x) for x in pick[k, n, s])
            if i < 0:
                return None
            sh = self.shapes[j]
            ok = sh.fit[:, k, i, s] & (sh.w[:, k, i] <= cap)
            if not ok.any():
                return None
            c = int(np.argmin(np.where(ok, sh.w[:, k, i], np.inf)))
            out.append((k, i, j, c))
            k, n, s = i + 1, n - sh.shape.size, s - 1
        return out

    def schedules(self, plan: Partition) -> list[Schedule]:
        return family(self.kind, plan.costs.stages)


def search_unequal(search, equal=None, progress=None, covered=(), covered_bound: float = math.inf,
                   devices: int | None = None):
    """The fastest simulated plan over unequal and equal meshes, with a bound over both.

    ``equal``: the equal-mesh search's result (its plans are incumbents: this search returns
    nothing slower).  ``covered``: the (shape, micro-batch count, stage count) of the plans
    that search bounded by ``covered_bound`` (its pairs: every stage on that shape).  For each
    micro-batch count, by increasing bound, the dynamic programs' plans are priced (the
    objective of :mod:`.objective`) and simulated while they can beat the best; a micro-batch
    count whose bound cannot is skipped.  The bound returned is the least of
    ``covered_bound`` and each micro-batch count's bound over the plans not covered, so
    OPTIMAL here is over the whole space.  ``devices``: at most this many devices;
    ``search.stages``: only plans of that many stages."""
    from ..solve import SolveResult, Status, Stopwatch
    from .search import TOLERANCE, _price, evaluate

    with Stopwatch() as sw:
        best = equal.solution if equal is not None else None
        spaces = []
        for B in search.microbatch_options():
            if search.model.global_batch % B:
                continue
            space = UnequalSpace(search.model, search.topology, B, search.schedule, search.tables, search.comm,
                                 devices=devices, stages=search.stages)
            if progress is not None:
                progress(f"unequal meshes: {B} micro-batches")
            if best is not None:
                # the programs without flags first (half the work): a micro-batch count whose
                # plans cannot beat the incumbent needs nothing more
                cheap = space.bound()
                if cheap >= best.time * (1 - TOLERANCE):
                    spaces.append((cheap, B, space, []))
                    continue
            bound, plans = space.plans([(shape, S) for shape, b, S in covered if b == B])
            seen = {tuple(p.stages) + (p.meshes,) for p in plans}
            # and the plans of Alpa's own objective: its trade of a stage's latency against
            # the bubble finds plans neither program above aims at
            plans += [p for p in space.alpa_plans() if tuple(p.stages) + (p.meshes,) not in seen]
            spaces.append((bound, B, space, plans))
        simulated = 0
        for bound, B, space, plans in sorted(spaces, key=lambda x: (x[0], x[1])):
            if best is not None and bound >= best.time * (1 - TOLERANCE):
                continue
            priced = sorted(((_price(p, space.schedules(p)), p) for p in plans), key=lambda x: (
                x[0][0][0].value if x[0] else math.inf, x[1].stages))
            for members, plan in priced:
                if not members or (best is not None and members[0][0].value >= best.time * (1 - TOLERANCE)):
                    continue
                cand = evaluate(plan, members, bound, best.time if best is not None else math.inf)
                simulated += 1
                if cand is not None and (best is None or cand.time < best.time):
                    best = cand
        if best is None:
            return None
        bound = min([b for b, *_ in spaces] + [best.time, covered_bound])
        # the equal search's account, or (no equal pair) what there was to search
        info = dict(equal.info) if equal is not None else {"pairs": 0, "solver": "dp", "simulations": 0}
        for key in ("unlisted_bound", "listed_gap", "top_proven"):    # the equal search's list: not this one's
            info.pop(key, None)
        info.update(meshes="unequal", unequal_simulated=simulated,
                    unequal_bounds={B: b for b, B, *_ in sorted(spaces, key=lambda x: x[1])})
    status = Status.OPTIMAL if bound >= best.time * (1 - TOLERANCE) else Status.FEASIBLE
    seconds = sw.seconds + (equal.wall_time if equal is not None else 0.0)
    return SolveResult(status, "dp", best, best.time, bound, seconds, solutions=[best], info=info)
