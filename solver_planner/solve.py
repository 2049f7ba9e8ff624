"""The one result type every solver returns (DESIGN.md, "One result type for every solver").

A result says what was found, how sure the solver is, and how it got there: status,
objective, best bound, gap, wall time, and the method used.  Optimality is claimed only
when the gap is zero, never inferred from a status alone.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar

__all__ = ["Status", "SolveResult", "Stopwatch", "gap"]

T = TypeVar("T")


class Status(str, Enum):
    OPTIMAL = "OPTIMAL"
    FEASIBLE = "FEASIBLE"
    INFEASIBLE = "INFEASIBLE"
    UNKNOWN = "UNKNOWN"


def gap(objective: float | None, bound: float | None) -> float | None:
    """Relative gap ``(objective - bound) / objective`` of a minimisation (0 when proven)."""
    if objective is None or bound is None:
        return None
    if objective == bound:
        return 0.0
    if objective == 0 or not math.isfinite(objective):
        return math.inf
    return max(0.0, (objective - bound) / abs(objective))


@dataclass
class SolveResult(Generic[T]):
    """What a solver found: ``solution`` (or several), with status, objective, bound and gap."""

    status: Status
    method: str
    solution: T | None = None
    objective: float | None = None
    bound: float | None = None
    wall_time: float = 0.0
    solutions: list[T] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float | None:
        return gap(self.objective, self.bound)

    @property
    def proven_optimal(self) -> bool:
        return self.gap == 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status.value, "method": self.method, "objective": self.objective,
                "bound": self.bound, "gap": self.gap, "wall_time": self.wall_time, **self.info}


class Stopwatch:
    """Wall time of a block: ``with Stopwatch() as sw: ...; sw.seconds``."""

    def __enter__(self) -> Stopwatch:
        self._start = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start

