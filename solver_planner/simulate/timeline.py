"""The result of a simulation: when every task ran, and per-resource views of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Sequence

from .task import Task

__all__ = ["Record", "Timeline"]


@dataclass(frozen=True)
class Record:
    """One task as it ran."""

    id: int
    name: str
    start: float
    end: float
    resources: tuple[Hashable, ...]
    devices: tuple[int, ...]
    stream: str
    category: str
    args: dict[str, Any]

    @property
    def duration(self) -> float:
        return self.end - self.start


class Timeline:
    """Start and end of every task of a :class:`~solver_planner.simulate.Simulation`."""

    def __init__(self, tasks: Sequence[Task], start: Sequence[float], end: Sequence[float]):
        self._tasks, self._start, self._end = tasks, start, end
        self._records: list[Record] | None = None

    @property
    def records(self) -> list[Record]:
        """Every task as it ran, by id (built on first use: a search that only needs the
        makespan never pays for them)."""
        if self._records is None:
            self._records = [
                Record(i, t.name, s, e, t.resources, t.devices, t.stream, t.category, t.args)
                for i, (t, s, e) in enumerate(zip(self._tasks, self._start, self._end))
            ]
        return self._records

    def __len__(self) -> int:
        return len(self._tasks)

    def __getitem__(self, i: int) -> Record:
        return self.records[i]

    @property
    def makespan(self) -> float:
        """End of the last task (0 for an empty timeline)."""
        return max(self._end, default=0.0)

    def on(self, resource: Hashable) -> list[Record]:
        """Tasks that held ``resource``, by start time."""
        return sorted((r for r in self.records if resource in r.resources), key=lambda r: (r.start, r.id))

    def busy_time(self, resource: Hashable) -> float:
        return sum(r.duration for r in self.records if resource in r.resources)

    def overlaps(self) -> list[tuple[Hashable, Record, Record]]:
        """Pairs of tasks that held one resource at the same time (empty for a valid run)."""
        by_resource: dict[Hashable, list[Record]] = {}
        for r in self.records:
            for res in r.resources:
                by_resource.setdefault(res, []).append(r)
        found = []
        for res, recs in by_resource.items():
            recs.sort(key=lambda r: (r.start, r.end))
            for a, b in zip(recs, recs[1:]):
                if b.start < a.end and a.duration > 0 and b.duration > 0:
                    found.append((res, a, b))
        return found
