"""Syntax-guided enumerative synthesis of reduction programs (P² §3.5).

Programs are built on the synthesis hierarchy, in increasing size up to a limit (5 by
default, as in §4.2), keeping every program whose steps all satisfy their pre-conditions
and whose final state is the requested reduction.  Instructions that derive the same
groups with the same collective are one candidate (the first spelling is kept), so
programs whose lowered group sequences are identical count once; steps that change no
state are skipped (they lower to nothing).  A memo of states that cannot reach the goal
within the remaining budget prunes dead prefixes.

Two ways to measure a program's size (``metric``):

* ``instructions`` (the default): every instruction counts 1.  Complete at the default
  limit 5 for the hierarchies we ship, and it finds programs the paper's space misses.
* ``paper``: P²'s space as its evaluation counts it, to reproduce its figures
  (§4.2: 3 programs per placement for a 1-level synthesis hierarchy, 47 for a 2-level
  one, at limit 5): an ``InsideGroup`` instruction counts 1, a ``Parallel(e)`` or
  ``Master(e)`` one 2, and R-Broadcast is taken verbatim (every group must gain, so a
  broadcast step with a group that holds nothing is not synthesized; see
  :class:`.semantics.Semantics`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..choices import SIZE_METRICS
from ..cost import Collective
from .dsl import Instruction, Program
from .hierarchy import SynthesisHierarchy
from .semantics import Semantics, State, Violation

__all__ = ["Candidate", "Synthesized", "candidates", "hierarchy_semantics", "synthesize", "synthesize_traced",
           "program_size", "DEFAULT_MAX_SIZE", "METRICS"]

DEFAULT_MAX_SIZE = 5
COLLECTIVE_ORDER = (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.ALLGATHER,
                    Collective.REDUCE, Collective.BROADCAST)


METRICS = SIZE_METRICS


@dataclass(frozen=True)
class Candidate:
    instruction: Instruction
    groups: tuple[tuple[int, ...], ...]
    weight: int = 1  # its size under the paper's metric: 1 for InsideGroup, 2 otherwise (cheapest spelling)


def candidates(hierarchy: SynthesisHierarchy) -> list[Candidate]:
    """Distinct (collective, groups) instructions of the hierarchy, in canonical order."""
    out: list[Candidate] = []
    seen: dict[tuple, int] = {}
    for slice_level, form in hierarchy.instructions():
        groups = tuple(hierarchy.groups(slice_level, form))
        if all(len(g) < 2 for g in groups):
            continue  # no communication
        weight = form_weight(form)
        for coll in COLLECTIVE_ORDER:
            key = (coll, groups)
            if key not in seen:
                seen[key] = len(out)
                out.append(Candidate(Instruction(slice_level, form, coll), groups, weight))
            elif weight < out[seen[key]].weight:
                old = out[seen[key]]
                out[seen[key]] = Candidate(old.instruction, old.groups, weight)
    return out


def form_weight(form) -> int:
    """An instruction's size under the paper's metric: 1 for ``InsideGroup``, 2 otherwise."""
    return 1 if form.kind == "InsideGroup" else 2


def program_size(program: Program, metric: str = "instructions") -> int:
    """A program's size under ``metric`` (see the module docstring)."""
    if metric == "instructions":
        return len(program)
    return sum(form_weight(ins.form) for ins in program)


def hierarchy_semantics(hierarchy: SynthesisHierarchy, strict_broadcast: bool = False
                        ) -> tuple[Semantics, State, tuple[int, ...]]:
    """Semantics of one reduction group: k = m = its size; the goal is the full sum everywhere."""
    n = hierarchy.size
    sem = Semantics(n, n, strict_broadcast)
    goal_row = sem.column_bits(range(n))
    return sem, sem.initial(range(n)), tuple(sem.every_row(goal_row) for _ in range(n))


@dataclass(frozen=True)
class Synthesized:
    """A program with, per step, its candidate index and the chunks every position holds
    before it (bit masks, :attr:`State.rows`): what costing a step needs."""

    program: Program
    candidates: tuple[int, ...]
    held: tuple[tuple[int, ...], ...]


def synthesize(hierarchy: SynthesisHierarchy, max_size: int = DEFAULT_MAX_SIZE, metric: str = "instructions"
               ) -> list[Program]:
    """Every valid program of size at most ``max_size``, shortest first, then in candidate order."""
    return [s.program for s in synthesize_traced(hierarchy, max_size, metric)]


def synthesize_traced(hierarchy: SynthesisHierarchy, max_size: int = DEFAULT_MAX_SIZE, metric: str = "instructions"
                      ) -> list[Synthesized]:
    """:func:`synthesize`, keeping what costing needs: candidates and chunks held per step."""
    if metric not in METRICS:
        raise ValueError(f"unknown size metric {metric!r}; expected one of {', '.join(METRICS)}")
    paper = metric == "paper"
    sem, initial, goal = hierarchy_semantics(hierarchy, strict_broadcast=paper)
    cands = candidates(hierarchy)
    cost = [c.weight if paper else 1 for c in cands]
    found: list[tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]] = []
    dead: dict[tuple[int, ...], int] = {}  # state -> largest budget known to reach nothing

    def search(state: State, path: list[int], held: list[tuple[int, ...]], budget: int) -> bool:
        if dead.get(state.bits, -1) >= budget:
            return False
        any_found = False
        for n, cand in enumerate(cands):
            if cost[n] > budget:
                continue
            nxt = sem.apply(state, cand.instruction.collective, cand.groups)
            if isinstance(nxt, Violation) or nxt.bits == state.bits:
                continue
            h = state.rows
            if nxt.bits == goal:
                found.append((tuple(path + [n]), tuple(held + [h])))
                any_found = True
            elif budget > cost[n] and search(nxt, path + [n], held + [h], budget - cost[n]):
                any_found = True
        if not any_found:
            dead[state.bits] = max(dead.get(state.bits, -1), budget)
        return any_found

    if initial.bits == goal:
        return []
    search(initial, [], [], max_size)
    found.sort(key=lambda f: (len(f[0]), f[0]))
    return [Synthesized(tuple(cands[i].instruction for i in p), p, h) for p, h in found]


def lower_program(hierarchy: SynthesisHierarchy, program: Program) -> list[tuple[Collective, list[tuple[int, ...]]]]:
    """Each instruction's collective and position groups (raises ``ValueError`` on a bad slice/form)."""
    return [(ins.collective, hierarchy.groups(ins.slice, ins.form)) for ins in program]


def run_on_hierarchy(hierarchy: SynthesisHierarchy, program: Program) -> tuple[State, Violation | None]:
    """Run a DSL program on one reduction group with the concrete semantics."""
    sem, initial, goal = hierarchy_semantics(hierarchy)
    return sem.run(initial, lower_program(hierarchy, program), goal)


def states_along(hierarchy: SynthesisHierarchy, program: Program) -> list[State]:
    """The state before each step and after the last (for costing: chunks held per step)."""
    sem, state, _ = hierarchy_semantics(hierarchy)
    states = [state]
    for kind, groups in lower_program(hierarchy, program):
        nxt = sem.apply(state, kind, groups)
        if isinstance(nxt, Violation):
            raise ValueError(str(nxt))
        states.append(nxt)
        state = nxt
    return states
