"""Bounded synthesis with z3 over the Fig. 8 rules (P² §3.2, §3.5).

A second implementation of the rules of :mod:`.semantics`, as formulas: chunk ``r`` of
position ``d`` after step ``t`` is a bit-vector ``S[t][d][r]`` over the contributing
positions.  :func:`synthesize_z3` finds every valid program of at most ``k`` steps on a
synthesis hierarchy (optionally under a cost bound), choosing each step among the same
candidate instructions as enumeration and blocking each program found; the tests check
it returns exactly the enumerated programs.  (Proving a given program is
:mod:`.proof`'s job.)
"""

from __future__ import annotations

from fractions import Fraction

from ..cost import Collective, CostModel
from .dsl import Program
from .hierarchy import Lowering, SynthesisHierarchy
from .semantics import RULES, Violation
from .synthesis import candidates

__all__ = ["synthesize_z3"]


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
            # A group where nobody holds anything is a no-op (as in :mod:`.semantics`).
            grows = z3.Or([S[d][r] != S[root][r] for d in g[1:] for r in range(k)]
                          + [z3.And([S[d][r] == zero for d in g for r in range(k)])])
            checks.append(_Check(grows, step, rule, lg, label(root), None,
                                 "every member already holds what the root holds: the broadcast adds no information"))
            for d in g[1:]:
                nxt[d] = list(S[root])
    return checks, nxt


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
    programs = [tuple(cands[i].instruction for i in p) for p in found]
    if tables is not None:
        from .ranking import StepCoster

        coster = StepCoster(cost, lowering, nbytes)
        limit = bound * (1 + 1e-9)
        programs = [p for p in programs if coster.program(p).time <= limit]
    return programs, status


def _cost_tables(cands, cost: CostModel | None, lowering: Lowering | None, nbytes: float | None, k: int):
    """Per candidate: for each group, (its first position, a lower bound on the step's time by
    the chunks that position holds).

    The bound is the group's time with only its own copies (one per non-reduction
    coordinate) on the links: other groups can only add load.  A group holding nothing
    issues no call (0).  Local copies are left out (they only add time).  So the
    solver never drops a program whose true cost is within the bound; the caller filters
    the programs it finds by their exact cost.
    """
    if cost is None or lowering is None or nbytes is None:
        raise ValueError("a cost bound needs cost, lowering and nbytes")
    tables = []
    for cand in cands:
        kind = cand.instruction.collective
        per_group = []
        for g in cand.groups:
            lowered = lowering.lower([g])
            if len(g) < 2:
                per_group.append((g[0], [0.0] * (k + 1)))
                continue
            share = len(g) if kind is Collective.ALLGATHER else 1
            # time = latency + bytes * per-byte term: affine, sampled at two sizes.
            one = cost.collective(kind, lowered, nbytes * share / k).time
            two = cost.collective(kind, lowered, 2 * nbytes * share / k).time
            table = [0.0] + [(2 * one - two) + (two - one) * h for h in range(1, k + 1)]
            per_group.append((g[0], table))
        tables.append(per_group)
    return tables
