"""Syntax-guided enumerative synthesis of reduction programs (seed 000 §3.5).

Programs are built on the synthesis hierarchy, in increasing size up to a limit (5 by
default, as in §4.2), keeping every program whose steps all satisfy their pre-conditions
and whose final state is the requested reduction.  Instructions that derive the same
groups with the same collective are one candidate (the first spelling is kept), so
programs whose lowered group sequences are identical count once; steps that change no
state are skipped (they lower to nothing).  A memo of states that cannot reach the goal
within the remaining budget prunes dead prefixes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..cost import Collective
from .dsl import Instruction, Program
from .hierarchy import SynthesisHierarchy
from .semantics import Semantics, State, Violation

__all__ = ["Candidate", "Synthesized", "candidates", "held_chunks", "hierarchy_semantics", "synthesize", "synthesize_traced",
           "DEFAULT_MAX_SIZE"]

DEFAULT_MAX_SIZE = 5
COLLECTIVE_ORDER = (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.ALLGATHER,
                    Collective.REDUCE, Collective.BROADCAST)


@dataclass(frozen=True)
class Candidate:
    instruction: Instruction
    groups: tuple[tuple[int, ...], ...]


def held_chunks(state: State, groups: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """How many chunks the first member of each group holds: the share of the data a step moves."""
    return tuple(bin(state.rows[g[0]]).count("1") for g in groups)


def candidates(hierarchy: SynthesisHierarchy) -> list[Candidate]:
    """Distinct (collective, groups) instructions of the hierarchy, in canonical order."""
    out, seen = [], set()
    for slice_level, form in hierarchy.instructions():
        groups = tuple(hierarchy.groups(slice_level, form))
        if all(len(g) < 2 for g in groups):
            continue  # no communication
        for coll in COLLECTIVE_ORDER:
            key = (coll, groups)
            if key not in seen:
                seen.add(key)
                out.append(Candidate(Instruction(slice_level, form, coll), groups))
    return out


def hierarchy_semantics(hierarchy: SynthesisHierarchy) -> tuple[Semantics, State, tuple[int, ...]]:
    """Semantics of one reduction group: k = m = its size; the goal is the full sum everywhere."""
    n = hierarchy.size
    sem = Semantics(n, n)
    goal_row = sem.column_bits(range(n))
    return sem, sem.initial(range(n)), tuple(sem.every_row(goal_row) for _ in range(n))


@dataclass(frozen=True)
class Synthesized:
    """A program with, per step, its candidate index and the chunks each group's first member holds."""

    program: Program
    candidates: tuple[int, ...]
    held: tuple[tuple[int, ...], ...]


def synthesize(hierarchy: SynthesisHierarchy, max_size: int = DEFAULT_MAX_SIZE) -> list[Program]:
    """Every valid program of at most ``max_size`` steps, shortest first, then in candidate order."""
    return [s.program for s in synthesize_traced(hierarchy, max_size)]


def synthesize_traced(hierarchy: SynthesisHierarchy, max_size: int = DEFAULT_MAX_SIZE) -> list[Synthesized]:
    """:func:`synthesize`, keeping what costing needs: candidates and chunks held per step."""
    sem, initial, goal = hierarchy_semantics(hierarchy)
    cands = candidates(hierarchy)
    found: list[tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]] = []
    dead: dict[tuple[int, ...], int] = {}  # state -> largest budget known to reach nothing

    def search(state: State, path: list[int], held: list[tuple[int, ...]], budget: int) -> bool:
        if dead.get(state.bits, -1) >= budget:
            return False
        any_found = False
        for n, cand in enumerate(cands):
            nxt = sem.apply(state, cand.instruction.collective, cand.groups)
            if isinstance(nxt, Violation) or nxt.bits == state.bits:
                continue
            h = held_chunks(state, cand.groups)
            if nxt.bits == goal:
                found.append((tuple(path + [n]), tuple(held + [h])))
                any_found = True
            elif budget > 1 and search(nxt, path + [n], held + [h], budget - 1):
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
