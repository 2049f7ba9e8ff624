"""Is a reduction program valid?  Decided exactly, and explained with P²'s Fig. 8 rules.

Valid means what :mod:`.layout` writes down: every call is one the library can run and,
whatever the data, every device ends with the exact sum over its reduction group.  This
module decides it by following the value of every (device, atom of chunks):

* a *clean partial sum*: one chunk's data summed over a set of devices, each once, which
  is a row of Fig. 8's state matrix (a bit set over the contributing devices);
* or *damaged*: it counts a device's data twice, or adds two different chunks together.
  Values only ever grow by addition, so damaged data can never become right again; a
  later step can only discard it (a Broadcast overwrites it, a Reduce or ReduceScatter
  drops it).

Fig. 8's pre-conditions (P² §3.2) are what keeps every value clean and useful:
R-AllReduce, R-ReduceScatter and R-Reduce ask every member to hold the same chunks with
disjoint contributions; R-AllGather disjoint chunks in equal shares (here, part of being
well-formed); R-Broadcast that nothing is lost and something is gained.  A program that
breaks no rule and ends in the goal state is valid.  The converse does not quite hold: a
step can break a rule without mattering (a Broadcast that adds nothing; damage a later
step discards).  Such a program computes the exact sums, so it is *valid*, and the
verdict names the wasted step as a warning.  An invalid program's counterexample is the
call the library cannot run, else the step whose damage reaches the end, else the first
broken rule, else the final state (the post-condition of §3.5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..cost import Collective
from ..solve import Stopwatch
from .dsl import Program
from .hierarchy import Lowering
from .layout import REDUCING, Atoms, Trace, copies, first_difference, size, trace
from .semantics import RULES, Violation
from .synthesis import lower_program

__all__ = ["Verdict", "Outcome", "system_steps", "verify_steps", "check_program", "goal_columns", "local_copies",
           "verdict_of", "value_tables"]

Steps = Sequence[tuple[Collective, Sequence[Sequence[int]]]]
NO_INFORMATION = "adds no information"


@dataclass
class Verdict:
    """``status``: 'valid', 'invalid' (with ``violation``) or 'unknown' (undecided in time).

    ``failure`` is the final state that is wrong (an invalid program's effect), ``warnings``
    the Fig. 8 rules a valid program breaks (wasted steps), ``local_copies`` the calls that
    need a local copy on a library that orders a group's ranks ascending.
    """

    status: str
    engine: str
    violation: Violation | None = None
    wall_time: float = 0.0
    detail: str = ""
    failure: Violation | None = None
    warnings: list[Violation] = field(default_factory=list)
    local_copies: list[dict] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return self.status == "valid"

    def as_dict(self) -> dict:
        return {"status": self.status, "engine": self.engine, "wall_time": self.wall_time, "detail": self.detail,
                "counterexample": _violation_dict(self.violation), "final_state": _violation_dict(self.failure),
                "warnings": [_violation_dict(w) for w in self.warnings], "local_copies": self.local_copies}


def _violation_dict(v: Violation | None) -> dict | None:
    if v is None:
        return None
    return {"step": None if v.step is None else v.step + 1, "rule": v.rule, "group": list(v.group),
            "device": v.device, "other": v.other, "chunk": v.chunk, "message": str(v)}


@dataclass
class Outcome:
    """What :func:`check_program` found (see the module docstring)."""

    valid: bool
    cause: Violation | None  # why invalid
    failure: Violation | None  # the first wrong final (device, chunk)
    fig8: Violation | None  # the first Fig. 8 rule broken, if any
    trace: Trace


def system_steps(lowering: Lowering, program: Program) -> list[tuple[Collective, list[list[int]]]]:
    """A DSL program lowered to device groups over the whole system."""
    return [(kind, lowering.lower(groups)) for kind, groups in lower_program(lowering.hierarchy, program)]


def goal_columns(num_devices: int, reduction_groups: Sequence[Sequence[int]]) -> list[int]:
    """Per device, the bit set of the devices whose data it must end with."""
    goal = [-1] * num_devices
    for g in reduction_groups:
        bits = 0
        for d in g:
            bits |= 1 << d
        for d in g:
            goal[d] = bits
    missing = [d for d, b in enumerate(goal) if b < 0]
    if missing:
        raise ValueError(f"devices {missing[:5]} are in no reduction group")
    return goal


def _columns(bits: int, limit: int = 8) -> str:
    cols, c = [], 0
    while bits and len(cols) <= limit:
        if bits & 1:
            cols.append(c)
        bits >>= 1
        c += 1
    return "[" + ", ".join(map(str, cols[:limit])) + (", ..." if len(cols) > limit else "") + "]"


class _Same:
    """Every atom a device holds has one value (its untouched data, or a sum that covered it all)."""

    __slots__ = ("v",)

    def __init__(self, v: int):
        self.v = v


def _get(state, a: int) -> int:
    return state.v if isinstance(state, _Same) else state[a]


def _holds(runs, chunk: int) -> bool:
    return any(lo <= chunk < hi for lo, hi in runs)


def value_tables(tr: Trace, atoms: Atoms) -> int:
    """At most how many (device, atom) values :func:`check_program` (and the proof) write
    into tables of their own: a gather's union, a misaligned reduction's per-member
    tables, an aligned reduction's one table.  Counted on the layout alone, before any
    value exists (:mod:`solver_planner.memory`); held sets shared by several devices are
    counted once."""
    counted: dict[int, int] = {}

    def count(runs) -> int:
        hit = counted.get(id(runs))
        if hit is None:
            hit = counted[id(runs)] = sum(atoms.index(b - 1) - atoms.index(a) + 1 for a, b in runs)
        return hit

    total = 0
    for step in tr.calls:
        for call in step:
            if call.kind is Collective.ALLGATHER or (call.kind in REDUCING and not call.aligned):
                total += sum(count(r) for r in call.before)
            elif call.kind in REDUCING:
                total += count(call.before[0])
    return total


def check_program(num_devices: int, k: int, steps: Steps, reduction_groups: Sequence[Sequence[int]],
                  memory_bound: int | None = None) -> Outcome:
    """Decide validity of ``steps`` on ``num_devices`` devices whose data is cut into ``k`` chunks.

    ``memory_bound``: refuse (:class:`~solver_planner.errors.RefusedError`) a program whose
    values would not fit in it, before building them (:mod:`solver_planner.memory`)."""
    goal = goal_columns(num_devices, reduction_groups)
    tr = trace(num_devices, k, steps)
    atoms = Atoms(tr)
    if memory_bound is not None:
        from ..memory import check, verify_estimate

        check(verify_estimate(num_devices, value_tables(tr, atoms)), "verifying this program", memory_bound)
    # vals[d]: per atom it holds, a clean bit set (>= 0) or damaged (-(i + 1): origins[i]
    # caused it); a _Same when all are equal.  States are never changed in place, so
    # members can share them.
    vals: list = [_Same(1 << d) for d in range(num_devices)]
    origins: list[Violation] = []
    fig8: Violation | None = None

    def damaged(v: Violation) -> int:
        origins.append(v)
        return -len(origins)

    def combine(ins: list[int], g, chunk: int, rule: str) -> int:
        """The sum of clean inputs, or why it is damaged."""
        nonlocal fig8
        bad = [v for v in ins if v < 0]
        if bad:
            return max(bad)  # the earliest origin
        acc = 0
        for i, v in enumerate(ins):
            twice = acc & v
            if twice:
                col = (twice & -twice).bit_length() - 1
                other = next(g[j] for j in range(i) if ins[j] >> col & 1)
                why = Violation(s, rule, g, g[i], chunk, f"holds data of device {col} that device {other} also"
                                " holds: adding them counts it twice", other=other)
                fig8 = fig8 or why
                return damaged(why)
            acc |= v
        return acc

    for s, (kind, groups) in enumerate(steps):
        kind = Collective.parse(kind)
        if fig8 is None and kind is Collective.BROADCAST:
            for g in groups:
                if len(g) == 1:
                    fig8 = Violation(s, RULES[kind], tuple(g), g[0], None, "a broadcast to nobody " + NO_INFORMATION)
                    break
        if s >= len(tr.calls):
            break
        for call in tr.calls[s]:
            g = call.group
            if kind in REDUCING:
                if call.empty:
                    continue
                states = [vals[d] for d in g]
                if call.aligned and all(isinstance(st, _Same) for st in states):
                    out = _Same(combine([st.v for st in states], g, call.before[0][0][0], RULES[kind]))
                    for i, d in enumerate(g):
                        vals[d] = {} if kind is Collective.REDUCE and i > 0 else out
                    continue
                mixed = None
                if not call.aligned:
                    c = first_difference(call.before[0], next(r for r in call.before if r != call.before[0]))
                    holder = next(i for i, r in enumerate(call.before) if _holds(r, c))
                    lacker = next(i for i, r in enumerate(call.before) if not _holds(r, c))
                    mixed = Violation(s, RULES[kind], g, g[lacker], c,
                                      f"holds no chunk {c} but device {g[holder]} does: the members hold different"
                                      " chunks, so the library would add data of different chunks together",
                                      other=g[holder])
                    fig8 = fig8 or mixed
                    mixed = damaged(mixed)
                results = [(pos, where, combine([_get(st, where[0]) for st in states], g, atoms.starts[where[0]],
                                                RULES[kind]) if aligned else mixed)
                           for pos, where, aligned in atoms.segments(call)]
                _write_reduction(kind, call, results, vals, size(call.before[0]) // len(g))
            elif kind is Collective.ALLGATHER:
                states = [vals[d] for d in g]
                if all(isinstance(st, _Same) and st.v == states[0].v for st in states):
                    union = states[0]
                else:
                    union = {}
                    for st, runs in zip(states, call.before):
                        for a in atoms.of(runs):
                            union[a] = _get(st, a)
                for d in g:
                    vals[d] = union
            else:
                root = vals[g[0]]
                if fig8 is None and not call.empty:
                    fig8 = _broadcast_rule(s, call, vals, atoms)
                for d in g[1:]:
                    vals[d] = root
    cause = failure = None
    if tr.problem is not None:
        cause = tr.problem
    else:
        full = ((0, k),)
        seen: set[tuple[int, int]] = set()
        for d in range(num_devices):
            if tr.final[d] != full:
                missing = first_difference(tr.final[d], full)
                failure = Violation(None, "post-condition", (d,), d, missing,
                                    f"ends without chunk {missing}: it must hold all {k} chunks of the sum")
                break
            state = vals[d]
            if (id(state), goal[d]) in seen:
                continue  # devices sharing their final values (and goal) are checked once
            seen.add((id(state), goal[d]))
            wrong = [(0, state.v)] if isinstance(state, _Same) else sorted(state.items())
            bad = next(((a, v) for a, v in wrong if v != goal[d]), None)
            if bad is not None:
                a, v = bad
                chunk = atoms.starts[a]
                if v < 0:
                    origin = origins[-v - 1]
                    how = "counts some device's data twice" if "twice" in origin.message else \
                        "adds data of different chunks together"
                    failure = Violation(None, "post-condition", (d,), d, chunk,
                                        f"ends with a wrong value: it {how} (from step {origin.step + 1})")
                    cause = origin
                else:
                    failure = Violation(None, "post-condition", (d,), d, chunk,
                                        f"holds contributions {_columns(v)} instead of the reduction group's"
                                        f" {_columns(goal[d])}")
                break
        if failure is not None and cause is None:
            cause = fig8 if fig8 is not None and NO_INFORMATION not in fig8.message else failure
    return Outcome(cause is None, cause, failure, fig8, tr)


def _write_reduction(kind: Collective, call, results, vals: list, per: int) -> None:
    """Write a reduction's per-stretch results back at each member's own atoms."""
    g = call.group
    shared = None
    for i, d in enumerate(g):
        if kind is Collective.REDUCE and i > 0:
            vals[d] = {}
        elif kind is Collective.REDUCESCATTER:
            lo, hi = i * per, (i + 1) * per
            vals[d] = {where[i]: v for pos, where, v in results if lo <= pos < hi}
        elif call.aligned and shared is not None:
            vals[d] = shared  # every member holds the same atoms: one state for all
        else:
            vals[d] = shared = {where[i]: v for _, where, v in results}


def _broadcast_rule(s: int, call, vals, atoms: Atoms) -> Violation | None:
    """R-Broadcast: nothing a member holds is missing from the root, and someone gains."""
    rule, g = RULES[Collective.BROADCAST], call.group
    root, root_runs = vals[g[0]], call.before[0]
    gain = False
    for d, runs in zip(g[1:], call.before[1:]):
        state = vals[d]
        if runs == root_runs and isinstance(state, _Same) and isinstance(root, _Same):
            lost, a = state.v & ~root.v, atoms.index(runs[0][0])
            gain = gain or state.v != root.v
        else:
            lost, a = 0, None
            for a in atoms.of(runs):
                held = _get(root, a) if _holds(root_runs, atoms.starts[a]) else 0
                lost = _get(state, a) & ~held
                if lost:
                    break
            gain = gain or runs != root_runs or any(_get(state, b) != _get(root, b) for b in atoms.of(runs))
        if lost:
            col = (lost & -lost).bit_length() - 1
            return Violation(s, rule, g, d, atoms.starts[a],
                             f"holds device {col}'s contribution that the root {g[0]} lacks: it would be lost",
                             other=g[0])
    if not gain:
        return Violation(s, rule, g, g[0], None, "every member already holds what the root holds: the broadcast "
                         + NO_INFORMATION)
    return None


def local_copies(tr: Trace) -> list[dict]:
    """The calls that need a local copy when the library orders a group's ranks ascending."""
    out = []
    for step in tr.calls:
        for call in step:
            flags = copies(call)
            pack = [d for d in call.group if flags.get(d) and flags[d].pack]
            unpack = [d for d in call.group if flags.get(d) and flags[d].unpack]
            if pack or unpack:
                out.append({"step": call.step + 1, "group": list(call.group), "pack": pack, "unpack": unpack})
    return out


def verdict_of(outcome: Outcome, engine: str, seconds: float, detail: str = "") -> Verdict:
    """The verdict a user sees, from :func:`check_program`'s outcome."""
    if outcome.valid:
        return Verdict("valid", engine, None, seconds, detail, None,
                       [outcome.fig8] if outcome.fig8 is not None else [], local_copies(outcome.trace))
    return Verdict("invalid", engine, outcome.cause, seconds, detail, outcome.failure, [], [])


def verify_steps(lowering: Lowering, steps: Steps, memory_bound: int | None = None) -> Verdict:
    """Decide ``steps`` (device groups over the whole system) on the placement of ``lowering``
    (``memory_bound``: as :func:`check_program`)."""
    with Stopwatch() as sw:
        outcome = check_program(lowering.num_devices, lowering.hierarchy.size, steps, lowering.reduction_groups(),
                                memory_bound)
    return verdict_of(outcome, "semantics", sw.seconds)

