"""Fast schedules for large instances: balanced senders, then priority list scheduling.

* :func:`assign_senders`: each task with several candidate senders gets the one that
  keeps the most loaded of its resources lightest (the resharding paper Eq. 4 applied to every
  resource a candidate holds, not only the sender's NIC), largest tasks first.
* :func:`dispatch`: with the senders fixed, a non-delay list schedule (Giffler and
  Thompson's dispatching): whenever resources free up, start the waiting tasks whose
  resources are all free, the task whose busiest resource has the most work left first
  (a resource that must stay busy until the lower bound is never left idle while it has
  a task that can start).  Interchangeable tasks are one class, so each decision costs
  the number of classes, not of tasks.

The resharding paper §3.2 notes that resharding tasks come in a few identical kinds spread evenly over
the hosts; keeping every busiest resource busy is then enough to reach the lower bound
on most layouts, which the benchmark measures.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .schedule import Instance, Schedule

__all__ = ["assign_senders", "dispatch"]


def assign_senders(inst: Instance) -> list[int]:
    """A candidate per task: single-candidate tasks first, then the others largest first,
    each to the candidate whose busiest resource (after adding it) is least loaded; ties by
    the total load of its resources, then the lowest host."""
    load = [0] * len(inst.resources)
    choice = [0] * len(inst)
    order = sorted(range(len(inst)), key=lambda i: (len(inst.candidates[i]) > 1, -inst.min_duration(i), i))
    for i in order:
        cands = inst.candidates[i]
        if len(cands) > 1:
            choice[i] = min(range(len(cands)), key=lambda k: (
                max((load[r] for r in cands[k].resources), default=0) + cands[k].duration,
                sum(load[r] for r in cands[k].resources), cands[k].host, k))
        c = cands[choice[i]]
        for r in c.resources:
            load[r] += c.duration
    return choice


def dispatch(inst: Instance, choice: Sequence[int], seed: int | None = None) -> Schedule:
    """Non-delay list schedule of ``inst`` with the senders ``choice``.

    At each time some resource frees up, the startable tasks (all their resources free)
    are ranked by (most work left on their busiest resource, most work left on all their
    resources, longest, then a seeded random rank if ``seed`` is given, else the class's
    first task index) and started greedily while they do not collide.
    """
    n, nres = len(inst), len(inst.resources)
    groups: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for i in range(n):
        c = inst.candidates[i][choice[i]]
        groups.setdefault((c.duration, c.resources), []).append(i)
    keys = list(groups)
    pending = [list(reversed(groups[k])) for k in keys]  # pop() gives the lowest index
    masks = [sum(1 << r for r in res) for _, res in keys]
    everything = (1 << nres) - 1
    tie = np.arange(len(keys))
    if seed is not None:
        np.random.default_rng(seed).shuffle(tie)
    # Resources of each class, padded with a sentinel resource ``nres`` that never counts.
    width = max((len(res) for _, res in keys), default=1) or 1
    held = np.full((len(keys), width), nres, dtype=np.int64)
    for g, (_, res) in enumerate(keys):
        held[g, :len(res)] = res
    duration = np.array([d for d, _ in keys], dtype=np.int64)
    rem = np.zeros(nres + 1, dtype=np.int64)  # work left per resource; the sentinel stays 0
    for (d, res), members in groups.items():
        for r in res:
            rem[r] += d * len(members)
    floor = np.zeros(nres + 1, dtype=np.int64)
    floor[nres] = -(1 << 62)  # the sentinel never is a class's busiest resource
    count = np.array([len(p) for p in pending], dtype=np.int64)
    free = [0] * nres
    order: list[int] = []
    t = 0
    while count.any():
        busy_now = np.zeros(nres + 1, dtype=bool)
        busy = 0
        for r in range(nres):
            if free[r] > t:
                busy_now[r] = True
                busy |= 1 << r
        ready = np.flatnonzero((count > 0) & ~busy_now[held].any(axis=1))
        busiest = (rem + floor)[held[ready]].max(axis=1)
        total = rem[held[ready]].sum(axis=1)
        ranked = ready[np.lexsort((tie[ready], -duration[ready], -total, -busiest))]
        for g in ranked.tolist():
            if masks[g] & busy:
                continue
            d, res = keys[g]
            order.append(pending[g].pop())
            count[g] -= 1
            for r in res:
                free[r] = t + d
            rem[list(res)] -= d
            busy |= masks[g]
            if not masks[g]:  # holds nothing: start every such task now
                while pending[g]:
                    order.append(pending[g].pop())
                count[g] = 0
            if busy == everything:
                break
        later = [f for f in free if f > t]
        if count.any() and not later:  # cannot happen: something ready always starts
            raise AssertionError("dispatch stalled")
        t = min(later, default=t)
    return inst.list_schedule(order, choice)
