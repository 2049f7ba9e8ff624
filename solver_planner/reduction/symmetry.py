"""A large synthesis hierarchy synthesized on a small one that stands for it, then costed exactly.

The semantics of P² (§3.2, Fig. 8) follows a ``k x k`` boolean state per position of
a hierarchy of ``k`` positions: ``k**3`` bits a state, 10**15 at 100 000 devices.  But the
instructions of §3.3 treat every instance of a level alike: which instructions derive the
same groups depends only on which levels have a single instance, and whether a step is
allowed only on the roles of the positions (the first member of a group is the root of
Reduce and Broadcast; ``Master`` keeps the groups of coordinate 0; a ReduceScatter hands
block ``p`` to member ``p``).  So synthesis runs on a *representative* hierarchy: the same
level names, each count above 1 replaced by a distinct prime (2, 3, 5, ...), counts of 1
kept (distinct primes: no count divides another by accident).  That it finds the same
valid programs, in the same order, is a claim about the semantics that is tested, not
proved: ``tests/test_reduction_symmetry.py`` compares it with synthesis on the real
hierarchy over random hierarchies and placements.

Costing makes no such claim: what every real position holds before each step is followed
exactly (:mod:`.held`, positions that hold translated sets share one shape), and a step
moves and copies what :class:`.ranking.StepCoster` charges (P² §4: the lowered groups
of a step run at once; the buffer of a group is what its first member holds; local copies
by :func:`.layout.copies`).  Programs sharing a prefix share its states.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..cost import Collective, CollectiveCost, CostModel
from .dsl import Instruction, Program
from .held import HeldState, Shapes, apply, copied_chunks, group_array, initial, shape_kinds, signatures
from .hierarchy import Lowering, SynthesisHierarchy
from .ranking import CostedProgram, Step

__all__ = ["representative", "RepresentativeCoster", "PRIMES"]

# One prime per level with more than one instance; MAX_LEVELS (16) levels at most.
PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53)


def representative(hierarchy: SynthesisHierarchy) -> SynthesisHierarchy:
    """The same levels, each count above 1 replaced by the next prime (the root keeps 1)."""
    primes = iter(PRIMES)
    return SynthesisHierarchy(hierarchy.names, tuple(1 if c == 1 else next(primes) for c in hierarchy.counts))


class RepresentativeCoster:
    """:class:`.ranking.StepCoster` without per-position bit masks: programs synthesized on
    :func:`representative`, costed on the real lowering (held sets by :mod:`.held`)."""

    def __init__(self, cost: CostModel, lowering: Lowering, nbytes: float, algorithm: str = "ring"):
        self.cost, self.lowering, self.nbytes, self.algorithm = cost, lowering, nbytes, algorithm
        self.real = lowering.hierarchy
        self.k = self.real.size
        self.shapes = Shapes()
        self.start = initial(self.shapes, self.k, self.k)
        self._groups: dict[Instruction, tuple[list, np.ndarray]] = {}
        self._costs: dict[tuple, tuple[list[list[int]], list[float], CollectiveCost]] = {}

    def _instruction(self, instruction: Instruction) -> tuple[list, np.ndarray]:
        hit = self._groups.get(instruction)
        if hit is None:
            groups = self.real.groups(instruction.slice, instruction.form)
            hit = self._groups[instruction] = (groups, group_array(groups))
        return hit

    def step(self, instruction: Instruction, state: HeldState) -> tuple[Step, CollectiveCost]:
        """The step ``instruction`` takes from ``state`` (what every real position holds)."""
        groups, array = self._instruction(instruction)
        kind, chunk = instruction.collective, self.nbytes / self.k
        width = array.shape[1]
        held = self.shapes.size_of(state.shape[array[:, 0]]) if width > 1 else np.zeros(len(groups), dtype=np.int64)
        active = np.flatnonzero(held > 0)   # members holding nothing issue no call
        copy = 0.0
        if self.cost.topology.device.memory_bandwidth and len(active):
            # what a call copies depends on the shapes its members hold, and for a gather on
            # where they sit relative to each other too (layout.copies)
            if kind is Collective.ALLGATHER:
                first, _, _ = signatures(state, array[active])
            else:
                first, _ = shape_kinds(state, array[active])
            for gi in first.tolist():
                copied = copied_chunks(self.shapes, state, kind, array[active[gi]])
                copy = max(copy, self.cost.copy_time(copied * chunk))
        key = (kind, instruction.slice, instruction.form, held.tobytes())
        hit = self._costs.get(key)
        if hit is None:
            factor = width if kind is Collective.ALLGATHER else 1
            sizes = [chunk * h * factor for h in held[active].tolist()]
            lowered = self.lowering.lower([groups[i] for i in active.tolist()])
            sizes = sizes * len(self.lowering.keys)
            hit = self._costs[key] = (lowered, sizes, self.cost.collective(kind, lowered, sizes, self.algorithm))
        lowered, sizes, collective = hit
        return Step(kind, lowered, sizes, copy), collective

    def _costed(self, program: Program, parts: list[tuple[Step, CollectiveCost]]) -> CostedProgram:
        times = [c.time + s.copy_time for s, c in parts]
        return CostedProgram(program, sum(times), [s for s, _ in parts], times, [c for _, c in parts])

    def program(self, program: Program, held=None) -> CostedProgram:
        """Cost one ``program`` (``held``, the representative's masks, is not needed)."""
        return self.programs([program])[0]

    def programs(self, programs: Sequence[Program]) -> list[CostedProgram]:
        """Cost every program, each prefix once: in lexicographic order, the states of the
        current prefix kept on a stack (at most one state per step in memory)."""
        order = sorted(range(len(programs)), key=lambda i: [str(ins) for ins in programs[i]])
        out: list[CostedProgram | None] = [None] * len(programs)
        path: list[Instruction] = []
        stack: list[tuple[HeldState, tuple[Step, CollectiveCost] | None]] = [(self.start, None)]
        for i in order:
            program = programs[i]
            common = 0
            while common < min(len(path), len(program)) and path[common] == program[common]:
                common += 1
            del path[common:]
            del stack[common + 1:]
            for ins in program[common:]:
                state = stack[-1][0]
                part = self.step(ins, state)
                _, array = self._instruction(ins)
                stack.append((apply(self.shapes, state, ins.collective, array), part))
                path.append(ins)
            out[i] = self._costed(program, [part for _, part in stack[1:len(program) + 1]])
        return out  # type: ignore[return-value]
