"""An SMT proof that a reduction program computes the exact sums, for every input.

The claim proved is the meaning of :mod:`.layout`: whatever data the devices start with,
every device ends with the sum over its reduction group, chunk by chunk.  z3 gets the
data as unknowns, one integer per (device, atom of chunks), and the value every step
leaves at every offset as a term over them (a step's sum is one ``+`` node shared by every
member that receives it); the negated claim, "some device ends with a value different
from its group's sum for some data", must be unsatisfiable.  A model of it is a concrete
counterexample: data on which the program is wrong.

This is independent of the Fig. 8 rules (:mod:`.verify`): no contribution sets, no
pre-conditions, only what the collectives add up.  What does not depend on the data is
not given to z3: which chunks every device holds (:func:`.layout.trace`, where a call the
library cannot run is found) and the atoms (chunk ranges no step tells apart, so one
unknown stands for a whole range).  That keeps the formula small: a two-step all-reduce
over 1 024 devices is a few dozen sums, whatever the chunk count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..cost import Collective
from ..errors import PlannerError
from ..solve import Stopwatch
from .hierarchy import Lowering
from .layout import REDUCING, Atoms, Trace, first_difference, size, trace
from .semantics import Violation
from .verify import Steps, Verdict, check_program, verdict_of

__all__ = ["Proof", "prove", "verify_z3"]


@dataclass
class Proof:
    """z3's answer: 'valid', 'invalid' or 'unknown'.  For 'invalid', where the program is
    wrong: the call the library cannot run, or a final (device, chunk) with the value it
    ends with on data z3 chose."""

    status: str
    where: Violation | None = None
    terms: int = 0  # distinct (final value, expected sum) pairs given to z3


class _BySlot:
    """A device's values when they depend on an atom only through its slot (see _Prover):
    atom ``a`` has ``terms[slot[a]]``.  Untouched data is ``x[owner][slot]``."""

    __slots__ = ("terms", "owner")

    def __init__(self, terms: tuple | None = None, owner: int | None = None):
        self.terms, self.owner = terms, owner


class _Terms:
    """Terms built on z3's C API in a context of their own.

    The Python wrappers cost more than z3 itself here (a 1 024-device program is about a
    hundred thousand term references), so terms are raw ASTs, each referenced once and
    freed with the context.  z3 hash-conses ASTs: equal sums are one node.
    """

    def __init__(self):
        import z3

        self.z3 = z3
        self.ctx = z3.Context()
        self.c = self.ctx.ref()
        self.int = z3.Z3_mk_int_sort(self.c)
        z3.Z3_inc_ref(self.c, z3.Z3_sort_to_ast(self.c, self.int))
        self._sums: dict[tuple[int, ...], object] = {}

    def _keep(self, ast):
        self.z3.Z3_inc_ref(self.c, ast)
        return ast

    def unknown(self, index: int):
        return self._keep(self.z3.Z3_mk_const(self.c, self.z3.Z3_mk_int_symbol(self.c, index), self.int))

    def add(self, terms: list):
        if len(terms) == 1:
            return terms[0]
        key = tuple(t.value for t in terms)
        hit = self._sums.get(key)
        if hit is None:
            hit = self._sums[key] = self._keep(self.z3.Z3_mk_add(self.c, len(terms), (self.z3.Ast * len(terms))(*terms)))
        return hit

    @staticmethod
    def ident(ast) -> int:
        return ast.value  # hash-consed: one pointer per distinct term

    def any_differs(self, pairs: list) -> object:
        z3, c = self.z3, self.c
        ne = [self._keep(z3.Z3_mk_not(c, self._keep(z3.Z3_mk_eq(c, a, b)))) for a, b in pairs]
        return z3.BoolRef(z3.Z3_mk_or(c, len(ne), (z3.Ast * len(ne))(*ne)), self.ctx)

    def arith(self, ast):
        return self.z3.ArithRef(ast, self.ctx)


def prove(num_devices: int, k: int, steps: Steps, reduction_groups: Sequence[Sequence[int]],
          timeout: float = 30.0, hint: tuple[int, int] | None = None, layout: Trace | None = None) -> Proof:
    """Prove ``steps`` compute every reduction group's exact sums, or refute it.

    ``hint``: a (device, chunk) suspected to end wrong (the rules' finding).  z3 first
    looks for data that makes that one value wrong, building only the terms it depends
    on; if there is none, the full claim decides.  The hint only saves time: the verdict
    is always z3's.  ``layout``: :func:`.layout.trace` of the same steps, if already made.
    """
    tr = layout if layout is not None else trace(num_devices, k, steps)
    if tr.problem is not None:
        return Proof("invalid", tr.problem)
    full = ((0, k),)
    for d, runs in enumerate(tr.final):
        if runs != full:
            c = first_difference(runs, full)
            return Proof("invalid", Violation(None, "post-condition", (d,), d, c,
                                              f"ends without chunk {c}: it must hold all {k} chunks of the sum"))
    prover = _Prover(tr, reduction_groups)
    if hint is not None:
        d, chunk = hint
        a = prover.atoms.index(chunk)
        proof = prover.decide({(d, a): (prover.final_term(d, a), prover.expected(d, a))}, timeout)
        if proof.status == "invalid":
            return proof
    return prover.decide(prover.every_final_pair(), timeout)


class _Prover:
    def __init__(self, tr: Trace, reduction_groups: Sequence[Sequence[int]]):
        self.tr, self.groups = tr, reduction_groups
        self.atoms = Atoms(tr, misaligned=True)
        self.na = len(self.atoms)
        # Which unknowns a value can involve.  Where a reduction hands different chunks at one
        # place, it adds those chunks' data together: those atoms form a class.  A final
        # value of atom a only involves data of a's class, and each class's claim is checked
        # on its own (the negated claim is a disjunction), so classes may share unknowns:
        # x[d][s] stands for device d's data of the s-th atom of whichever class.  Without
        # any such mixing every class is one atom and one unknown per device serves every
        # chunk (and chunks whose sums are built alike are proved once); a wrong sum can
        # never look right, since within a class every atom keeps its own unknown.
        parent = list(range(self.na))

        def find(a: int) -> int:
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a

        for step in tr.calls:
            for call in step:
                if call.kind in REDUCING and not call.aligned:
                    for _, where, aligned in self.atoms.segments(call):
                        for b in where[1:]:
                            ra, rb = find(where[0]), find(b)
                            if ra != rb:
                                parent[max(ra, rb)] = min(ra, rb)
        count: dict[int, int] = {}
        self.slot = []
        for a in range(self.na):
            r = find(a)
            self.slot.append(count.get(r, 0))
            count[r] = self.slot[-1] + 1
        self.slots = max(count.values(), default=1)
        self.T = _Terms()
        self._unknowns: dict[int, object] = {}
        self.group_of = {d: n for n, g in enumerate(reduction_groups) for d in g}
        self._expected: dict[tuple[int, int], object] = {}

    def x(self, d: int, s: int):
        """Device ``d``'s data of slot ``s``."""
        i = d * self.slots + s
        v = self._unknowns.get(i)
        if v is None:
            v = self._unknowns[i] = self.T.unknown(i)
        return v

    def expected(self, d: int, a: int):
        key = (self.group_of[d], self.slot[a])
        want = self._expected.get(key)
        if want is None:
            want = self._expected[key] = self.T.add([self.x(e, key[1]) for e in self.groups[key[0]]])
        return want

    def value(self, state, a: int):
        if isinstance(state, _BySlot):
            return self.by_slot(state, self.slot[a])
        return state[a]

    def by_slot(self, state: _BySlot, s: int):
        return self.x(state.owner, s) if state.terms is None else state.terms[s]

    # -- every final value, forward --------------------------------------------------------
    def final_states(self) -> list:
        T, atoms = self.T, self.atoms
        vals: list = [_BySlot(owner=d) for d in range(self.tr.num_devices)]
        for step in self.tr.calls:
            for call in step:
                g = call.group
                if call.kind in REDUCING:
                    per = size(call.before[0]) // len(g)
                    states = [vals[d] for d in g]
                    if call.aligned and all(isinstance(st, _BySlot) for st in states):
                        # Every atom handed at a place is the same atom: one sum per slot.
                        out = _BySlot(tuple(T.add([self.by_slot(st, s) for st in states]) for s in range(self.slots)))
                        for i, d in enumerate(g):
                            vals[d] = {} if call.kind is Collective.REDUCE and i > 0 else out
                        continue
                    results = [(pos, where, T.add([self.value(st, a) for st, a in zip(states, where)]))
                               for pos, where, _ in atoms.segments(call)]
                    shared = None
                    for i, d in enumerate(g):
                        if call.kind is Collective.REDUCE and i > 0:
                            vals[d] = {}
                        elif call.kind is Collective.REDUCESCATTER:
                            vals[d] = {where[i]: t for pos, where, t in results if i * per <= pos < (i + 1) * per}
                        elif call.aligned and shared is not None:
                            vals[d] = shared
                        else:
                            vals[d] = shared = {where[i]: t for _, where, t in results}
                elif call.kind is Collective.ALLGATHER:
                    states = [vals[d] for d in g]
                    if all(st is states[0] for st in states):
                        union = states[0]
                    else:
                        union = {}
                        for st, runs in zip(states, call.before):
                            for a in atoms.of(runs):
                                union[a] = self.value(st, a)
                    for d in g:
                        vals[d] = union
                else:
                    for d in g[1:]:
                        vals[d] = vals[g[0]]
        return vals

    def every_final_pair(self) -> dict:
        """(device, atom) -> (final term, expected sum), once per distinct pair of terms."""
        vals = self.final_states()
        pairs: dict[tuple[int, int], tuple] = {}
        seen: set[tuple[int, int]] = set()
        out = {}
        for d in range(self.tr.num_devices):
            state = vals[d]
            key = (id(state), self.group_of[d])
            if key in seen:
                continue  # shared final values (an all-gather or all-reduce hands one to all)
            seen.add(key)
            for a in range(self.na):
                have, want = self.value(state, a), self.expected(d, a)
                ident = (self.T.ident(have), self.T.ident(want))
                if ident not in pairs:
                    pairs[ident] = (d, a)
                    out[(d, a)] = (have, want)
        return out

    # -- one final value, backward (only what it depends on) --------------------------------
    def final_term(self, d: int, a: int):
        touched: list[dict[int, tuple]] = []
        for step in self.tr.calls:
            touched.append({m: (call, i) for call in step for i, m in enumerate(call.group)})
        memo: dict[tuple[int, int, int], object] = {}
        sums: dict[tuple[int, int], object] = {}
        segs: dict[int, dict] = {}

        def term(d: int, a: int, t: int):
            while t >= 0 and d not in touched[t]:
                t -= 1
            if t < 0:
                return self.x(d, self.slot[a])
            key = (d, a, t)
            hit = memo.get(key)
            if hit is not None:
                return hit
            call, i = touched[t][d]
            g = call.group
            if call.kind in REDUCING:
                if call.aligned:  # every member hands atom a at the same place
                    n, where = a, (a,) * len(g)
                else:
                    table = segs.get(id(call))
                    if table is None:
                        table = segs[id(call)] = {(j, w[j]): (n, w) for n, (_, w, _) in
                                                  enumerate(self.atoms.segments(call)) for j in range(len(g))}
                    n, where = table[(i, a)]
                out = sums.get((id(call), n))
                if out is None:
                    out = sums[(id(call), n)] = self.T.add([term(m, w, t - 1) for m, w in zip(g, where)])
            elif call.kind is Collective.ALLGATHER:
                chunk = self.atoms.starts[a]
                holder = next(m for m, runs in zip(g, call.before) if any(lo <= chunk < hi for lo, hi in runs))
                out = term(holder, a, t - 1)
            else:
                out = term(g[0], a, t - 1)
            memo[key] = out
            return out

        return term(d, a, len(self.tr.calls) - 1)

    # -- the decision ---------------------------------------------------------------------
    def decide(self, pairs: dict, timeout: float) -> Proof:
        import z3

        solver = z3.Solver(ctx=self.T.ctx)
        solver.set("timeout", max(1, int(timeout * 1000)))
        solver.add(self.T.any_differs(list(pairs.values())))
        answer = solver.check()
        if answer == z3.unsat:
            return Proof("valid", terms=len(pairs))
        if answer != z3.sat:
            return Proof("unknown", terms=len(pairs))
        model = solver.model()
        for (d, a), (have, want) in sorted(pairs.items()):
            got, need = (model.eval(self.T.arith(t), model_completion=True).as_long() for t in (have, want))
            if got != need:
                return Proof("invalid", Violation(None, "post-condition", (d,), d, self.atoms.starts[a],
                                                  f"ends with {got} where its group's sum is {need}, for data z3"
                                                  " chose"), len(pairs))
        raise PlannerError("z3 reported a counterexample that satisfies every final equation")


def verify_z3(lowering: Lowering, steps: Steps, timeout: float = 30.0, memory_bound: int | None = None) -> Verdict:
    """Prove ``steps`` valid on the placement of ``lowering`` with z3, or refute them.

    The verdict is z3's.  Its explanation (the step, group, device and chunk where the
    program goes wrong) comes from the rules (:func:`.verify.check_program`), which must
    reach the same verdict: a disagreement is a bug and raises :class:`PlannerError`.
    ``memory_bound``: as :func:`.verify.check_program` (the proof's values are laid out as
    the rules' are).
    """
    with Stopwatch() as sw:
        n, k, groups = lowering.num_devices, lowering.hierarchy.size, lowering.reduction_groups()
        outcome = check_program(n, k, steps, groups, memory_bound)
        hint = (outcome.failure.device, outcome.failure.chunk) if outcome.failure is not None else None
        proof = prove(n, k, steps, groups, timeout, hint, outcome.trace)
        if proof.status == "unknown":
            return Verdict("unknown", "z3", None, sw.seconds, "z3 did not decide within the time limit")
    detail = f"{proof.terms} distinct sum(s) checked" if proof.terms else "decided without data"
    if outcome.valid != (proof.status == "valid"):
        raise PlannerError(f"the z3 proof says {proof.status} but the rules say"
                           f" {'valid' if outcome.valid else 'invalid'}: this is a bug, please report it")
    if proof.status == "invalid" and proof.where is not None and proof.where.rule == "post-condition":
        detail += f"; z3's counterexample: device {proof.where.device}, chunk {proof.where.chunk} {proof.where.message}"
    return verdict_of(outcome, "z3", sw.seconds, detail)
