"""The load-balancing and scheduling problem of the resharding paper §3.2 (Eq. 1-3), and its schedules.

Each unit task picks one sender host among those holding its slice (Eq. 2) and a start
time; tasks that use a common resource never overlap (Eq. 3); the objective is the end
of the last task (Eq. 1).

Resources: the ports the cost model says a task's transfers cross.  The resharding paper §3 assumes
full-duplex links, so a host's NIC is two resources, sending (``tx``) and receiving
(``rx``): a host may send one slice while it receives another.  In a broadcast chain
every receiver host but the last also forwards, so it holds both.  When the meshes are
on different hosts this is exactly the resharding paper's rule "tasks sharing a host never
overlap", because every host of the destination mesh receives in each of its tasks;
it differs only when both meshes share a host, where full duplex allows more overlap.

Times are integers in nanoseconds (``TIME_UNIT``) so that every method, the solver
model included, schedules the same exact numbers and a proof of optimality is a proof
for these numbers; the cost model's seconds are rounded once, to the nearest nanosecond.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..topology import Resource

__all__ = ["TIME_UNIT", "Candidate", "Instance", "Schedule", "to_units"]

TIME_UNIT = 1e-9  # seconds per scheduling time unit


def to_units(seconds: float) -> int:
    return int(round(seconds / TIME_UNIT))


@dataclass(frozen=True)
class Candidate:
    """Task sent by ``device`` on ``host``: lasts ``duration`` units and holds ``resources``."""

    host: int
    device: int
    duration: int
    resources: tuple[int, ...]  # indices into Instance.resources


@dataclass(frozen=True)
class Schedule:
    """For each task, the candidate chosen (``choice``) and its start and end."""

    choice: tuple[int, ...]
    start: tuple[int, ...]
    end: tuple[int, ...]

    @property
    def makespan(self) -> int:
        return max(self.end, default=0)

    def order(self) -> list[int]:
        """Tasks by start time (ties by index): a list order that rebuilds this schedule."""
        return sorted(range(len(self.start)), key=lambda i: (self.start[i], i))


class Instance:
    """Candidates per task (sorted by host) over a shared list of resources."""

    def __init__(self, candidates: Sequence[Sequence[Candidate]], resources: Sequence[Resource]):
        if any(not c for c in candidates):
            raise ValueError("every task needs at least one candidate sender")
        self.candidates = [list(c) for c in candidates]
        self.resources = list(resources)

    def __len__(self) -> int:
        return len(self.candidates)

    def min_duration(self, i: int) -> int:
        return min(c.duration for c in self.candidates[i])

    def signature(self, i: int) -> tuple:
        """Tasks with equal signatures are interchangeable in any schedule."""
        return tuple((c.host, c.duration, c.resources) for c in self.candidates[i])

    # -- building schedules ----------------------------------------------------------------
    def list_schedule(self, order: Sequence[int], choice: Sequence[int]) -> Schedule:
        """Start each task, in ``order``, as soon as all its resources are free (the resharding paper §3.2:
        an execution order per host fixes the start times)."""
        free = [0] * len(self.resources)
        start = [0] * len(self)
        end = [0] * len(self)
        for i in order:
            c = self.candidates[i][choice[i]]
            s = max((free[r] for r in c.resources), default=0)
            start[i], end[i] = s, s + c.duration
            for r in c.resources:
                free[r] = end[i]
        return Schedule(tuple(choice), tuple(start), tuple(end))

    def left_shift(self, schedule: Schedule) -> Schedule:
        """The same choices and per-resource orders, every task as early as they allow."""
        return self.list_schedule(schedule.order(), schedule.choice)

    def violations(self, schedule: Schedule) -> list[str]:
        """Why ``schedule`` is not a feasible schedule of this instance (empty if it is)."""
        out = []
        if len(schedule.choice) != len(self):
            return [f"{len(schedule.choice)} choices for {len(self)} tasks"]
        by_resource: dict[int, list[int]] = defaultdict(list)
        for i, k in enumerate(schedule.choice):
            if not 0 <= k < len(self.candidates[i]):
                out.append(f"task {i}: no candidate sender {k}")
                continue
            c = self.candidates[i][k]
            if schedule.start[i] < 0 or schedule.end[i] - schedule.start[i] != c.duration:
                out.append(f"task {i}: runs {schedule.start[i]}..{schedule.end[i]} but lasts {c.duration}")
            for r in c.resources:
                by_resource[r].append(i)
        for r, tasks in sorted(by_resource.items()):
            tasks.sort(key=lambda i: (schedule.start[i], i))
            for a, b in zip(tasks, tasks[1:]):
                if schedule.start[b] < schedule.end[a]:
                    out.append(f"tasks {a} and {b} overlap on {self.resources[r]}")
        return out

    # -- bounds ------------------------------------------------------------------------------
    def mandatory(self, i: int) -> set[int]:
        """Resources task ``i`` holds whichever sender it gets."""
        return set.intersection(*(set(c.resources) for c in self.candidates[i]))

    def host_common(self, tasks: Iterable[int]) -> dict[int, set[int]]:
        """Per sender host, the resources every candidate of ``tasks`` on that host holds
        (its NIC's sending side, when the tasks leave the host)."""
        return _meet({c.host: set(c.resources)} for i in tasks for c in self.candidates[i])

    def lower_bound(self) -> int:
        """A makespan no schedule beats: the longest task; each resource every candidate of a
        task needs, loaded with those tasks; and the sender load balance (Eq. 4) over every
        set of hosts the tasks can be sent from."""
        bound = max((self.min_duration(i) for i in range(len(self))), default=0)
        must: dict[int, int] = defaultdict(int)
        groups: dict[frozenset[int], list[int]] = defaultdict(list)
        for i, cands in enumerate(self.candidates):
            for r in self.mandatory(i):
                must[r] += self.min_duration(i)
            groups[frozenset(c.host for c in cands)].append(i)
        bound = max(bound, max(must.values(), default=0))
        # Tasks whose senders all lie in hosts S share |S| "send" resources when, on each host
        # of S, every candidate there holds a common resource.
        anchors = {hosts: self.host_common(tasks) for hosts, tasks in groups.items()}
        work = {hosts: sum(self.min_duration(i) for i in tasks) for hosts, tasks in groups.items()}
        for hosts in groups:
            inside = [g for g in groups if g <= hosts]
            common = _meet(anchors[g] for g in inside)
            if all(common.get(h) for h in hosts):
                bound = max(bound, -(-sum(work[g] for g in inside) // len(hosts)))
        return bound


def _meet(maps: Iterable[dict[int, set[int]]]) -> dict[int, set[int]]:
    """Key by key intersection of several ``{host: resources}`` maps."""
    out: dict[int, set[int]] = {}
    for m in maps:
        for k, rs in m.items():
            out[k] = out[k] & rs if k in out else set(rs)
    return out
