"""The critical path of a simulated run: the chain of tasks that decides when it ends.

The engine (:mod:`.engine`) starts a task at the first moment its dependencies have
finished, its release time has come and its resources are free, so every task that does
not start at its release time starts exactly when some dependency, or some earlier holder
of one of its resources, ends.  Walking back from the last task to that predecessor, again
and again, gives a chain of tasks with no gap between them (a gap only where a release
time, not a task, held a task back).  The chain's durations and gaps add up to the
makespan, and every moment of the run is counted once: what a breakdown of "where the
time goes" needs when work overlaps.
"""

from __future__ import annotations

from .timeline import Timeline

__all__ = ["critical_path"]


def critical_path(timeline: Timeline) -> list[tuple[int | None, float, float]]:
    """``[(task id or None, start, end), ...]`` from time 0 to the makespan, in time order;
    ``None`` marks a gap no task explains (a release time).  The pieces tile
    ``[0, makespan]``: each starts where the one before ends.

    Among several predecessors ending at the same moment a dependency is preferred (it is
    what the task waited for), then the resource holder with the smallest id.

    >>> from solver_planner.simulate import Simulation
    >>> sim = Simulation()
    >>> a = sim.add("send", 2.0, resources=["nic"])
    >>> b = sim.add("send again", 1.0, resources=["nic"])
    >>> c = sim.add("compute", 5.0, deps=[a])
    >>> d = sim.add("late", 1.0, release=9.0)
    >>> critical_path(sim.run())
    [(0, 0.0, 2.0), (2, 2.0, 7.0), (None, 7.0, 9.0), (3, 9.0, 10.0)]
    >>> critical_path(Simulation().run())
    []
    """
    tasks = timeline._tasks
    start, end = timeline._start, timeline._end
    if not tasks:
        return []
    # the tasks that let go of resources at each moment (zero-length tasks hold nothing); a
    # resource is held by one task at a time, so at most one of them held a given resource
    ended: dict[float, list[int]] = {}
    for j, t in enumerate(tasks):
        if end[j] > start[j] and t.resources:
            ended.setdefault(end[j], []).append(j)
    i = max(range(len(tasks)), key=lambda j: (end[j], -j))
    out: list[tuple[int | None, float, float]] = [(i, start[i], end[i])]
    while start[i] > 0:
        s = start[i]
        pred = next((d for d in tasks[i].deps if end[d] == s), None)
        if pred is None and tasks[i].resources:
            held = set(tasks[i].resources)
            pred = next((j for j in ended.get(s, ()) if j != i and not held.isdisjoint(tasks[j].resources)), None)
        if pred is None:
            # held back by its release time: the gap back to the latest task that ended
            # before it (or to time 0) is not work of any task
            before = max((end[j] for j in range(len(tasks)) if start[j] < end[j] < s), default=0.0)
            out.append((None, before, s))
            prior = [j for j in range(len(tasks)) if start[j] < end[j] == before]
            if not prior:
                break
            i = min(prior)
        else:
            i = pred
        out.append((i, start[i], end[i]))
    if out[-1][1] > 0:       # the first task waited for its release time
        out.append((None, 0.0, out[-1][1]))
    return out[::-1]
