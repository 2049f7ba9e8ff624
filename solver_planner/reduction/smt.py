"""The z3 model of the collectives' pre- and post-conditions (seed 000 §3.2, Fig. 8).

An independent implementation of the semantics in :mod:`.semantics`: chunk ``r`` of device
``d`` at step ``t`` is a bit-vector ``S[t][d][r]`` over the contributing devices, and each
rule is a formula.  Two uses:

* :func:`verify_z3` proves a program valid (every pre-condition holds and the final state
  is the requested reduction) by showing the negation unsatisfiable, or returns the
  counterexample: the first pre-condition the (unique) execution breaks.  A time-out is
  reported as ``unknown``, never as invalid.  Devices that never exchange data are
  independent, so the system is cut into communication components and each distinct one
  (up to renaming devices) is proved once: a 1024-device program of 8-device reduction
  groups is one small proof.
* :func:`synthesize_z3` finds every valid program of at most ``k`` steps on a synthesis
  hierarchy (optionally under a cost bound), choosing each step among the same candidate
  instructions as enumeration and blocking each program found.
"""

from __future__ import annotations

from fractions import Fraction

from ..cost import Collective, CostModel
from ..solve import Stopwatch
from .dsl import Program
from .hierarchy import Lowering, SynthesisHierarchy
from .semantics import RULES, Violation
from .synthesis import candidates
from .verify import Steps, Verdict

__all__ = ["verify_z3", "synthesize_z3", "components"]


def _z3():
    import z3

    return z3


class _Check:
    """A pre-condition atom with where it applies, to name the counterexample."""

    __slots__ = ("formula", "step", "rule", "group", "device", "chunk", "message", "other")

    def __init__(self, formula, step, rule, group, device, chunk, message, other=None):
        self.formula, self.step, self.rule, self.group = formula, step, rule, tuple(group)
        self.device, self.chunk, self.message, self.other = device, chunk, message, other

    def violation(self) -> Violation:
        return Violation(self.step, self.rule, self.group, self.device, self.chunk, self.message, self.other)


def _step(z3, S, kind: Collective, groups, k: int, width: int, step, label=lambda d: d):
    """Pre-condition atoms and the next state (expressions) of one step."""
    checks: list[_Check] = []
    nxt = [list(row) for row in S]
    zero = z3.BitVecVal(0, width)
    rule = RULES[kind]
    for g in groups:
        lg = [label(d) for d in g]
        if len(g) < 2:
            if kind is Collective.BROADCAST and len(g) == 1:
                checks.append(_Check(z3.BoolVal(False), step, rule, lg, lg[0], None,
                                     "a broadcast to nobody adds no information"))
            continue
        ne = {d: [S[d][r] != zero for r in range(k)] for d in g}
        if kind in (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.REDUCE):
            first = g[0]
            acc = list(S[first])
            for d in g[1:]:
                for r in range(k):
                    checks.append(_Check(ne[d][r] == ne[first][r], step, rule, lg, label(d), r,
                                         f"holds chunk {r} differently from device {label(first)}: the members hold"
                                         " different chunks, so data that should not be reduced together would be",
                                         label(first)))
                for r in range(k):
                    checks.append(_Check(acc[r] & S[d][r] == zero, step, rule, lg, label(d), r,
                                         "holds a contribution another member also holds: that data would be"
                                         " reduced twice"))
                    acc[r] = acc[r] | S[d][r]
            if kind is Collective.ALLREDUCE:
                for d in g:
                    nxt[d] = list(acc)
            elif kind is Collective.REDUCE:
                nxt[first] = list(acc)
                for d in g[1:]:
                    nxt[d] = [zero] * k
            else:
                n = len(g)
                counts = [z3.IntVal(0)]
                for r in range(k):
                    counts.append(counts[-1] + z3.If(ne[first][r], 1, 0))
                total = counts[-1]
                checks.append(_Check(total % n == 0, step, rule, lg, label(first), None,
                                     f"the chunks held cannot be scattered evenly over {n} devices"))
                for i, d in enumerate(g):
                    nxt[d] = [z3.If(z3.And(ne[first][r], i * total <= n * counts[r], n * counts[r] < (i + 1) * total),
                                    acc[r], zero) for r in range(k)]
        elif kind is Collective.ALLGATHER:
            first = g[0]
            size0 = z3.Sum([z3.If(x, 1, 0) for x in ne[first]])
            held = list(ne[first])
            acc = list(S[first])
            for d in g[1:]:
                size = z3.Sum([z3.If(x, 1, 0) for x in ne[d]])
                checks.append(_Check(size == size0, step, rule, lg, label(d), None,
                                     f"holds a different number of chunks from device {label(first)}: all-gather needs"
                                     " equal shares", label(first)))
                for r in range(k):
                    checks.append(_Check(z3.Not(z3.And(held[r], ne[d][r])), step, rule, lg, label(d), r,
                                         f"holds chunk {r} that another member also holds: all-gather needs disjoint"
                                         " chunks"))
                    held[r] = z3.Or(held[r], ne[d][r])
                    acc[r] = acc[r] | S[d][r]
            for d in g:
                nxt[d] = list(acc)
        else:
            root = g[0]
            for d in g[1:]:
                for r in range(k):
                    checks.append(_Check(S[d][r] & ~S[root][r] == zero, step, rule, lg, label(d), r,
                                         f"holds a contribution the root {label(root)} lacks: it would be lost",
                                         label(root)))
            grows = z3.Or([S[d][r] != S[root][r] for d in g[1:] for r in range(k)])
            checks.append(_Check(grows, step, rule, lg, label(root), None,
                                 "every member already holds what the root holds: the broadcast adds no information"))
            for d in g[1:]:
                nxt[d] = list(S[root])
    return checks, nxt


def components(num_devices: int, steps: Steps) -> list[list[int]]:
    """Devices that exchange data directly or indirectly, by union-find over all groups."""
    parent = list(range(num_devices))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for _, groups in steps:
        for g in groups:
            for d in g[1:]:
                a, b = find(g[0]), find(d)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    comps: dict[int, list[int]] = {}
    for d in range(num_devices):
        comps.setdefault(find(d), []).append(d)
    return list(comps.values())


def _verify_component(z3, devices: list[int], steps: Steps, k: int, goal_of: dict[int, tuple[int, ...]],
                      timeout_ms: int) -> tuple[str, Violation | None]:
    local = {d: i for i, d in enumerate(devices)}
    width = len(devices)
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    S = [[z3.BitVecVal(1 << i, width) for _ in range(k)] for i in range(width)]
    all_checks: list[_Check] = []
    for t, (kind, groups) in enumerate(steps):
        mine = [[local[d] for d in g] for g in groups if g and g[0] in local]
        checks, nxt = _step(z3, S, kind, mine, k, width, t, label=lambda i: devices[i])
        all_checks += checks
        fresh = [[z3.BitVec(f"s{t + 1}_{i}_{r}", width) for r in range(k)] for i in range(width)]
        for i in range(width):
            for r in range(k):
                solver.add(fresh[i][r] == nxt[i][r])
        S = fresh
    final_ok = []
    for i, d in enumerate(devices):
        outside = [c for c in goal_of[d] if c not in local]
        if outside:  # its group's data can never reach it: a final-state failure, after the steps
            final_ok.append((z3.BoolVal(False), d, 0, f"never exchanges data with device {outside[0]} of its"
                                                      " reduction group, so it cannot end with that contribution"))
            continue
        want = 0
        for c in goal_of[d]:
            want |= 1 << local[c]
        final_ok += [(S[i][r] == z3.BitVecVal(want, width), d, r, None) for r in range(k)]
    solver.add(z3.Not(z3.And([c.formula for c in all_checks] + [f for f, _, _, _ in final_ok])))
    answer = solver.check()
    if answer == z3.unsat:
        return "valid", None
    if answer == z3.unknown:
        return "unknown", None
    model = solver.model()
    for c in all_checks:
        if not z3.is_true(model.eval(c.formula, model_completion=True)):
            return "invalid", c.violation()
    for formula, d, r, why in final_ok:
        if why is not None:
            return "invalid", Violation(None, "post-condition", (d,), d, r, why)
        if not z3.is_true(model.eval(formula, model_completion=True)):
            got = model.eval(S[local[d]][r], model_completion=True).as_long()
            have = [devices[i] for i in range(width) if got >> i & 1]
            return "invalid", Violation(None, "post-condition", (d,), d, r,
                                        f"holds contributions {have} instead of the reduction group's"
                                        f" {sorted(goal_of[d])}")
    return "unknown", None  # the model satisfies everything: should not happen


def verify_z3(lowering: Lowering, steps: Steps, timeout: float = 30.0) -> Verdict:
    """Prove ``steps`` valid on the placement of ``lowering``, or give the counterexample."""
    z3 = _z3()
    with Stopwatch() as sw:
        k = lowering.hierarchy.size
        goal_of = lowering.group_of()
        comps = components(lowering.num_devices, steps)
        seen: dict[tuple, tuple[str, Violation | None, list[int]]] = {}
        status, violation, proved = "valid", None, 0
        first_failure = None
        for comp in comps:
            local = {d: i for i, d in enumerate(comp)}
            comp_steps = [(kind, [g for g in groups if g and g[0] in local]) for kind, groups in steps]
            signature = (tuple((kind, tuple(tuple(local[d] for d in g) for g in groups)) for kind, groups in comp_steps),
                         tuple((tuple(sorted(local[c] for c in goal_of[d] if c in local)),
                                sum(c not in local for c in goal_of[d])) for d in comp))
            if signature not in seen:
                proved += 1
                result, vio = _verify_component(z3, comp, comp_steps, k, goal_of, max(1, int(timeout * 1000)))
                seen[signature] = (result, vio, comp)
            result, vio, proto = seen[signature]
            if result == "invalid":
                if vio is not None and proto is not comp:
                    vio = _rename(vio, proto, comp)
                key = (vio.step if vio and vio.step is not None else 1 << 30)
                if first_failure is None or key < first_failure[0]:
                    first_failure = (key, vio)
            elif result == "unknown" and status == "valid":
                status = "unknown"
        if first_failure is not None:
            status, violation = "invalid", first_failure[1]
    return Verdict(status, "z3", violation, sw.seconds,
                   f"{len(comps)} communication component(s), {proved} distinct one(s) proved")


def _rename(v: Violation, proto: list[int], comp: list[int]) -> Violation:
    m = dict(zip(proto, comp))
    return Violation(v.step, v.rule, tuple(m.get(d, d) for d in v.group), m.get(v.device, v.device), v.chunk,
                     v.message, m.get(v.other, v.other) if v.other is not None else None)


def synthesize_z3(hierarchy: SynthesisHierarchy, max_size: int = 5, bound: float | None = None,
                  cost: CostModel | None = None, lowering: Lowering | None = None, nbytes: float | None = None,
                  timeout: float = 60.0, limit: int | None = None) -> tuple[list[Program], str]:
    """Every valid program of at most ``max_size`` steps (or, with ``bound``, every one whose
    cost under ``cost``/``lowering``/``nbytes`` is at most ``bound``), and 'complete' or
    'unknown' (a time-out or ``limit`` stopped the enumeration)."""
    z3 = _z3()
    cands = candidates(hierarchy)
    n = hierarchy.size
    stop = len(cands)
    solver = z3.Solver()
    solver.set("timeout", max(1, int(timeout * 1000)))
    S = [[z3.BitVecVal(1 << d, n) for _ in range(n)] for d in range(n)]
    goal = z3.BitVecVal((1 << n) - 1, n)
    sel = [z3.Int(f"sel{t}") for t in range(max_size)]
    taus = []
    tables = _cost_tables(cands, cost, lowering, nbytes, n) if bound is not None else None
    for t in range(max_size):
        solver.add(sel[t] >= 0, sel[t] <= stop)
        if t + 1 < max_size:
            solver.add(z3.Implies(sel[t] == stop, sel[t + 1] == stop))
        nxt = [[z3.BitVec(f"s{t + 1}_{d}_{r}", n) for r in range(n)] for d in range(n)]
        same = z3.And([nxt[d][r] == S[d][r] for d in range(n) for r in range(n)])
        solver.add(z3.Implies(sel[t] == stop, same))
        tau = z3.Real(f"tau{t}")
        taus.append(tau)
        if tables is not None:
            solver.add(tau >= 0)
        for c, cand in enumerate(cands):
            checks, post = _step(z3, S, cand.instruction.collective, cand.groups, n, n, t)
            effect = z3.And([nxt[d][r] == post[d][r] for d in range(n) for r in range(n)])
            solver.add(z3.Implies(sel[t] == c, z3.And([ch.formula for ch in checks] + [effect, z3.Not(same)])))
            if tables is not None:
                for first, table in tables[c]:
                    held = z3.Sum([z3.If(S[first][r] != 0, 1, 0) for r in range(n)])
                    for h, value in enumerate(table):
                        solver.add(z3.Implies(z3.And(sel[t] == c, held == h), tau >= z3.RealVal(Fraction(value))))
        S = nxt
    solver.add(sel[0] != stop)
    solver.add(z3.And([S[d][r] == goal for d in range(n) for r in range(n)]))
    if tables is not None:
        solver.add(z3.Sum(taus) <= z3.RealVal(Fraction(bound)) * (1 + Fraction(1, 10**9)))
    found: list[tuple[int, ...]] = []
    status = "complete"
    while limit is None or len(found) < limit:
        answer = solver.check()
        if answer == z3.unsat:
            break
        if answer == z3.unknown:
            status = "unknown"
            break
        model = solver.model()
        values = [model.eval(s, model_completion=True).as_long() for s in sel]
        length = values.index(stop) if stop in values else max_size
        found.append(tuple(values[:length]))
        block = [sel[t] != values[t] for t in range(length)]
        if length < max_size:
            block.append(sel[length] != stop)
        solver.add(z3.Or(block))
    else:
        status = "unknown"
    found.sort(key=lambda p: (len(p), p))
    return [tuple(cands[i].instruction for i in p) for p in found], status


def _cost_tables(cands, cost: CostModel | None, lowering: Lowering | None, nbytes: float | None, k: int):
    """Per candidate: for each group, (its first position, step-time lower envelope by chunks held)."""
    if cost is None or lowering is None or nbytes is None:
        raise ValueError("a cost bound needs cost, lowering and nbytes")
    tables = []
    for cand in cands:
        kind = cand.instruction.collective
        lowered = lowering.lower(cand.groups)
        zero = cost.collective(kind, lowered, 0.0)
        unit = cost.collective(kind, lowered, 1.0)
        lat = zero.group_times
        coef = [u - z for u, z in zip(unit.group_times, lat)]
        per_group = []
        for gi, g in enumerate(cand.groups):
            copies = [gi + len(cand.groups) * key for key in range(len(lowering.keys))]
            share = len(g) if kind is Collective.ALLGATHER else 1
            table = [max(lat[c] + coef[c] * nbytes * share * h / k for c in copies) for h in range(k + 1)]
            per_group.append((g[0], table))
        tables.append(per_group)
    return tables
