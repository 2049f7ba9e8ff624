"""A discrete-event engine over exclusive resources.

A task has a duration (from the cost model), the tasks it depends on, and the resources it
holds while it runs (a NIC's send side, a NIC's receive side, a link, a device's compute
stream).  The engine is a greedy list scheduler: a task starts at the first moment when
its dependencies have finished, its release time has come and all its resources are free;
among tasks that could start at the same moment, the one with the smaller
``(priority, id)`` goes first.  Nothing else is shared, so a task alone takes exactly its
duration, and tasks only wait for one another when they hold a common resource.

Each waiting task is parked in the queue of one resource that blocks it; when that
resource is released the queue is tried in priority order, so the cost per event stays
small even with 100 000 tasks on one resource (``benchmarks/simulator.py``).
"""

from __future__ import annotations

import heapq
from collections import Counter
from itertools import chain, compress
from typing import Any, Hashable, Iterable

from ..errors import PlannerError
from .task import Task
from .timeline import Timeline

__all__ = ["Task", "Simulation"]


class Simulation:
    """Collects tasks, then :meth:`run` plays them out and returns a :class:`Timeline`.

    >>> sim = Simulation()
    >>> a = sim.add("send", 2.0, resources=["nic0.tx"])
    >>> b = sim.add("send again", 1.0, resources=["nic0.tx"])
    >>> c = sim.add("compute", 5.0, deps=[a])
    >>> tl = sim.run()
    >>> [(r.start, r.end) for r in tl.records]
    [(0.0, 2.0), (2.0, 3.0), (2.0, 7.0)]
    """

    def __init__(self) -> None:
        self.tasks: list[Task] = []
        # a tuple of resources seen before (by identity: the caller's own object, kept alive
        # here) -> its resources once each; a pipeline's gradient buckets pass one stage's
        # tuple of ports again and again
        self._held: dict[int, tuple[tuple, tuple]] = {}

    def __len__(self) -> int:
        return len(self.tasks)

    def add(
        self,
        name: str,
        duration: float,
        resources: Iterable[Hashable] = (),
        deps: Iterable[int] = (),
        *,
        release: float = 0.0,
        priority: float | None = None,
        devices: Iterable[int] = (),
        stream: str = "comm",
        category: str = "",
        args: dict[str, Any] | None = None,
    ) -> int:
        """Add a task and return its id.

        ``deps`` are ids of tasks added before (so the task graph has no cycle by
        construction); ``resources`` are any hashable names, held exclusively while the
        task runs; ``release`` is the earliest start; ``priority`` breaks ties between
        tasks ready at the same moment (default: the order of addition); ``devices`` and
        ``stream`` place the task on the trace's tracks.
        """
        tid = len(self.tasks)
        if not duration >= 0:
            raise ValueError(f"task {name!r}: duration must be >= 0, got {duration!r}")
        if not release >= 0:
            raise ValueError(f"task {name!r}: release must be >= 0, got {release!r}")
        dep_ids = tuple(dict.fromkeys(map(int, deps)))
        if dep_ids and (min(dep_ids) < 0 or max(dep_ids) >= tid):
            bad = next(d for d in dep_ids if not 0 <= d < tid)
            raise ValueError(f"task {name!r}: dependency {bad} is not an earlier task id (0..{tid - 1})")
        if type(resources) is tuple:
            seen = self._held.get(id(resources))
            if seen is None or seen[0] is not resources:
                seen = self._held[id(resources)] = (resources, tuple(dict.fromkeys(resources)))
            held = seen[1]
        else:
            held = tuple(dict.fromkeys(resources))
        self.tasks.append(Task(
            name, float(duration), held, dep_ids, float(release),
            float(tid if priority is None else priority), tuple(devices), stream, category, dict(args) if args else {},
        ))
        return tid

    def run(self) -> Timeline:
        """Play every task out; raise :class:`PlannerError` if some can never start."""
        tasks = self.tasks
        n = len(tasks)
        start = [0.0] * n
        end = [0.0] * n
        missing = [len(t.deps) for t in tasks]
        succ: list[list[int]] = [[] for _ in range(n)]
        for i, t in enumerate(tasks):
            for d in t.deps:
                succ[d].append(i)
        needs, count = _resource_classes(tasks)
        busy = [-1.0] * count  # end of the task holding the resource, -1 when free
        parked: list[list[tuple[float, int]]] = [[] for _ in range(count)]
        prio_of = [t.priority for t in tasks]
        duration = [t.duration for t in tasks]
        events: list[tuple[float, int, int]] = []  # (time, kind 0=finish 1=release, task)
        # Candidates to try now: (priority, id, queue it was pulled from or FRESH).  A free
        # resource with parked tasks always has exactly one of them here, so when that one
        # does not take the resource, the turn passes to the next in its queue.
        ready: list[tuple[float, int, int]] = []
        FRESH = -1

        def make_ready(i: int, now: float) -> None:
            if tasks[i].release > now:
                heapq.heappush(events, (tasks[i].release, 1, i))
            else:
                heapq.heappush(ready, (prio_of[i], i, FRESH))

        def blocker_of(i: int) -> int:
            """The busy resource of task i that frees last (-1 if all are free)."""
            blocker, until = -1, -1.0
            for r in needs[i]:
                b = busy[r]
                if b > until:
                    blocker, until = r, b
            return blocker

        heappush, heappop = heapq.heappush, heapq.heappop

        def pass_turn(res: int) -> None:
            # Within one instant resources only get taken, so a waiter that cannot start
            # now will not start later in this instant: re-park it and look further.
            queue = parked[res]
            while queue and busy[res] < 0:
                entry = heappop(queue)
                blocker = blocker_of(entry[1])
                if blocker >= 0:
                    heappush(parked[blocker], entry)
                else:
                    heappush(ready, (entry[0], entry[1], res))
                    return

        for i in range(n):
            if missing[i] == 0:
                make_ready(i, 0.0)
        now = 0.0
        done = 0
        freed: list[int] = []
        while True:
            for res in freed:
                pass_turn(res)
            freed.clear()
            while ready:
                prio, i, origin = heapq.heappop(ready)
                # Park on the busy resource that frees last: retrying earlier is futile.
                blocker = blocker_of(i)
                if blocker >= 0:
                    heappush(parked[blocker], (prio, i))
                    if origin != FRESH:
                        pass_turn(origin)
                    continue
                start[i] = now
                if duration[i] == 0:
                    # Holds nothing for any time: done at once, its successors may start now.
                    end[i] = now
                    done += 1
                    if origin != FRESH:
                        pass_turn(origin)
                    for j in succ[i]:
                        missing[j] -= 1
                        if missing[j] == 0:
                            make_ready(j, now)
                    continue
                finish = now + duration[i]
                for r in needs[i]:
                    busy[r] = finish
                heapq.heappush(events, (finish, 0, i))
            if not events:
                break
            now = events[0][0]
            while events and events[0][0] == now:
                _, kind, i = heapq.heappop(events)
                if kind == 1:
                    heapq.heappush(ready, (prio_of[i], i, FRESH))
                    continue
                end[i] = now
                done += 1
                for r in needs[i]:
                    busy[r] = -1.0
                    freed.append(r)
                for j in succ[i]:
                    missing[j] -= 1
                    if missing[j] == 0:
                        make_ready(j, now)
        if done != n:
            stuck = [tasks[i].name for i in range(n) if missing[i] > 0][:5]
            raise PlannerError(f"{n - done} tasks never ran (first: {', '.join(stuck)})")
        return Timeline(tasks, start, end)


# ports over a simulation's distinct resource tuples past which their classes are found with
# numpy (a pipeline of 65 stages on 100 000 GPUs: 259 tuples, millions of ports)
LARGE = 50_000


def _resource_classes(tasks: list[Task], large: int = LARGE) -> tuple[list[tuple[int, ...]], int]:
    """Each task's resources as small integers, one per class of resources that exactly the
    same tasks hold (they are always busy and free together, so one stands for all: a
    transfer between two 8-host meshes holds 16 NIC ports but only 2 classes), and the
    number of classes.  Integers, because list lookups are cheaper than dict lookups.

    Worked out per distinct resource tuple (a pipeline has thousands of tasks but a few
    dozen tuples): two resources are in one class when the same tuples hold them.  Classes
    are numbered by where their first resource first appears (tuples in task order), and
    each task lists its classes by where each first appears in its tuple: the simulation
    breaks ties by these positions, so the numbering is part of its result."""
    sig_of: dict[tuple, int] = {}
    sig_ids = [sig_of.setdefault(t.resources, len(sig_of)) for t in tasks]
    per_sig, count = resource_classes(list(sig_of), large)
    return [per_sig[k] for k in sig_ids], count


def resource_classes(sigs: list[tuple], large: int = LARGE) -> tuple[list[tuple[int, ...]], int]:
    """For tuples of resources (each resource once in a tuple): each tuple's classes, the
    resources that exactly the same tuples hold, numbered by where their first resource first
    appears and listed by where each first appears in the tuple; and how many there are.  The
    stage search's port bound and fast simulator (:mod:`solver_planner.stages.ports`) use it too."""
    return _refined(sigs) if sum(map(len, sigs)) > large else _counted(sigs)


def _counted(sigs: list[tuple]) -> tuple[list[tuple[int, ...]], int]:
    """The classes of a small simulation.  A resource only one tuple holds is in that tuple's
    own class, so only the resources several tuples share are looked at one by one; the rest
    is counted in C (:class:`collections.Counter`, ``map``, ``compress``)."""
    counts = Counter(chain.from_iterable(sigs))
    shared_of = (1).__lt__
    # per tuple: the position of its first resource no other tuple holds (None: none), and
    # the positions and resources of those other tuples hold too
    layout = []
    users: dict[Hashable, list[int]] = {}
    for k, sig in enumerate(sigs):
        many = list(map(shared_of, map(counts.__getitem__, sig)))
        try:
            single = many.index(False)
        except ValueError:
            single = None
        shared = list(compress(sig, many))
        for r in shared:
            users.setdefault(r, []).append(k)
        layout.append((single, list(compress(range(len(sig)), many)), shared))
    klass: dict[tuple[int, ...], int] = {}
    of: dict[Hashable, int] = {}          # the class of each shared resource
    per_sig = []
    for k, (single, positions, shared) in enumerate(layout):
        order: list[int] = []
        placed = single is None
        for at, r in zip(positions, shared):
            if not placed and single < at:
                order.append(klass.setdefault((k,), len(klass)))
                placed = True
            c = of.get(r)
            if c is None:
                c = of[r] = klass.setdefault(tuple(users[r]), len(klass))
            order.append(c)
        if not placed:
            order.append(klass.setdefault((k,), len(klass)))
        per_sig.append(tuple(dict.fromkeys(order)))
    return per_sig, len(klass)


def _refined(sigs: list[tuple]) -> tuple[list[tuple[int, ...]], int]:
    """The classes of a large simulation by partition refinement: every resource starts in
    one class, and each tuple in turn splits each class it meets into its part inside the
    tuple and the rest (numpy, over the tuple's resources only).  Two resources end in one
    class exactly when every tuple holds both or neither."""
    import numpy as np

    first_seen = dict.fromkeys(chain.from_iterable(sigs))
    ids = dict(zip(first_seen, range(len(first_seen))))
    members = [np.fromiter(map(ids.__getitem__, sig), dtype=np.int64, count=len(sig)) for sig in sigs]
    label = np.zeros(len(ids), dtype=np.int64)
    fresh = 1
    for m in members:
        if len(m):
            uniq, inv = np.unique(label[m], return_inverse=True)
            label[m] = fresh + inv.reshape(-1)
            fresh += len(uniq)
    # numbered by the first resource of each (ids run in first-seen order)
    labels, first = np.unique(label, return_index=True)
    number = np.empty(len(labels), dtype=np.int64)
    number[np.argsort(first, kind="stable")] = np.arange(len(labels))
    klass = number[np.searchsorted(labels, label)]
    per_sig = []
    for m in members:
        c = klass[m]
        _, at = np.unique(c, return_index=True)
        per_sig.append(tuple(c[np.sort(at)].tolist()))
    return per_sig, len(labels)
