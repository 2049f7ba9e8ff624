"""One unit of simulated work: what the engine schedules and the timeline records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable

__all__ = ["Task"]


@dataclass(slots=True)
class Task:
    """One unit of simulated work; see :meth:`Simulation.add`."""

    name: str
    duration: float
    resources: tuple[Hashable, ...] = ()
    deps: tuple[int, ...] = ()
    release: float = 0.0
    priority: float = 0.0
    devices: tuple[int, ...] = ()
    stream: str = "comm"
    category: str = ""
    args: dict[str, Any] = field(default_factory=dict)
