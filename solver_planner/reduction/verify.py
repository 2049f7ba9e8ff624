"""Is a program valid for a placement?  The concrete semantics over the whole system.

A program (DSL, lowered; or explicit steps) is valid when every step's pre-condition holds
and every device ends with the exact sum over its reduction group (seed 000 §3.5).  The
whole system is modelled: ``k`` chunks (the reduction group size, so every hierarchical
scatter divides) and one column per device, so a step that mixes devices of different
reduction groups is caught like any other.  :mod:`solver_planner.reduction.smt` proves
the same with z3.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..cost import Collective
from ..solve import Stopwatch
from .dsl import Program
from .hierarchy import Lowering
from .semantics import Semantics, Violation
from .synthesis import lower_program

__all__ = ["Verdict", "system_steps", "verify_steps"]

Steps = Sequence[tuple[Collective, Sequence[Sequence[int]]]]


@dataclass
class Verdict:
    """``status``: 'valid', 'invalid' (with ``violation``) or 'unknown' (undecided in time)."""

    status: str
    engine: str
    violation: Violation | None = None
    wall_time: float = 0.0
    detail: str = ""

    @property
    def valid(self) -> bool:
        return self.status == "valid"

    def as_dict(self) -> dict:
        v = self.violation
        return {"status": self.status, "engine": self.engine, "wall_time": self.wall_time, "detail": self.detail,
                "counterexample": None if v is None else {
                    "step": None if v.step is None else v.step + 1, "rule": v.rule, "group": list(v.group),
                    "device": v.device, "other": v.other, "chunk": v.chunk, "message": str(v)}}


def system_steps(lowering: Lowering, program: Program) -> list[tuple[Collective, list[list[int]]]]:
    """A DSL program lowered to device groups over the whole system."""
    return [(kind, lowering.lower(groups)) for kind, groups in lower_program(lowering.hierarchy, program)]


def verify_steps(lowering: Lowering, steps: Steps) -> Verdict:
    """Run ``steps`` from the initial state with the concrete semantics and check the goal."""
    with Stopwatch() as sw:
        n, k = lowering.num_devices, lowering.hierarchy.size
        sem = Semantics(k, n)
        group_of = lowering.group_of()
        goal = [group_of[d] for d in range(n)]
        _, violation = sem.run(sem.initial(range(n)), steps, sem.goal_bits(goal))
    return Verdict("invalid" if violation else "valid", "semantics", violation, sw.seconds)
